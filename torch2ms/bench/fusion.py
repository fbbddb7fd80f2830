"""Fusion report from MindSpore's own IR dumps: how many kernels the compiled graph launches,
before and after graph-kernel fusion, and which groups were fused.

Each MindSpore variant is compiled once more in a subprocess with ``save_graphs=1`` (in 2.10 the
``set_context`` option still works; ``MS_DEV_DUMP_IR_PASSES=graph_build`` keeps the dump to the
final kernel graph, ``graph_build_0_*.ir``). In that file the entry subgraph ``@kernel_graph0``
lists one node per kernel launch; a graph-kernel fusion shows up there as ``call @sub(...)``,
and the called subgraph carries ``graph_kernel: BiasAdd_Add_ReLU_fusion`` in its attributes, the
names of the ops it replaced. Bookkeeping nodes (Load, UpdateState, Depend, MakeTuple,
TupleGetItem, Return) are not kernels and are not counted.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

NOT_KERNELS = {"Load", "UpdateState", "Depend", "MakeTuple", "TupleGetItem", "Return", "MakeTupleOrList"}
_NODE = re.compile(r"^\s+%\d+\([^)]*\) = ([\w.]+)(?:\s+@([\w.]+))?")
_SUBGRAPH = re.compile(r"^subgraph @([\w.]+)\(")


def parse_graph_build(text: str) -> dict:
    """Kernels launched by the entry graph, by op type, and the fused groups it calls."""
    fused_name: dict[str, str] = {}
    pending = None
    current = None
    entry_ops: Counter = Counter()
    calls: list[str] = []
    entry = re.search(r"# IR entry: @([\w.]+)", text)
    entry_name = entry.group(1) if entry else "kernel_graph0"
    for line in text.splitlines():
        if line.startswith("graph_kernel: "):
            pending = line.split(": ", 1)[1].strip()
            continue
        m = _SUBGRAPH.match(line)
        if m:
            current = m.group(1)
            if pending:
                fused_name[current] = pending
            pending = None
            continue
        if line.startswith("}"):
            current = None
            continue
        if current != entry_name:
            continue
        m = _NODE.match(line)
        if not m:
            continue
        op, target = m.group(1), m.group(2)
        if op == "call" and target:
            calls.append(target)
        elif op not in NOT_KERNELS:
            entry_ops[op.removeprefix("PrimFunc_")] += 1
    groups = Counter(fused_name.get(t, t) for t in calls)
    return {
        "kernels": sum(entry_ops.values()) + len(calls),
        "ops": dict(entry_ops.most_common()),
        "fused_kernels": len(calls),
        "fused_groups": dict(groups.most_common()),
    }


def read_dump(dump_dir: Path) -> dict | None:
    files = sorted(Path(dump_dir).rglob("graph_build_0_*.ir")) or sorted(Path(dump_dir).rglob("graph_build*.ir"))
    if not files:
        return None
    return parse_graph_build(files[-1].read_text(errors="replace"))


def fusion_report(run_dump, networks: dict[str, tuple[Path, bool]]) -> dict:
    """``networks``: variant key -> (network folder, graph_kernel). ``run_dump(folder, gk, dump_dir)``
    compiles one in a subprocess. Returns per-variant kernel counts and the fused groups."""
    out: dict = {}
    for key, (folder, gk) in networks.items():
        tmp = Path(tempfile.mkdtemp(prefix=f"torch2ms_ir_{key}_"))
        try:
            err = run_dump(folder, gk, tmp)
            parsed = None if err else read_dump(tmp)
            out[key] = parsed if parsed else {"error": err or "MindSpore wrote no graph_build IR file"}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
