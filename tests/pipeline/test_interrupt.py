"""Interruption and concurrency: a real ``python -m torch2ms convert`` killed (SIGKILL) inside a
stage resumes from the last complete stage and ends with the same artifacts as a run that was
never interrupted; Ctrl-C exits 130 saying where it stopped and how to resume; two runs never
share an output folder; an artifact edited or deleted between runs is redone.

A stage is caught in the act by polling for its ``.<stage>.partial`` folder, then freezing the
process (SIGSTOP) and checking that the folder is still there and the stage not committed
before the SIGKILL: so "killed during fold" is a fact, not a hope (fold takes ~0.1 s; a missed
window is retried). No test hook in the product.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TESTS, write_recipe

from torch2ms.errors import EXIT_INTERRUPTED, EXIT_USAGE, LockedError
from torch2ms.pipeline.runner import Runner
from torch2ms.pipeline.workspace import RunDir, signals_held
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, stage_names

# real conversions killed and resumed, ~1 min; started first under pytest-xdist (conftest.py)
pytestmark = pytest.mark.heavy

# Artifacts whose bytes legitimately differ between two identical runs (see test_determinism):
# compile.json holds latencies, and MindSpore writes a timestamp into every MindIR.
NOT_BYTE_STABLE = {("compile", "compile.json"), ("mindir", "network.mindir")}


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), COLUMNS="400", GLOG_v="3")


def convert_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "torch2ms", "convert", "--recipe", "tiny.yaml", "--out", str(out)]


def foreground() -> None:
    """Run in the child before it starts: Ctrl-C's default action, as in a program started from a
    terminal. A suite started in the background by a non-interactive shell (``make test &``)
    ignores SIGINT and SIGQUIT, the child inherited that, and Python then keeps SIGINT ignored:
    the Ctrl-C tests saw the run end normally."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def start(cwd: Path, out: Path) -> subprocess.Popen:
    """The run in a process group of its own, as a terminal starts it: the export stage runs in a
    child process (``pipeline.own_process``), and a Ctrl-C, a stop or a kill reaches both."""
    return subprocess.Popen(
        convert_cmd(out),
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=foreground,  # noqa: PLW1509 - two signal calls, no locks
        process_group=0,
    )


