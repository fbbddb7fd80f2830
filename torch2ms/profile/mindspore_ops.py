"""MindSpore's side of ``torch2ms profile``: one variant's kernels under ``mindspore.profiler.Profiler``.

On CPU the Profiler writes, under ``<output_path>/<job>/FRAMEWORK/``:

- ``cpu_op_detail_info_0.csv``: per kernel (``full_op_name``, the cell scope in GRAPH_MODE, e.g.
  ``Default/backbone-ResNetBackbone/layer1-SequentialCell/0-Bottleneck/conv1-Conv2dBnAct/conv-Conv2d/Conv2D-op0``)
  its type, occurrences and total time;
- ``cpu_op_execute_timestamp_0.txt``: per kernel its start time of every occurrence, which gives
  the order kernels ran in.

A scope's segments are ``<attribute>-<Cell class>``; since the generated ``network.py`` keeps
PyTorch's attribute paths, the attributes joined with dots are the PyTorch module path
(``backbone.layer1.0.conv1.conv``). Two kinds of kernel carry no scope, measured: a graph-kernel
fused kernel (``Default/GraphKernel_BiasAdd_ReLU_fusion-op0``) and every PyNative kernel
(``Default/Conv2D-op0``). A fused kernel is attributed to the module of the scoped kernel that ran
just before it (the op it was fused after, e.g. the convolution before BiasAdd + ReLU); PyNative
gets no per-module figures.

``profile_loaded`` runs in a subprocess of its own (``torch2ms.profile.worker``): the Profiler and
MindSpore's execution mode are process-global, and each variant compiles its own graph.
"""

from __future__ import annotations

import csv
import re
import shutil
import tempfile
import time
from pathlib import Path

OP_SUFFIX = re.compile(r"-op\d+$")
NO_MODULE = "(no module)"


def module_path(full_op_name: str) -> str | None:
    """The dotted module path of a kernel's scope, '' for a kernel at the top level, None when the
    name carries no scope (a fused kernel, PyNative)."""
    parts = full_op_name.split("/")
    if len(parts) < 2 or parts[0] != "Default":
        return None
    cells = parts[1:-1]
    if not cells:
        return None if parts[-1].startswith("GraphKernel_") or "-op" not in parts[-1] else ""
    return ".".join(seg.split("-", 1)[0] for seg in cells)


def op_type(full_op_name: str) -> str:
    return OP_SUFFIX.sub("", full_op_name.rsplit("/", 1)[-1])


def read_detail(folder: Path) -> list[dict]:
    """The rows of ``cpu_op_detail_info_0.csv``: full name, type, occurrences, total ms."""
    with open(folder / "cpu_op_detail_info_0.csv", newline="") as f:
        return [
            {
                "name": r["full_op_name"],
                "type": r["op_type"],
                "occurrences": int(r["op_occurrences"]),
                "total_ms": float(r["op_total_time(ms)"]),
            }
            for r in csv.DictReader(f)
        ]


def read_order(folder: Path) -> list[str]:
    """Kernel names in the order of their first start (``cpu_op_execute_timestamp_0.txt``)."""
    first: dict[str, int] = {}
    path = folder / "cpu_op_execute_timestamp_0.txt"
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(";HostCpuOps;")
        starts = [int(x.split(",", 1)[0]) for x in rest.split() if x]
        if name and starts:
            first[name] = min(starts)
    return sorted(first, key=first.get)


def attribute(detail: list[dict], order: list[str]) -> dict[str, str | None]:
    """Kernel name -> module path: its own scope, or for an unscoped kernel in a scoped graph the
    module of the scoped kernel that ran before it (None where nothing scoped ran before it)."""
    own = {k["name"]: module_path(k["name"]) for k in detail}
    if not any(v for v in own.values()):
        return own
    out, last = dict(own), None
    for name in order:
        if own.get(name) is None and name in own:
            out[name] = last
        elif own.get(name) is not None:
            last = own[name]
    return out


def find_framework(root: Path) -> Path:
    found = sorted(root.glob("*/FRAMEWORK/cpu_op_detail_info_0.csv"))
    if not found:
        raise RuntimeError(f"mindspore.profiler.Profiler wrote no cpu_op_detail_info_0.csv under {root}")
    return found[-1].parent


def profile_loaded(loaded, calls: int) -> dict:
    """``calls`` calls of a loaded variant (``torch2ms.bench.variants.load``: compiled and called
    once already, outputs materialised by each call) under the Profiler, into a temporary folder
    outside the checkout that is removed after parsing: per kernel its type, module path,
    kernels per call and ms per call, and the wall time per call."""
    from mindspore.profiler import Profiler

    loaded.activate()
    loaded.call()  # a warm call outside the profile
    tmp = Path(tempfile.mkdtemp(prefix="torch2ms_profile_"))
    try:
        prof = Profiler(output_path=str(tmp))
        t0 = time.perf_counter()
        for _ in range(calls):
            loaded.call()
        wall = (time.perf_counter() - t0) * 1e3 / calls
        prof.stop()
        prof.analyse()
        folder = find_framework(tmp)
        detail, order = read_detail(folder), read_order(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    modules = attribute(detail, order)
    kernels = [
        {
            "name": k["name"],
            "type": k["type"] or op_type(k["name"]),
            "module": modules.get(k["name"]),
            "per_call": k["occurrences"] / calls,
            "ms_per_call": k["total_ms"] / calls,
        }
        for k in detail
    ]
    return {"wall_ms_per_call": wall, "calls": calls, "kernels": kernels}
