"""How torch2ms's own processes end: one place for what the CLI, a stage in its own process
(``pipeline.stage_process``) and the zoo's workers share."""

from __future__ import annotations

import os
import signal

_PR_SET_PDEATHSIG = 1  # prctl option: the signal this process gets when its parent dies


def die_with_parent(parent: int | None = None) -> None:
    """Linux: be killed (SIGKILL) when the parent process dies, so that a killed run or batch leaves
    no orphan. ``parent``: its pid as the parent knew it; if the parent died before ``prctl`` took
    effect (this process then has another parent already), exit at once."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def interrupt(signum, frame) -> None:
    """A signal handler that ends the process as Ctrl-C does (``signal.signal(signal.SIGTERM,
    interrupt)``): MindSpore's SIGINT handler sends SIGTERM, and a SIGTERM must discard the partial
    folder and release the lock like a Ctrl-C."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def signal_name(returncode: int) -> str:
    """The name of the signal that killed a process with this (negative) return code."""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