def convert(cwd: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(convert_cmd(out), cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def records(root: Path) -> dict[str, dict]:
    return {
        s: json.loads((root / s / "stage.json").read_text())
        for s in stage_names()
        if (root / s / "stage.json").exists()
    }


def stable_view(rec: dict) -> dict:
    """What must not depend on the run: artifact hashes (except NOT_BYTE_STABLE), fingerprint, metrics."""
    arts = {k: v for k, v in rec["artifacts"].items() if (rec["stage"], k) not in NOT_BYTE_STABLE}
    counts = {k: v for k, v in rec["counts"].items() if k != "mindir_bytes"}  # the MindIR's size varies too
    return {
        "status": rec["status"],
        "fingerprint": rec["fingerprint"],
        "artifacts": arts,
        "metrics": rec["metrics"],
        "counts": counts,
    }


def _stat(pid: int | str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()  # state, ppid, pgrp, ...


def wait_stopped(pgid: int, timeout: float = 5.0) -> None:
    """Until every process of the group ``pgid`` (the run and its stage's own process) is stopped."""
    end = time.time() + timeout
    while time.time() < end:
        states = []
        for d in os.listdir("/proc"):
            try:
                fields = _stat(d) if d.isdigit() else None
            except OSError:  # it ended meanwhile
                continue
            if fields and int(fields[2]) == pgid:
                states.append(fields[0])
        if states and all(st in "TZ" for st in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process group {pgid} did not stop")


def catch_inside(p: subprocess.Popen, root: Path, stage: str, timeout: float = 300) -> bool:
    """Freeze ``p`` while ``stage`` is running (partial folder there, stage not committed).

    Returns False if the window was missed (the process is then killed); the caller retries.
    """
    partial = root / f".{stage}.partial"
    end = time.time() + timeout
    while time.time() < end:
        if partial.is_dir():
            os.killpg(p.pid, signal.SIGSTOP)
            wait_stopped(p.pid)
            if partial.is_dir() and not (root / stage).exists():
                return True
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return False
        if p.poll() is not None:
            return False
        time.sleep(0.002)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    raise AssertionError(f"stage {stage} never started within {timeout} s")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("interrupt")
    write_recipe(d / "tiny.yaml")
    return d


@pytest.fixture(scope="module")
def uninterrupted(workdir):
    """A run never interrupted, and meanwhile a second run on the same folder (must be refused)."""
    out = workdir / "reference"
    first = start(workdir, out)
    root = out / "tiny"
    assert catch_inside(first, root, "export"), "the first run ended before its export stage"
    os.killpg(first.pid, signal.SIGCONT)  # it was frozen by catch_inside; let it go on
    second = convert(workdir, out)
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    return {"root": root, "records": records(root), "pid": first.pid, "second": second}


def test_second_run_on_the_same_folder_is_refused_while_the_first_goes_on(uninterrupted):
    second = uninterrupted["second"]
    assert second.returncode == EXIT_USAGE, second.stderr
    msg = flat(second.stderr)
    assert f"{uninterrupted['root']} is in use by another torch2ms process (pid {uninterrupted['pid']})" in msg
    assert "wait for it to finish, or use another --out" in msg
    recs = uninterrupted["records"]
    assert [recs[s]["status"] for s in stage_names()] == ["passed"] * len(stage_names()), (
        "the refused run disturbed the first one"
    )
    assert not (uninterrupted["root"] / ".lock").exists()


def kill_and_resume(workdir: Path, uninterrupted: dict, stage: str, attempts: int = 4) -> None:
    for attempt in range(attempts):
        out = workdir / f"killed_{stage}_{attempt}"
        root = out / "tiny"
        p = start(workdir, out)
        if catch_inside(p, root, stage):
            break
    else:
        pytest.fail(f"could not catch stage {stage} in {attempts} attempts")
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    assert p.returncode == -signal.SIGKILL

    # what a SIGKILL leaves: earlier stages complete, this one only as a partial folder
    done = stage_names()[: stage_names().index(stage)]
    recs = records(root)
    assert sorted(recs) == sorted(done) and all(r["status"] == "passed" for r in recs.values())
    assert not (root / stage).exists() and (root / f".{stage}.partial").is_dir()
    assert int((root / ".lock").read_text()) == p.pid

    resumed = convert(workdir, out)
    assert resumed.returncode == 0, resumed.stderr
    log = flat(resumed.stderr)
    assert f"took over the lock left by pid {p.pid}, which is no longer running" in log
    assert f"removed leftovers of an interrupted run: .{stage}.partial" in log
    for s in stage_names():
        assert re.search(rf"\b{s} +{'up to date' if s in done else 'passed'}\b", log), (s, log)
    after = records(root)
    for s in stage_names():
        assert stable_view(after[s]) == stable_view(uninterrupted["records"][s]), s
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("stage", ["fold"])
def test_sigkill_inside_a_stage_then_resume(workdir, uninterrupted, stage):
    kill_and_resume(workdir, uninterrupted, stage)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["export", "rebuild", "compile", "mindir"])
def test_sigkill_inside_a_stage_then_resume_slow(workdir, uninterrupted, stage):
    kill_and_resume(workdir, uninterrupted, stage)


@pytest.mark.parametrize("stage", [pytest.param("export", marks=pytest.mark.slow), "compile"])
def test_ctrl_c_exits_130_says_where_and_how_to_resume(workdir, stage):
    """compile runs inside MindSpore, whose own SIGINT handler used to kill torch2ms silently."""
    out = workdir / f"sigint_{stage}"
    root = out / "tiny"
    p = start(workdir, out)
    assert catch_inside(p, root, stage)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process of the run
    os.killpg(p.pid, signal.SIGCONT)
    _, stderr = p.communicate(timeout=300)
    assert p.returncode == EXIT_INTERRUPTED, stderr
    msg = flat(stderr)
    again = f"torch2ms convert --recipe tiny.yaml --out {out}"
    assert f"interrupted during stage '{stage}'; completed stages are kept. Resume with: {again}" in msg
    assert "Traceback" not in stderr
    assert not (root / ".lock").exists() and not (root / f".{stage}.partial").exists() and not (root / stage).exists()
    resumed = subprocess.run(
        [sys.executable, "-m", *again.split()], cwd=workdir, env=env(), capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr
    statuses = {s: json.loads((root / s / "stage.json").read_text())["status"] for s in stage_names()}
    assert statuses == dict.fromkeys(stage_names(), "passed")
    assert re.search(rf"\b{stage} +passed\b", flat(resumed.stderr))
    for s in stage_names()[: stage_names().index(stage)]:
        assert re.search(rf"\b{s} +up to date\b", flat(resumed.stderr)), s


# --- the lock ---------------------------------------------------------------------------------


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_lock_from_a_dead_process_is_taken_over(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml")
    root = tmp_path / "runs" / "tiny"
    root.mkdir(parents=True)
    pid = dead_pid()
    (root / ".lock").write_text(str(pid))
    logs: list[str] = []
    result = pipeline_runner(load_recipe(path), log=logs.append).run(until="export")
    assert result.stages[0].status == "passed"
    assert f"took over the lock left by pid {pid}, which is no longer running" in logs
    assert not (root / ".lock").exists()


HOLD = """
import sys, time
from pathlib import Path
from torch2ms.pipeline.workspace import RunDir, signals_held
from torch2ms.errors import LockedError
start = float(sys.argv[2])
while time.time() < start:
    pass
try:
    RunDir(Path(sys.argv[1])).lock()
except LockedError:
    print("refused", flush=True)
else:
    print("locked", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_live_lock_refuses_with_the_owners_pid(tmp_path):
    root = tmp_path / "runs" / "tiny"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), "0", "60"], env=env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError) as info:
            RunDir(root).lock()
        assert info.value.exit_code == EXIT_USAGE
        assert f"{root} is in use by another torch2ms process (pid {holder.pid})" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    assert RunDir(root).lock() == holder.pid  # its process is gone: free again


def test_only_one_of_many_simultaneous_runs_gets_a_stale_lock(tmp_path):
    """Judging staleness by pid alone let several of these through (4 of 6 in one trial)."""
    for trial in range(2):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        (root / ".lock").write_text(str(dead_pid()))
        go = time.time() + 2.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", HOLD, str(root), str(go), "1.5"], env=env(), stdout=subprocess.PIPE, text=True
            )
            for _ in range(6)
        ]
        answers = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
        assert answers == ["locked"] + ["refused"] * 5, (trial, answers)


# --- artifacts changed between runs -----------------------------------------------------------


def test_changed_or_deleted_artifacts_rerun_exactly_the_affected_stages(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml")
    root = tmp_path / "runs" / "tiny"

    def run():
        logs: list[str] = []
        result = pipeline_runner(load_recipe(path), log=logs.append).run()
        assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
        return [s.stage for s in result.stages if s.status == "passed"], logs

    assert run()[0] == list(stage_names())
    baseline = {s: stable_view(r) for s, r in records(root).items()}

    def mutate_and_check(mutate, expect_rerun: list[str], expect_log: str | None):
        mutate()
        rerun, logs = run()
        assert rerun == expect_rerun, mutate.__doc__
        if expect_log:
            assert expect_log in logs, logs
        assert {s: stable_view(r) for s, r in records(root).items()} == baseline, mutate.__doc__

    def delete_rebuild_ckpt():
        """rebuild/network.ckpt deleted"""
        (root / "rebuild" / "network.ckpt").unlink()

    def edit_fold_code():
        """fold/network.py edited"""
        net = root / "fold" / "network.py"
        net.write_text(net.read_text().replace("return ", "return 0 * ", 1))

    def flip_a_byte_of_the_onnx():
        """export/model.onnx changed (one byte)"""
        onnx_path = root / "export" / "model.onnx"
        data = bytearray(onnx_path.read_bytes())
        data[-1] ^= 0xFF
        onnx_path.write_bytes(bytes(data))

    def delete_reference():
        """export/reference.npz deleted"""
        (root / "export" / "reference.npz").unlink()

    def corrupt_compile_record():
        """compile/stage.json not JSON any more"""
        (root / "compile" / "stage.json").write_text("{ truncated")

    def remove_mindir_folder():
        """mindir/ removed"""
        import shutil

        shutil.rmtree(root / "mindir")

    mutate_and_check(
        delete_rebuild_ckpt, ["rebuild"], "rebuild: network.ckpt changed since it was written; running it again"
    )
    mutate_and_check(edit_fold_code, ["fold"], "fold: network.py changed since it was written; running it again")
    assert "0 * " not in (root / "fold" / "network.py").read_text()
    mutate_and_check(
        flip_a_byte_of_the_onnx, ["export"], "export: model.onnx changed since it was written; running it again"
    )
    mutate_and_check(
        delete_reference, ["export"], "export: reference.npz changed since it was written; running it again"
    )
    mutate_and_check(corrupt_compile_record, ["compile"], None)
    mutate_and_check(remove_mindir_folder, ["mindir"], None)


def test_new_sample_data_in_the_same_file_reruns_export(tmp_path):
    """The fingerprint covered inputs[].data's path only: new data in the same file was 'up to date'."""
    import numpy as np

    from torch2ms.pipeline.workspace import load_npz

    data = tmp_path / "sample.npy"
    np.save(data, np.full((1, 3, 32, 32), 0.5, np.float32))
    path = write_recipe(
        tmp_path / "tiny.yaml", inputs=[{"name": "input", "shape": [1, 3, 32, 32], "data": "sample.npy"}]
    )

    def export_status():
        return pipeline_runner(load_recipe(path), log=lambda m: None).run(until="export").stages[0].status

    assert export_status() == "passed"
    assert export_status() == "up to date"
    np.save(data, np.full((1, 3, 32, 32), -0.25, np.float32))
    assert export_status() == "passed"
    ref = load_npz(tmp_path / "runs" / "tiny" / "export" / "reference.npz")
    assert (ref["input.input"][0] == -0.25).all()


def test_edited_model_source_reruns_export(tmp_path):
    """Editing the factory's module was invisible to the fingerprint: the old conversion stayed 'up to date'."""
    src = tmp_path / "my_model.py"
    src.write_text("from torch import nn\n\ndef net():\n    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())\n")
    path = write_recipe(
        tmp_path / "tiny.yaml", model={"factory": "my_model:net"}, inputs=[{"name": "input", "shape": [1, 3, 8, 8]}]
    )

    def export():
        return pipeline_runner(load_recipe(path), log=lambda m: None).run(until="export").stages[0]

    assert export().status == "passed"
    assert export().status == "up to date"
    src.write_text(src.read_text().replace("nn.ReLU()", "nn.Sigmoid()"))
    sys.modules.pop("my_model", None)
    again = export()
    assert again.status == "passed" and again.record["counts"]["onnx_ops"].get("Sigmoid") == 1


def test_files_written_atomically_follow_the_umask(tmp_path):
    """mkstemp creates 0600: reports and generated code were unreadable to anyone else."""
    from torch2ms.pipeline.workspace import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.md", "x")
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.md", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "report.md").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.md").stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("where", ["fresh_partial", "_verdict"])
def test_ctrl_c_anywhere_before_the_commit_discards_the_partial_folder(tmp_path, monkeypatch, where):
    """Ctrl-C can land right after the partial folder is made (Python raises it as
    ``fresh_partial`` returns) or after a stage's ``run`` returned, while its outputs are checked
    or replayed: the partial folder goes then too. Under load the compile test above froze the
    run in those windows and found ``.compile.partial`` left behind."""
    recipe = load_recipe(write_recipe(tmp_path / "tiny.yaml"))
    owner = RunDir if where == "fresh_partial" else Runner
    original = getattr(owner, where)

    def interrupted(*args, **kwargs):
        original(*args, **kwargs)  # the folder is made (or the check done), then the signal lands
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, where, interrupted)
    runner = pipeline_runner(recipe, log=lambda m: None)
    with pytest.raises(KeyboardInterrupt):
        runner.run(until="export")
    root = runner.run_dir.root
    assert not (root / ".export.partial").exists() and not (root / "export").exists(), sorted(root.iterdir())


def test_a_signal_inside_signals_held_arrives_after_the_block():
    """Removing a partial folder and committing a stage hold Ctrl-C back, so a second one cannot
    cut them short; it is not lost, it arrives when they are done."""
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("block finished")
        steps.append("after the block")
    assert steps == ["block finished"]
