"""``sha256_file`` remembers a settled file's digest, and never serves it for changed bytes."""

from __future__ import annotations

import hashlib
import os
import time

import torch2ms.pipeline.workspace as workspace
from torch2ms.pipeline.workspace import sha256_file


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_rewrite_of_the_same_size_is_hashed_again(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"a" * 4096)
    assert sha256_file(path) == _digest(b"a" * 4096)  # fresh: not remembered (a write may follow in this tick)
    path.write_bytes(b"b" * 4096)  # same size, same inode, maybe the same coarse tick
    assert sha256_file(path) == _digest(b"b" * 4096)
    time.sleep(2 * workspace._SETTLED_S)
    reads = []
    real = os.fstat
    monkeypatch.setattr(workspace.os, "fstat", lambda fd: reads.append(fd) or real(fd))
    assert sha256_file(path) == _digest(b"b" * 4096)  # settled: remembered
    assert sha256_file(path) == _digest(b"b" * 4096) and len(reads) == 3  # the second call read no bytes
    with open(path, "r+b") as f:  # a byte changed in place, at once
        f.write(b"c")
    assert sha256_file(path) == _digest(b"c" + b"b" * 4095)
    replaced = tmp_path / "other"
    replaced.write_bytes(b"d" * 4096)
    os.replace(replaced, path)
    assert sha256_file(path) == _digest(b"d" * 4096)
