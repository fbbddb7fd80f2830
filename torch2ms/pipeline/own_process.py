"""A stage in a process of its own: what it imports and allocates leaves with the process.

The export stage runs the PyTorch model: torch and its allocator, the traced graph, onnxruntime's
session and PyTorch's float64 copy of the model. In one process they stayed resident through the four
MindSpore stages after it, where a process that never imported torch peaks far lower
(benchmarks/results/design_measurements.md, docs/troubleshooting.md). So a stage that
declares ``own_process`` runs, when the runner is asked to (``Runner(own_processes=True)``, which
``torch2ms convert`` is), in ``python -m torch2ms.pipeline.stage_process``:

* the parent pickles ``sys.path``, then the job on the child's stdin: the recipe, the stages, the
  runner's checks, the run folder, the stage's fingerprint, the stages done, the floors and the CPU
  choice;
* the child runs the runner's own ``_execute_here`` for that one stage (run, check, replay, record,
  atomic commit: the same code as in one process) and sends its log lines, then its result or its
  error, as pickled messages on a pipe of its own (stdout and stderr stay the user's: warnings and
  tracebacks show as they would);
* the parent keeps the run folder's lock, and the child dies with it (``PR_SET_PDEATHSIG``);
* a Ctrl-C or SIGTERM to the parent reaches the child, which discards its partial folder as in one
  process; a child that ends without a result (killed, out of memory) fails the stage by name, and
  its partial folder goes.

The cost is the child's imports: the export stage imports torch either way, so only the parent's
later imports (onnx, onnxruntime) are paid twice.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from typing import Any

from torch2ms.errors import StageFailed
from torch2ms.runtime.lifetime import signal_name

FIRST_WAIT_S = 2.0  # for a child that got the same Ctrl-C to end on its own
WAIT_AFTER_INTERRUPT_S = 30.0  # for one sent a SIGINT, which discards its partial folder; then it is killed


def run_in_child(runner, stage, fp: str, fp_payload: dict, done: list[str], floors):
    """``runner._execute_here(stage, ...)`` in a fresh process; returns its ``StageResult``."""
    from torch2ms.runtime.cpu import cpu_choice

    job = {
        "recipe": runner.recipe,
        "out_root": runner.run_dir.root.parent,
        "stages": runner.stages,
        "checks": runner.checks,
        "index": runner.stages.index(stage),
        "fp": fp,
        "fp_payload": fp_payload,
        "done": done,
        "floors": floors,
        "cpu": cpu_choice(),
    }
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch2ms.pipeline.stage_process", str(write_fd), str(os.getpid())],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)
    outcome: dict[str, Any] = {}
    try:
        with os.fdopen(read_fd, "rb") as messages:
            try:  # sys.path first: the job's stages are unpickled by importing their modules
                proc.stdin.write(pickle.dumps(sys.path) + pickle.dumps(job))
                proc.stdin.close()
            except BrokenPipeError:  # it ended at once: its stderr said why, its status says how
                pass
            while True:
                try:
                    kind, payload = pickle.load(messages)
                except (EOFError, pickle.UnpicklingError):  # it ended, maybe in the middle of a message
                    break
                if kind == "log":
                    runner.ctx.log(payload)
                else:
                    outcome[kind] = payload
        code = proc.wait()
    except BaseException:  # Ctrl-C or SIGTERM here: the child stops too, and its partial folder goes
        _stop(proc)
        runner.run_dir.discard_partial(stage.name)
        raise
    if "result" in outcome:
        result = outcome["result"]
        result.declared = stage
        return result
    runner.run_dir.discard_partial(stage.name)
    if "error" in outcome:
        raise outcome["error"]
    if "interrupted" in outcome:
        raise KeyboardInterrupt
    used = runner.plugins
    plugins = f"; it runs the AOT kernels of converter plugins {sorted(used)}" if used else ""
    raise StageFailed(
        f"stage {stage.name!r} failed after {done}: its process {_ended(code)} before it gave a result{plugins}",
        hint="a process killed by SIGKILL was most often out of memory (see `dmesg`), by SIGSEGV a native kernel "
        "(a plugin's: its record names the .cc); `torch2ms convert --one-process` runs every stage in one process, "
        "for a debugger",
    )


def _stop(proc: subprocess.Popen) -> None:
    """Let the child end on its own: a terminal's Ctrl-C reached it too. Else (``kill -INT`` or
    SIGTERM to this process alone) it gets a SIGINT; one that still runs after that is killed."""
    try:
        try:
            proc.wait(timeout=FIRST_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=WAIT_AFTER_INTERRUPT_S)
    except BaseException:  # noqa: BLE001 - a second Ctrl-C, or the timeout: it goes now
        proc.kill()
        proc.wait()


def _ended(code: int) -> str:
    return f"was killed by {signal_name(code)}" if code < 0 else f"exited with status {code}"
