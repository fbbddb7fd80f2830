"""How many threads torch, onnxruntime and MindSpore may each use in this process.

Why: each of them starts one thread per core by default, and each thread spins for a while when it
waits. Two processes side by side on two cores (two zoo workers, two test workers) then run four
to six spinning threads on two cores, and each waits for the others (what one thread each saved:
benchmarks/results/design_measurements.md).

``TORCH2MS_THREADS=N`` caps all three:

* torch: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` (read when torch starts), unless the user set one;
* MindSpore: ``runtime_num_threads`` (``runtime.msutil.mindspore()``);
* onnxruntime: ``intra_op_num_threads`` of every session that does not choose its own
  (``graph.onnxrt.session_options``).

``torch2ms zoo`` gives each worker its share of the cores (``share``); the test suite does the
same for its pytest-xdist workers (tests/conftest.py). Unset, every library keeps its default.
"""

from __future__ import annotations

import os

ENV = "TORCH2MS_THREADS"
_LIBRARY_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def budget() -> int | None:
    """The cap from ``TORCH2MS_THREADS``, or None when it is unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        from torch2ms.errors import Torch2msError

        raise Torch2msError(
            f"{ENV}={raw!r} is not a whole number of threads >= 1", hint=f"set {ENV} to e.g. 1, or unset it"
        )
    return value


def cores() -> int:
    """The threads this process may use: its budget, else the cores it may run on."""
    n = budget()
    if n is not None:
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share(parallel: int) -> int:
    """Each of ``parallel`` processes' share of ``cores()``, at least one thread."""
    return max(1, cores() // max(1, parallel))


def configure_environment() -> int | None:
    """Put the budget where torch's OpenMP reads it (before torch starts). The user's own
    ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` wins: then neither is set (torch takes the smaller)."""
    n = budget()
    if n is not None and not any(name in os.environ for name in _LIBRARY_ENV):
        for name in _LIBRARY_ENV:
            os.environ[name] = str(n)
    return n
