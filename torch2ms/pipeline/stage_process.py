"""``python -m torch2ms.pipeline.stage_process FD PARENT_PID``: one stage in a process of its own, for
``pipeline.own_process`` (which starts it and says why). It reads ``sys.path`` and the job from
stdin, runs the runner's ``_execute_here`` for that stage, and writes pickled messages to the pipe
``FD``: ``("log", line)`` as it goes, then ``("result", StageResult)``, ``("error", exception)``
or ``("interrupted", True)``."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from typing import Any

from torch2ms.errors import StageFailed
from torch2ms.runtime.lifetime import die_with_parent, interrupt


def _send(out, kind: str, payload: Any) -> None:
    try:
        out.write(pickle.dumps((kind, payload)))
        out.flush()
    except BrokenPipeError:  # the parent no longer listens (it was interrupted); it cleans up itself
        pass


def _send_error(out, err: BaseException) -> None:
    """The error, with the child's traceback for ``--debug``; as its text if it does not pickle."""
    err.child_traceback = traceback.format_exc()
    try:
        _send(out, "error", err)
    except Exception:  # noqa: BLE001 - e.g. a library's error holding a lock or a session
        _send(out, "error", StageFailed(f"{type(err).__name__}: {err}"))


def _run(out) -> int:
    try:
        sys.path[:] = pickle.load(sys.stdin.buffer)  # what the parent imports from, we import from
        job = pickle.load(sys.stdin.buffer)
        from torch2ms.pipeline.runner import Runner
        from torch2ms.runtime import cpu

        if job["cpu"] is not None:
            cpu.adopt(job["cpu"])  # the parent's choice; its environment (ONEDNN_MAX_CPU_ISA) came with ours

        def log(message: str) -> None:
            _send(out, "log", message)

        runner = Runner(job["recipe"], job["out_root"], log=log, stages=job["stages"], checks=job["checks"], alone=True)
        stage = runner.stages[job["index"]]
        result = runner._execute_here(stage, job["fp"], job["fp_payload"], job["done"], job["floors"])
    except KeyboardInterrupt:  # its partial folder is gone (``_execute_here``)
        _send(out, "interrupted", True)
        return 130
    except BaseException as err:  # noqa: BLE001 - the parent raises it
        _send_error(out, err)
        return 1
    result.declared = None
    _send(out, "result", result)
    return 0


def main(fd: int, parent: int) -> int:
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, interrupt)  # as the CLI does: MindSpore's SIGINT handler sends SIGTERM
    out = os.fdopen(fd, "wb")
    code = 130
    try:
        code = _run(out)
    except KeyboardInterrupt:  # a second one while it was ending: the parent discards what is left
        pass
    finally:
        try:
            out.close()
        except (BrokenPipeError, KeyboardInterrupt):
            pass
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
