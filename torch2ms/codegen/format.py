"""The generated file's formatting: ``ruff format`` at line length 100, run as a subprocess."""

from __future__ import annotations

import shutil
import subprocess

LINE_LENGTH = 100  # the generated file's, not this repository's


def _ruff() -> str | None:
    ruff = shutil.which("ruff")
    if ruff is not None:
        return ruff
    try:
        from ruff.__main__ import find_ruff_bin

        return find_ruff_bin()
    except (ImportError, FileNotFoundError):
        return None


def format_source(source: str) -> tuple[str, str | None]:
    """``source`` through ``ruff format`` at line length 100 (a requirement of torch2ms), and the
    formatter's description; as it is, and None, when ruff cannot be run."""
    ruff = _ruff()
    if ruff is None:
        return source, None
    cmd = [ruff, "format", "--isolated", "--line-length", str(LINE_LENGTH), "--stdin-filename", "network.py", "-"]
    try:
        done = subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return source, None
    if done.returncode != 0:
        return source, None
    return done.stdout, f"ruff format --line-length {LINE_LENGTH}"
