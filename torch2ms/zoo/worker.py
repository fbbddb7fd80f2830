"""One zoo model in its own process: ``python -m torch2ms.zoo.worker <run dir>/zoo-job.json``.

Runs the five stages with the ordinary ``Runner`` (so finished stages are skipped on a re-run),
writes ``report.json``/``report.md`` like ``torch2ms convert``, and keeps ``zoo-status.json``
current so that the launcher knows which stage was running if this process dies. Exit code 0
whether the model passed or failed its checks: a failure is data in the status file (its reason,
and its category and blockers from ``torch2ms.zoo.failures``); any other exit means the worker
itself crashed. A passed model's superseded weight copies are then deleted unless the job says
``keep: all`` (``torch2ms.zoo.disk``). With ``profile_calls`` in the job (``zoo --profile``), a passed
model is profiled first (``torch2ms.zoo.profile``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from torch2ms.runtime.lifetime import die_with_parent
from torch2ms.runtime.memory import peak_rss_mb


def _die_with_parent() -> None:
    """Be killed if the launcher (or fork server) dies, so a killed batch leaves no orphan conversions."""
    parent = os.environ.get("TORCH2MS_ZOO_PARENT")
    die_with_parent(int(parent) if parent else None)


def main(job_path: str) -> int:
    _die_with_parent()
    job = json.loads(Path(job_path).read_text())
    # The CPU setting must be in the environment before anything imports MindSpore.
    from torch2ms.runtime.cpu import configure_cpu

    choice = configure_cpu(job.get("cpu_isa"))
    os.environ.setdefault("GLOG_v", "3")

    from torch2ms.pipeline.report import write_reports
    from torch2ms.recipe import parse_recipe
    from torch2ms.stages import pipeline_runner
    from torch2ms.zoo.disk import prune
    from torch2ms.zoo.files import write_status

    run_dir = Path(job["out_root"]) / job["name"]
    status = _initial_status(job)

    def update(**kw) -> None:
        status.update(kw, updated=time.time(), peak_rss_mb=round(peak_rss_mb(), 1))
        write_status(run_dir, status)

    def on_stage(stage: str, state: str) -> None:
        status["stages"][stage] = state
        print(f"[zoo] {job['name']}: {stage} {state}", flush=True)
        update(stage=stage)

    print(f"[zoo] {job['name']}: CPU ONEDNN_MAX_CPU_ISA={choice.isa} ({choice.source}); pid {os.getpid()}", flush=True)
    update()
    t0 = time.perf_counter()
    try:
        recipe = parse_recipe(job["recipe"], job["source"], job["base_dir"])
        runner = pipeline_runner(
            recipe, Path(job["out_root"]), log=lambda m: print(f"[zoo] {m}", flush=True), on_stage=on_stage
        )
        result = runner.run()
        write_reports(result)
    except Exception as err:  # a stage raised: the model failed, the worker did its job
        traceback.print_exc()
        update(**_raised(status, err), seconds=round(time.perf_counter() - t0, 2))
        return 0
    for s in result.stages:
        status["stages"][s.stage] = s.status
    reason, failure = _verdict(result, run_dir)
    if result.passed and job.get("profile_calls"):
        from torch2ms.zoo.profile import profile_model

        update(stage="profile")
        profile_model(recipe, job, runner.run_dir.root, lambda m: print(f"[zoo] {m}", flush=True))
    if result.passed and job.get("keep", "needed") != "all":
        gone = prune(runner.run_dir, runner.stages, recipe)
        if gone:
            print(f"[zoo] {job['name']}: deleted intermediate weights {', '.join(map(str, gone))}", flush=True)
    update(
        state="finished",
        status="passed" if result.passed else "failed",
        reason=reason,
        failure=failure.to_dict() if failure else None,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return 0


def _initial_status(job: dict) -> dict:
    """zoo-status.json as the worker starts: running, no stage yet."""
    from torch2ms.stages import stage_names

    return {
        "batch": job["batch"],
        "name": job["name"],
        "state": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "stage": None,
        "stages": dict.fromkeys(stage_names(), "not run"),
        "status": None,
        "reason": "",
    }


def _raised(status: dict, err: Exception) -> dict:
    """The status fields of a run a stage raised out of; the running stage becomes failed."""
    from torch2ms.errors import Torch2msError
    from torch2ms.zoo.failures import from_exception

    running = status["stage"] if status["stage"] and status["stages"].get(status["stage"]) == "running" else None
    if running:
        status["stages"][running] = "failed"
    reason = str(err) if isinstance(err, Torch2msError) else f"{type(err).__name__}: {err}"
    failure = from_exception(err, status["stage"])
    return {"state": "finished", "status": "failed", "reason": reason, "failure": failure.to_dict()}


def _verdict(result, run_dir: Path):
    """(reason, Failure or None) of a run that ended: the failed stage's, else a not-checkable one's."""
    from torch2ms.pipeline.evidence import NOT_CHECKABLE
    from torch2ms.zoo.failures import from_check, not_checkable

    failed = result.failed_stage
    reason = f"stage {failed.stage!r} is out of tolerance against PyTorch: {failed.reason}" if failed else ""
    failure = from_check(failed.stage, failed.record, run_dir / failed.stage) if failed else None
    unsure = next((s for s in result.stages if s.status == NOT_CHECKABLE), None)
    if failed is None and unsure is not None:
        reason = f"stage {unsure.stage!r} is not checkable at these inputs: {unsure.reason}"
        failure = not_checkable(unsure.stage)
    return reason, failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
