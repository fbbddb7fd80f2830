"""Resident memory of a process, measured one way everywhere (zoo workers, bench workers).

``VmRSS`` (now) and ``VmHWM`` (peak) from ``/proc/<pid>/status``. Not ``ru_maxrss``: Linux keeps
that across ``execve``, so a worker started from a large parent would report its parent's peak.
"""

from __future__ import annotations

from pathlib import Path


def _status_mb(field: str, pid: int | str = "self") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of ``pid`` now, in MB (nan if it is gone)."""
    return _status_mb("VmRSS", pid)


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of ``pid`` so far, in MB (nan if it is gone); for this process, across
    ``reset_peak``."""
    if pid == "self":
        return process_peak_rss_mb()
    return _status_mb("VmHWM", pid)


# The process's peak before the last ``reset_peak``: VmHWM restarts from the current RSS there.
_peak_before_reset = 0.0


def process_peak_rss_mb() -> float:
    """Peak resident memory of this process since it started, in MB, across ``reset_peak``."""
    return max(_status_mb("VmHWM"), _peak_before_reset)


def reset_peak() -> bool:
    """Restart this process's VmHWM from its current RSS (``/proc/self/clear_refs``: 5), so that
    the next reading is the peak of what ran in between. False where the kernel does not allow it;
    ``process_peak_rss_mb`` still answers for the whole process."""
    global _peak_before_reset
    _peak_before_reset = process_peak_rss_mb()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def release_freed() -> None:
    """Hand memory that Python objects and native libraries have freed back to the system: a
    garbage collection, then glibc's ``malloc_trim`` (freed blocks below glibc's mmap threshold,
    e.g. onnxruntime's and MindSpore's buffers, otherwise stay in the heap and count as RSS)."""
    import gc

    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's ``malloc_trim`` alone (``release_freed`` without its garbage collection, which costs
    a walk of every object once torch and MindSpore are imported): after a native library freed
    large buffers."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class StageMemory:
    """Resident memory of a block, between ``start()`` and ``stop()`` (or ``with StageMemory() as mem``):
    ``peak_rss_mb`` (the process's high-water mark while the block ran), ``rss_start_mb``,
    ``rss_end_mb``, ``increment_mb`` (peak minus start: what the block itself added at its worst) and
    ``peak_of`` (``stage``; ``process`` where the peak could not be restarted, so it is the process's
    peak since it started)."""

    def start(self) -> StageMemory:
        self.start_mb = rss_mb()
        self.scoped = reset_peak()
        self.peak = self.end = float("nan")
        return self

    def stop(self) -> None:
        self.end = rss_mb()
        hwm = _status_mb("VmHWM") if self.scoped else process_peak_rss_mb()
        # the kernel syncs each thread's RSS count lazily (up to 64 pages a thread): VmHWM was seen
        # 0.3 MB below the RSS read at the start. A peak is at least every RSS read in the block.
        self.peak = max(hwm, self.start_mb, self.end)

    def __enter__(self) -> StageMemory:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def to_dict(self) -> dict:
        return {
            "peak_rss_mb": round(self.peak, 1),
            "rss_start_mb": round(self.start_mb, 1),
            "rss_end_mb": round(self.end, 1),
            "increment_mb": round(self.peak - self.start_mb, 1),
            "peak_of": "stage" if self.scoped else "process",
        }
