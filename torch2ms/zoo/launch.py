"""Run one zoo model in a worker process and turn whatever happened into its summary row.

The worker is forked by the batch's fork server (``torch2ms.zoo.forkserver``: torch and MindSpore
already imported) or, without one, started fresh. Either way it leads a process group of its own,
so a hang past the timeout is ended by killing its
whole process group (SIGTERM, then SIGKILL after a grace period). Peak RSS is sampled from the
worker process while it runs and also reported by the worker itself (``VmHWM``, torch2ms.runtime.memory); the larger is
kept, so a worker the kernel's out-of-memory killer took still has a figure. Outcomes:

* ``passed`` / ``failed``: the worker finished; ``failed`` means a stage raised or left the
  tolerance, and the reason is the stage's own error;
* ``timeout``: killed after the per-model timeout, naming the stage that was running;
* ``oom``: killed by us when its RSS went over ``max_memory_mb``, or by the kernel's
  out-of-memory killer when the kernel log says so;
* ``crashed``: the worker exited or was killed without finishing (segfault, ``os._exit``,
  out-of-memory kill), naming the stage, the exit code or signal and the log's last line.

Every model that did not pass also gets a category and its blockers (``torch2ms.zoo.failures``):
the worker's own for a model that failed, the launcher's for one it killed or saw die. The row
records the run folder's disk use as the worker left it.

This function is what both executors run (a thread of the local pool, or a Ray task), so their
summaries are the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from torch2ms.passes.coverage import coverage_cell
from torch2ms.pipeline.report import task_summary
from torch2ms.pipeline.workspace import write_json
from torch2ms.runtime import threads
from torch2ms.runtime.lifetime import signal_name
from torch2ms.runtime.memory import rss_mb
from torch2ms.stages import stage_names
from torch2ms.zoo.disk import du_mb
from torch2ms.zoo.failures import Failure, from_exit
from torch2ms.zoo.files import JOB, LOG, RESULT, STATUS, read_json, write_status
from torch2ms.zoo.forkserver import START_TIMEOUT_S, Forked, ForkServer, ForkServerGone, server_key
from torch2ms.zoo.profile import CHOSEN_VARIANT
from torch2ms.zoo.row import ModelRow, bound_cell, compile_fields, layout_fields, profile_fields

POLL_S = 0.5
GRACE_S = 3.0

_live: dict[int, subprocess.Popen | Forked] = {}
_live_lock = threading.Lock()


def kill_all() -> None:
    """Kill every worker this process started (used when the batch is interrupted)."""
    with _live_lock:
        procs = list(_live.values())
    for p in procs:
        _kill_group(p, grace=0)


def _kill_group(p: subprocess.Popen | Forked, grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _sampled_rss_mb(pid: int) -> float:
    """RSS of the worker process itself (its children, if any, are separate programs); 0 once gone."""
    mb = rss_mb(pid)
    return 0.0 if mb != mb else mb


def _last_line(path: Path, limit: int = 200) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


@dataclass
class WorkerExit:
    """How a worker process ended, as the launcher saw it."""

    returncode: int | None
    timed_out: bool
    over_memory: bool
    wall_s: float
    peak_sampled_mb: float  # the largest RSS sampled while it ran


def run_one(job: dict, server: ForkServer | None = None) -> ModelRow:
    """Run the job in a worker process (forked by ``server`` when given and able, else a fresh one);
    return the model's summary row (also written to disk)."""
    run_dir = Path(job["out_root"]) / job["name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / JOB, job)
    write_status(
        run_dir,
        {"batch": job["batch"], "name": job["name"], "state": "starting", "stage": None, "started": time.time()},
    )
    previous = ModelRow.from_dict(read_json(run_dir / RESULT))
    t0 = time.monotonic()
    p = _start(job, run_dir, server)
    with _live_lock:
        _live[p.pid] = p
    try:
        timed_out, over_memory, peak_sampled = _watch(p, job, t0)
    finally:
        if p.poll() is None:
            _kill_group(p, grace=0)
        with _live_lock:
            _live.pop(p.pid, None)
    wall = time.monotonic() - t0
    status = read_json(run_dir / STATUS) or {}
    if status.get("batch") != job["batch"]:
        status = {}
    ended = WorkerExit(p.returncode, timed_out, over_memory, wall, peak_sampled)
    row = build_row(job, run_dir, status, ended, previous)
    write_json(run_dir / RESULT, row.to_dict())
    return row


def _start(job: dict, run_dir: Path, server: ForkServer | None):
    """The worker process: forked by the batch's server when it serves this job, else started fresh."""
    env = worker_env(job)
    if server is not None and server.key == server_key(job):
        try:
            return server.start(run_dir / JOB, run_dir / LOG, env, wait_s=min(START_TIMEOUT_S, job["timeout"]))
        except ForkServerGone as err:
            print(f"[zoo] {job['name']}: {err}; starting its worker as a fresh process", file=sys.stderr)
    cwd = job.get("cwd")  # the driver's folder, where factories may be importable from
    cwd = cwd if cwd and os.path.isdir(cwd) else None  # not on another Ray node
    with open(run_dir / LOG, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "torch2ms.zoo.worker", str(run_dir / JOB)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def worker_env(job: dict) -> dict[str, str]:
    """The worker's environment: the job's PYTHONPATH entries first, the launcher's pid, and the
    worker's thread budget (``runtime.threads``)."""
    env = dict(os.environ)
    if job.get("threads"):
        env[threads.ENV] = str(job["threads"])
    extra_path = [p for p in job.get("pythonpath", []) if p]
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(extra_path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TORCH2MS_ZOO_PARENT"] = str(os.getpid())
    return env


def _watch(p: subprocess.Popen | Forked, job: dict, t0: float) -> tuple[bool, bool, float]:
    """Wait for the worker, sampling its RSS every ``POLL_S``; kill it over the job's memory limit
    or past its timeout. Returns (timed out, over memory, peak sampled RSS in MB)."""
    limit = job.get("max_memory_mb")
    peak_sampled = 0.0
    while True:
        try:
            p.wait(timeout=POLL_S)
            return False, False, peak_sampled
        except subprocess.TimeoutExpired:
            pass
        rss = _sampled_rss_mb(p.pid)
        peak_sampled = max(peak_sampled, rss)
        if limit and rss > limit:
            _kill_group(p, grace=0)
            return False, True, peak_sampled
        if time.monotonic() - t0 > job["timeout"]:
            _kill_group(p, GRACE_S)
            return True, False, peak_sampled


def _stage_records(run_dir: Path, stages: dict) -> dict[str, dict]:
    out = {}
    for stage, st in stages.items():
        if st in ("passed", "up to date", "failed"):
            rec = read_json(run_dir / stage / "stage.json")
            if rec:
                out[stage] = rec
    return out


def _kernel_oom_killed(pid: int | None) -> bool:
    """Whether the kernel log names ``pid`` as killed for want of memory (when it can be read)."""
    if not pid:
        return False
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return f"Killed process {pid} " in log


def _recipe_bounds(job: dict) -> tuple[float, float, float]:
    """The recipe's own (rel_error, cosine, task gate) for ``bound_cell``: what needed no widening."""
    from torch2ms.recipe import CheckSpec

    check = CheckSpec.model_validate((job.get("recipe") or {}).get("check") or {})
    gate = check.task_agreement if check.task_agreement is not None else 1.0
    return check.rel_error, check.cosine, gate


def build_row(job: dict, run_dir: Path, status: dict, ended: WorkerExit, previous: ModelRow | None) -> ModelRow:
    """The model's row from its job, the worker's last status, how it ended, and its stage records."""
    stages = dict.fromkeys(stage_names(), "not run")
    stages.update(status.get("stages") or {})
    peak = max(ended.peak_sampled_mb, status.get("peak_rss_mb") or 0.0)
    model_status, reason, failure = _outcome(job, run_dir, status, ended, stages, peak)
    records = _stage_records(run_dir, stages)
    cached = model_status == "passed" and all(s in ("up to date", "disabled") for s in stages.values())
    figures = _record_figures(records, job)
    png = run_dir / "profile" / "modules.png"
    peak_rss = round(peak, 1) if peak else None
    if cached and previous and previous.peak_rss_mb and previous.passed:
        peak_rss = previous.peak_rss_mb  # the figure of the run that did the work
    return ModelRow(
        name=job["name"],
        status=model_status,
        stages=stages,
        reason=reason,
        category=failure.category if failure else None,
        blockers=failure.blockers if failure else [],
        **figures,
        **profile_fields(read_json(run_dir / "profile" / "profile.json"), CHOSEN_VARIANT.get(figures["winner"])),
        profile_png=str(png) if png.is_file() else None,
        peak_rss_mb=peak_rss,
        disk_mb=round(du_mb(run_dir), 1),
        wall_s=round(ended.wall_s, 2),
        timeout_s=job["timeout"],
        max_memory_mb=job.get("max_memory_mb"),
        cached=cached,
        exit_code=ended.returncode,
        run_dir=str(run_dir),
        log=str(run_dir / LOG),
    )


def _outcome(job: dict, run_dir: Path, status: dict, ended: WorkerExit, stages: dict, peak: float):
    """(model status, reason, Failure or None) from how the worker ended; the stage it was running
    in ``stages`` takes the status that ended it (timeout, oom, crashed)."""
    returncode = ended.returncode
    current = status.get("stage")
    running = current if current and stages.get(current) == "running" else None
    where = (
        f" during stage {current!r}"
        if running
        else (" before the first stage" if not current else f" after stage {current!r}")
    )
    if status.get("state") == "finished" and returncode == 0 and not (ended.timed_out or ended.over_memory):
        model_status = status.get("status") or "failed"
        failure = None
        if model_status != "passed":
            failure = Failure(**status["failure"]) if status.get("failure") else Failure("crash")
        return model_status, status.get("reason", ""), failure
    if ended.timed_out:
        model_status = "timeout"
        reason = (
            f"killed after the per-model timeout of {job['timeout']:g} s{where} (raise it with --timeout or the "
            "model's `timeout:`)"
        )
    elif ended.over_memory:
        model_status = "oom"
        reason = (
            f"killed at {peak:.0f} MB RSS, over the limit of {job['max_memory_mb']:g} MB{where} (raise it with "
            "--max-memory or max_memory_mb)"
        )
    elif returncode == -signal.SIGKILL and _kernel_oom_killed(status.get("pid")):
        model_status = "oom"
        reason = (
            f"killed by the kernel's out-of-memory killer at {peak:.0f} MB RSS{where} (kernel log); run fewer "
            "--jobs or set --max-memory"
        )
    else:
        return _crashed(run_dir, returncode, stages, running, where, peak)
    if running:
        stages[running] = model_status
    return model_status, reason, from_exit(model_status, running)


def _crashed(run_dir: Path, returncode, stages: dict, running, where: str, peak: float):
    """The outcome of a worker that died or exited with an error of its own."""
    if running:
        stages[running] = "crashed"
    if returncode is not None and returncode < 0:
        how = f"killed by {signal_name(returncode)}"
        if returncode == -signal.SIGKILL:
            how += f" (not by torch2ms: usually the kernel's out-of-memory killer; peak RSS {peak:.0f} MB)"
    else:
        how = f"exited with code {returncode}"
    failure = from_exit("crashed", running, how.split(" (")[0])
    tail = _last_line(run_dir / LOG)
    reason = f"worker {how}{where}" + (f"; last log line: {tail}" if tail else "") + f" (log: {run_dir / LOG})"
    return "crashed", reason, failure


def _record_figures(records: dict[str, dict], job: dict) -> dict:
    """The row's figures read from the stage records: errors, the task, the bound, counts, timings."""
    worsts = [r["worst"] for r in records.values() if r.get("worst")]
    rels = [w["rel_error"] for w in worsts if w.get("rel_error") is not None]
    coss = [w["cosine"] for w in worsts if w.get("cosine") is not None]
    worst_task = min((r["task"] for r in records.values() if r.get("task")), key=lambda t: t["agreement"], default=None)

    def get(part: str, key: str):
        """The first stage record that reports ``key`` under ``part`` (counts or extra)."""
        return next((r[part][key] for r in records.values() if key in r.get(part, {})), None)

    return dict(
        worst_rel_error=max(rels) if rels else None,
        min_cosine=min(coss) if coss else None,
        task_agreement=worst_task["agreement"] if worst_task else None,
        task=task_summary(worst_task) if worst_task else None,
        bound=bound_cell(records, *_recipe_bounds(job)),
        onnx_nodes=get("counts", "onnx_nodes"),
        conv2d_bn_act=get("counts", "conv2d_bn_act"),
        fusion_coverage=coverage_cell(get("counts", "fusion")),
        batchnorm_folded=get("counts", "batchnorm_folded"),
        off_ai_core_ops=get("counts", "off_ai_core_ops"),
        off_ai_core_ops_unrewritten=get("counts", "off_ai_core_ops_unrewritten"),
        channel_waste_pct=get("counts", "channel_waste_pct"),
        **layout_fields((records.get("rebuild") or {}).get("counts", {}).get("layout")),
        convert_s=round(sum(r.get("seconds", 0.0) for r in records.values()), 2) if records else None,
        latency_ms=get("extra", "median_ms"),
        **compile_fields(records.get("compile")),
    )
