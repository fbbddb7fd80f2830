"""A stage in a process of its own (``pipeline.own_process``): the export stage under ``torch2ms
convert``. The same records as in one process, torch never imported by the run's own process, and
the stage's log, errors, a kill and a Ctrl-C handed back as in one process, with nothing
half-written left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_recipe
from own_process_stages import Killed, Raises, Reports

from torch2ms.errors import CheckFailed, RecipeError, StageFailed, UnsupportedOpsError
from torch2ms.pipeline.runner import Runner
from torch2ms.recipe import load_recipe
from torch2ms.stages import PipelineChecks, pipeline_runner

TESTS = Path(__file__).parents[1]
REPO = TESTS.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), GLOG_v="3")

# The run's own process: export in a child, rebuild here; then which heavy modules this process has.
PARENT = """
import json, sys
from torch2ms.stages import pipeline_runner
from torch2ms.recipe import load_recipe
result = pipeline_runner(load_recipe(sys.argv[1]), log=lambda m: None, own_processes=True).run(until="rebuild")
print(json.dumps({"statuses": [s.status for s in result.stages], "torch": "torch" in sys.modules,
                  "mindspore": "mindspore" in sys.modules}))
"""


def stable(root: Path, stage: str) -> dict:
    rec = json.loads((root / stage / "stage.json").read_text())
    return {k: rec[k] for k in ("status", "fingerprint", "artifacts", "metrics", "worst", "bounds", "counts")}


def test_export_in_its_own_process_writes_what_one_process_writes_and_torch_stays_out(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "one").mkdir()
    own = write_recipe(tmp_path / "own" / "tiny.yaml")
    done = subprocess.run(
        [sys.executable, "-c", PARENT, str(own)], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["statuses"] == ["passed", "passed", "not run", "not run", "not run"], seen
    # the rebuild ran in the run's own process (MindSpore), the export in another (torch)
    assert seen["mindspore"] and not seen["torch"], seen

    one = write_recipe(tmp_path / "one" / "tiny.yaml")
    result = pipeline_runner(load_recipe(one), log=lambda m: None).run(until="rebuild")
    assert [s.status for s in result.stages][:2] == ["passed", "passed"]
    for stage in ("export", "rebuild"):
        assert stable(tmp_path / "own" / "runs" / "tiny", stage) == stable(result.root, stage), stage


def runner(tmp_path, stage, logs=None) -> Runner:
    recipe = load_recipe(write_recipe(tmp_path / "tiny.yaml"))
    log = logs.append if logs is not None else (lambda m: None)
    return Runner(recipe, log=log, stages=[stage], checks=PipelineChecks(), own_processes=True)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != ".lock") if root.is_dir() else []


def test_the_stage_runs_in_another_process_and_its_log_and_record_come_back(tmp_path):
    logs: list[str] = []
    result = runner(tmp_path, Reports(), logs).run()
    (res,) = result.stages
    assert res.status == "passed" and isinstance(res.declared, Reports)
    child = res.record["counts"]["pid"]
    assert child != os.getpid()
    assert logs == [f"reports: hello from pid {child}"]
    assert (result.root / "reports" / "pid.txt").read_text() == str(child)
    assert json.loads((result.root / "reports" / "stage.json").read_text())["counts"]["pid"] == child
    # in one process (the runner's default) it runs here
    one = Runner(
        load_recipe(tmp_path / "tiny.yaml"),
        tmp_path / "one",
        log=lambda m: None,
        stages=[Reports()],
        checks=PipelineChecks(),
    )
    assert one.run().stages[0].record["counts"]["pid"] == os.getpid()


def test_its_error_comes_back_whole_and_its_partial_folder_goes(tmp_path):
    r = runner(tmp_path, Raises())
    with pytest.raises(RecipeError) as err:
        r.run()
    assert err.value.message == "inputs[0].shape: 3 dimensions, the model takes 4"
    assert err.value.hint == "give [1, 3, 32, 32]"
    assert "half_written" not in str(err.value) and "Traceback" in err.value.child_traceback
    assert leftovers(r.run_dir.root) == []


def test_a_killed_stage_process_fails_the_stage_by_name_and_leaves_nothing(tmp_path):
    r = runner(tmp_path, Killed())
    with pytest.raises(StageFailed) as err:
        r.run()
    assert "stage 'killed' failed after []: its process was killed by SIGKILL before it gave a result" in str(err.value)
    assert "out of memory" in err.value.hint and "--one-process" in err.value.hint
    assert leftovers(r.run_dir.root) == []


SLEEPER = """
import sys
from own_process_stages import Sleeps
from torch2ms.pipeline.runner import Runner
from torch2ms.recipe import load_recipe
from torch2ms.stages import PipelineChecks
try:
    log = lambda m: print(m, flush=True)
    Runner(load_recipe(sys.argv[1]), log=log, stages=[Sleeps()], checks=PipelineChecks(), own_processes=True).run()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("to", ["the run", "the run and its stage"])
def test_ctrl_c_stops_the_stage_process_and_its_partial_folder_goes(tmp_path, to):
    """A SIGINT to the run alone (``kill -INT``) reaches its stage's process; one to both (a
    terminal's Ctrl-C) ends the same way."""
    recipe = write_recipe(tmp_path / "tiny.yaml")
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(recipe)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    line = p.stdout.readline()
    assert line.startswith("sleeps: sleeping in pid "), (line, p.stderr.read() if p.poll() is not None else "")
    child = int(line.split()[-1])
    root = tmp_path / "runs" / "tiny"
    assert (root / ".sleeps.partial" / "half.txt").is_file()
    if to == "the run":
        os.kill(p.pid, signal.SIGINT)
    else:
        os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and out.strip() == "interrupted", err
    # the stage's process got the interrupt (it was not killed after a wait), and it is gone
    assert (root.parent / "sleeps-interrupted").read_text() == str(child)
    assert not Path(f"/proc/{child}").exists()
    assert leftovers(root) == []


def test_the_stage_process_dies_with_the_run(tmp_path):
    """SIGKILL to the run (no handler runs): its stage's process does not go on alone."""
    recipe = write_recipe(tmp_path / "tiny.yaml")
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(recipe)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child = int(p.stdout.readline().split()[-1])
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    end = time.time() + 10
    while Path(f"/proc/{child}").exists() and time.time() < end:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()


@pytest.mark.parametrize(
    "err",
    [
        CheckFailed("stage 'fold' is out of tolerance", hint="see diff.md"),
        UnsupportedOpsError("2 nodes have no converter", problems=["NonMaxSuppression", "Loop"]),
    ],
)
def test_errors_cross_the_process_boundary_whole(err):
    """A stage's own process pickles its error: type, message, hint and fields must all arrive.
    (Exception pickles its ``args`` and ``__dict__``; a subclass whose ``__init__`` took a second
    required argument would not unpickle.)"""
    import pickle

    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
    assert back.exit_code == err.exit_code
