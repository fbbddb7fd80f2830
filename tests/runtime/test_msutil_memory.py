"""MindSpore 2.10 refuses a checkpoint larger than MemFree (page cache left out); torch2ms makes its
check read MemAvailable, so a busy page cache does not fail a conversion, and a real shortage still does."""

from __future__ import annotations

import os

import numpy as np
import pytest

from torch2ms.runtime import msutil


def _checkpoint(tmp_path):
    ms = msutil.mindspore()
    path = str(tmp_path / "w.ckpt")
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.ones((256, 256), np.float32))}], path)
    return ms, path


def test_memfree_below_the_checkpoint_no_longer_refuses_it(tmp_path, monkeypatch):
    ms, path = _checkpoint(tmp_path)
    real = os.sysconf
    # MemFree of 4 pages (16 KB) under a 256 KB checkpoint: what MindSpore alone would refuse
    monkeypatch.setattr(os, "sysconf", lambda name: 4 if name == "SC_AVPHYS_PAGES" else real(name))
    from mindspore.train import serialization

    own = serialization._get_available_memory
    assert own.torch2ms and msutil.available_memory() > os.path.getsize(path)
    assert float(ms.load_checkpoint(path)["w"].asnumpy().sum()) == 256 * 256


def test_a_real_shortage_still_fails(tmp_path, monkeypatch):
    ms, path = _checkpoint(tmp_path)
    monkeypatch.setattr(msutil, "available_memory", lambda meminfo="/proc/meminfo": 1024)
    with pytest.raises(Exception, match="exceeds current available memory 1024 bytes"):
        ms.load_checkpoint(path)


def test_meminfo_is_read_in_bytes(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:          211476 kB\nMemAvailable:   18874368 kB\n")
    assert msutil.available_memory(str(info)) == 18874368 * 1024
    assert msutil.available_memory(str(tmp_path / "none")) is None
