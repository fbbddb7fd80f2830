"""How much of a model the fusion passes fused: the figure the rebuild stage reports.

For Conv and Dense layers: every layer -> (BatchNorm) -> activation chain found (``found``), how
many the fused cell applies the activation of (``fused``), those whose activation the cell
supports at all (``supported``: ELU with alpha != 1 is found but not supported), each by
activation kind, and what was left unfused with the pass's reason, grouped by reason. Blocks
are the fused nodes left in the final graph, by the activation they apply ("none": Conv + BN
only).
"""

from __future__ import annotations

from collections import Counter

from torch2ms.graph.ir import Graph
from torch2ms.passes.base import Pass
from torch2ms.passes.fuse_conv_bn_act import Chain, FuseConvBnAct
from torch2ms.passes.fuse_dense import FuseDenseBnAct


def chain_counts(chains: list[Chain]) -> dict:
    found = Counter(c.kind for c in chains)
    fused = Counter(c.kind for c in chains if c.fused)
    left: dict[tuple[str, str], dict] = {}
    for c in chains:
        if not c.fused:
            entry = left.setdefault(
                (c.kind, c.reason), {"kind": c.kind, "reason": c.reason, "count": 0, "first": c.node}
            )
            entry["count"] += 1
    return {
        "found": len(chains),
        "fused": sum(fused.values()),
        "supported": sum(1 for c in chains if c.supported),
        "by_kind": {k: {"found": n, "fused": fused.get(k, 0)} for k, n in sorted(found.items())},
        "unfused": sorted(left.values(), key=lambda e: -e["count"]),
    }


def block_counts(graph: Graph, op_type: str) -> dict[str, int]:
    blocks = Counter(
        n.attrs.get("activation") or "none"
        for n in graph.nodes
        if n.domain == "torch2ms" and n.op_type == op_type and "has_bn" in n.attrs
    )
    return dict(sorted(blocks.items()))


def fusion_counts(graph: Graph, passes: list[Pass]) -> dict:
    """Chains and blocks after ``passes`` ran over ``graph``; keys are absent for passes not run."""
    out: dict = {}
    for cls, key, op in ((FuseConvBnAct, "conv", "ConvBnAct"), (FuseDenseBnAct, "dense", "Linear")):
        p = next((p for p in passes if isinstance(p, cls)), None)
        if p is not None:
            out[f"{key}_chains"] = chain_counts(p.chains)
            out[f"{key}_blocks"] = block_counts(graph, op)
    return out


def coverage_text(counts: dict) -> str:
    """Report notes: ``Conv->act fused 49/49`` (fused / chains whose activation the cell
    supports) and, when some were left, how many and the most common reason."""
    c = counts.get("conv_chains")
    if not c or not c["found"]:
        return ""
    text = f"Conv->act fused {c['fused']}/{c['supported']}"
    if c["unfused"]:
        top = c["unfused"][0]
        text += f"; {c['found'] - c['fused']} left, {top['count']}x {top['kind']}: {top['reason']}"
    return text


def blocks_text(counts: dict) -> str:
    """``Silu 49, Sigmoid 16``: the Conv2dBnAct blocks by activation, most first."""
    blocks = counts.get("conv_blocks") or {}
    return ", ".join(f"{k} {n}" for k, n in sorted(blocks.items(), key=lambda kv: (-kv[1], kv[0])))


def coverage_cell(counts: dict | None) -> str | None:
    """The zoo summary's "fusion coverage" cell: Conv->(BN)->act chains fused / found."""
    c = (counts or {}).get("conv_chains")
    return f"{c['fused']}/{c['supported']}" if c else None
