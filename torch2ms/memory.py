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
    """Peak resident memory of ``pid`` so far, in MB (nan if it is gone)."""
    return _status_mb("VmHWM", pid)
