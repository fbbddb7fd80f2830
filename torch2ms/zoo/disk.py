"""Disk used by zoo run folders, and what a passed model keeps.

A run folder holds the weights several times over: the ONNX (export), the rebuild's checkpoint,
the fold's checkpoint and the MindIR. Once a model has passed, its user needs the records and
reports, the final ``network.py`` with its checkpoint, the MindIR, and what ``diff`` and a re-run
need (the ONNX and ``reference.npz``). What goes (``--keep needed``, the default) is every
checkpoint that a later enabled stage writes again: the rebuild's ``network.ckpt`` when the fold
stage is on.

Up-to-date detection still holds: the pruned artifact moves from the stage record's ``artifacts``
to its ``pruned`` map (name -> sha256), so the runner, which checks the artifacts a record lists,
still finds the stage up to date; and no later stage's fingerprint reads it (the stages after
rebuild read the ONNX from export and the weights from fold). ``--keep all`` keeps everything.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch2ms.pipeline.workspace import RECORD, RunDir, write_json

KEEP = ("needed", "all")
WEIGHTS = (".ckpt",)


def du_mb(path: Path) -> float:
    """Disk used by the files under ``path`` (allocated blocks, like ``du``), in MB."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total / 2**20


def superseded(stages, recipe) -> dict[str, list[str]]:
    """Weight artifacts of each enabled stage that a later enabled stage writes again."""
    enabled = [st for st in stages if st.enabled(recipe)]
    out = {}
    for i, st in enumerate(enabled):
        later = {a for s in enabled[i + 1 :] for a in s.writes}
        names = [a for a in st.writes if a.endswith(WEIGHTS) and a in later]
        if names:
            out[st.name] = names
    return out


def prune(run_dir: RunDir, stages, recipe) -> list[Path]:
    """Delete the superseded weights of a passed run; return the files deleted."""
    gone = []
    for stage, names in superseded(stages, recipe).items():
        record = run_dir.read_record(stage)
        if not record or record.get("status") != "passed":
            continue
        artifacts = record.setdefault("artifacts", {})
        pruned = record.setdefault("pruned", {})
        files = [run_dir.stage_dir(stage) / n for n in names]
        moved = [n for n in names if n in artifacts]
        for name in moved:
            pruned[name] = artifacts.pop(name)
        if moved:  # the record first: a kill in between leaves a file too many, never a record that lists a lost one
            write_json(run_dir.stage_dir(stage) / RECORD, record)
        for path in files:
            if path.is_file():
                path.unlink()
                gone.append(path)
    return gone
