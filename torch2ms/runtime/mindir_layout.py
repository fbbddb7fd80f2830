"""Where a MindIR's bytes are, for any size of weights: one name for the graph, the weights beside it.

``mindspore.export(..., file_format="MINDIR")`` writes ``<prefix>.mindir`` (graph and weights in one
protobuf) while the parameters' bytes sum to at most ``TOTAL_SAVE`` KB (1024 * 1024 KB = 1 GB; in
``mindspore/train/serialization.py``, ``_save_together``). Above that it writes the graph alone to
``<prefix>_graph.mindir`` and the weights to ``<prefix>_variables/data_0``, ``data_1``, ... (a new file
every ``PARAMETER_SPLIT_SIZE`` KB); each parameter of the graph names its file by a path relative to
the graph's folder (``external_data.location``), so ``mindspore.load`` finds them whatever the graph
file is called.

torch2ms keeps one layout for both sizes: the graph is always ``network.mindir``, and
``network_variables/`` sits beside it when the weights are over 1 GB. Everything that reads the
MindIR (the mindir stage, ``verify``, ``infer.py``, the board scripts) loads ``network.mindir``;
everything that moves or hashes it (stage records, bundles) takes ``files()``.
"""

from __future__ import annotations

import os
from pathlib import Path

GRAPH = "network.mindir"
VARIABLES = "network_variables"
_SPLIT_GRAPH = "network_graph.mindir"  # what mindspore.export names the graph above 1 GB


def export(ms, cell, *example, folder: Path) -> list[Path]:
    """``mindspore.export`` into ``folder`` as ``network.mindir`` (+ ``network_variables/``); its files."""
    folder = Path(folder)
    ms.export(cell, *example, file_name=str(folder / "network"), file_format="MINDIR")
    split = folder / _SPLIT_GRAPH
    if split.exists():
        os.replace(split, folder / GRAPH)
    written = files(folder)
    umask = os.umask(0)
    os.umask(umask)
    for p in [*written, folder / VARIABLES]:  # mindspore makes them 0400 / 0700; a run is meant to be shared
        if p.exists():
            os.chmod(p, (0o755 if p.is_dir() else 0o644) & ~umask)
    return written


def files(folder: Path) -> list[Path]:
    """The MindIR in ``folder``: the graph first, then its weight files (if any) in name order, then
    the user kernels its Custom ops load (``kernels/``, ``torch2ms.custom.aot``)."""
    folder = Path(folder)
    graph = folder / GRAPH
    if not graph.is_file():
        raise FileNotFoundError(f"{graph} is missing")
    out = [graph]
    for sub in (VARIABLES, "kernels"):
        if (folder / sub).is_dir():
            out += sorted(p for p in (folder / sub).rglob("*") if p.is_file())
    return out


def bundle_entries(folder: Path, prefix: str = "model") -> dict[str, Path]:
    """``files()`` as bundle paths: ``model/network.mindir``, ``model/network_variables/data_0``, ..."""
    folder = Path(folder)
    return {f"{prefix}/{p.relative_to(folder).as_posix()}": p for p in files(folder)}
