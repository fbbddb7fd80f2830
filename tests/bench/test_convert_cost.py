"""benchmarks/convert_cost.py's measure of a process tree: a forked child's shared pages count once."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def _convert_cost():
    spec = importlib.util.spec_from_file_location("convert_cost", REPO / "benchmarks" / "convert_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/smaps_rollup (Linux only)")
def test_tree_pss_counts_a_forked_childs_shared_pages_once():
    block = np.ones(256 << 20, np.uint8)  # 256 MB, every page touched, then shared with the child
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child touches nothing more: its pages are the parent's, copy-on-write
        os.close(read)
        os.write(write, b"x")
        signal.pause()
        os._exit(0)
    try:
        os.close(write)
        os.read(read, 1)
        tree = [psutil.Process(), psutil.Process(pid)]
        rss = sum(p.memory_info().rss for p in tree)
        pss = _convert_cost().tree_pss(tree)
        mb = 2**20
        assert rss - pss > 200 * mb, (rss / mb, pss / mb)  # RSS counts the block twice, PSS once
        assert pss >= block.nbytes  # and not less than once
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
