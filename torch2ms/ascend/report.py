"""One Ascend 310 report for a network: placement counts, every op off AI Core, and the tuning advice.

``ascend_report(graph, precision)`` takes the graph as exported; it applies the fold stage's
passes plus the Ascend rewrites (``torch2ms.passes.ascend_passes``) itself, so what is placed is
the deployed network. ``render`` prints it for ``torch2ms check --target``; ``markdown`` is the
section of the bundle's compatibility report.
"""

from __future__ import annotations

import copy

from torch2ms.ascend import advice
from torch2ms.ascend.placement import place_graph, summary
from torch2ms.ascend.table import load
from torch2ms.graph.ir import Graph
from torch2ms.pipeline.markdown import table

TOP_WASTE = 8


def ascend_report(
    graph: Graph, precision: str = "fp16", fuse: bool = True, rewrites: bool = True, inplace: bool = False
) -> dict:
    """Placement and advice of ``graph`` (as exported) after the fold stage's passes and, with
    ``rewrites``, the Ascend rewrites; ``placement_unrewritten`` is the placement before them.
    ``inplace``: the passes rewrite ``graph`` itself (no copy of its weights)."""
    from torch2ms.passes import ascend_passes, fold_passes, run_passes

    g = graph if inplace else copy.deepcopy(graph)
    fired = run_passes(g, fold_passes(fuse))
    unrewritten = summary(place_graph(g, precision))
    if rewrites:
        fired.update(run_passes(g, ascend_passes()))
    infos = place_graph(g, precision)
    convs = advice.channel_waste(g, precision)
    worst = sorted((c for c in convs if c.waste), key=lambda c: -c.waste)
    prov = load()["provenance"]
    return {
        "chip": "Ascend310",
        "precision": precision,
        "sources": {"ai_core": prov["ai_core"]["source"], "ai_cpu": prov["ai_cpu"]["source"]},
        "rewrites": {k: v for k, v in fired.items() if k.startswith("ascend_") and v},
        "placement": summary(infos),
        "placement_unrewritten": {
            k: unrewritten[k] for k in ("counts", "ai_cpu_ops", "off_ai_core_ops", "off_ai_core")
        },
        "channels": {
            **advice.waste_totals(convs),
            "convs": len(convs),
            "padded_convs": len(worst),
            "worst": [
                {"module": c.module, "c_in": c.c_in, "c_out": c.c_out, "groups": c.groups, "waste_macs": c.waste}
                for c in worst[:TOP_WASTE]
            ],
        },
        "resize": [
            {
                "module": r.module,
                "src": r.src,
                "dst": r.dst,
                "aligned": r.aligned,
                "nearest_src": r.nearest_src,
                "pair": r.pair,
            }
            for r in advice.resize_alignment(g, infos)
        ],
        "ub_fusion": advice.ub_fusion(g, infos),
    }


def _macs(v: float) -> str:
    return f"{v / 1e9:.2f} GMAC" if v >= 1e8 else f"{v / 1e6:.1f} MMAC"


def render(rep: dict) -> list[str]:
    """Plain-text lines (``torch2ms check --target``)."""
    return placement_lines(rep) + advice_lines(rep)


def placement_lines(rep: dict) -> list[str]:
    p = rep["placement"]
    lines = [
        f"Placement on the {rep['chip']} ({rep['precision']}), from the CANN op list and MindSpore's AI CPU kernels; "
        "nothing was run on a board:",
        "  " + ", ".join(f"{k}: {v}" for k, v in p["counts"].items()) + " (CANN ops)",
    ]
    if rep["rewrites"]:
        lines.append("  rewritten for AI Core: " + ", ".join(f"{k} x{v}" for k, v in rep["rewrites"].items()))
    if p["off_ai_core"]:
        lines.append("Ops off AI Core:")
        for g in p["off_ai_core"]:
            where = ", ".join(g["where"][:4]) + (f" (+{len(g['where']) - 4})" if len(g["where"]) > 4 else "")
            calls = ", ".join(g["calls"])
            lines.append(f"  {g['placement']:<11} {g['op']} x{g['count']} [{g['dtype']}] ({calls}): {g['reason']}")
            lines.append(f"              at {where}")
    else:
        lines.append("No op off AI Core.")
    return lines


def advice_lines(rep: dict) -> list[str]:
    c = rep["channels"]
    lines = []
    lines.append(
        f"Channel padding: {c['padded_convs']} of {c['convs']} convolutions have channels that are not multiples of "
        f"C0; {_macs(c['waste_macs'])} of {_macs(c['conv_macs'])} computed on padding ({c['waste_pct']}%)"
    )
    for w in c["worst"]:
        channels = f"{w['c_in']} -> {w['c_out']} channels (groups {w['groups']})"
        lines.append(f"  {w['module']}: {channels}, {_macs(w['waste_macs'])} wasted")
    bad = [r for r in rep["resize"] if not r["aligned"]]
    n = len(rep["resize"])
    lines.append(f"Resize alignment ((dst-1)/(src-1) integral): {n - len(bad)} of {n} resizes aligned")
    for r in bad:
        fixes = [f"input {r['nearest_src']} for this output"] if r["nearest_src"] else []
        fixes += [f"{r['pair'][0]} -> {r['pair'][1]}"] if r["pair"] else []
        lines.append(
            f"  {r['module']}: {r['src']} -> {r['dst']}; aligned: {' or '.join(fixes) or 'no size near this one'}"
        )
    ub = rep["ub_fusion"]
    lines.append("UB fusion chains: " + (", ".join(f"{k} x{v}" for k, v in ub["chains"].items()) or "none"))
    for b in ub["breaks"]:
        lines.append(f"  chain breaks x{b['count']}: {b['reason']} (first at {b['first']})")
    return lines


def markdown(rep: dict) -> list[str]:
    """The compatibility report's section."""
    p = rep["placement"]
    lines = [
        f"## Op placement on the {rep['chip']} ({rep['precision']})",
        "",
        f"From the CANN AI Core op list ({rep['sources']['ai_core']}) and MindSpore's AI CPU kernels "
        f"({rep['sources']['ai_cpu']}); derived, not run on a board.",
        "",
        *table(("placement", "CANN ops"), p["counts"].items()),
        "",
    ]
    if rep["rewrites"]:
        lines += ["Rewritten for AI Core: " + ", ".join(f"{k} x{v}" for k, v in rep["rewrites"].items()), ""]
    if p["off_ai_core"]:
        header = ("placement", "op", "count", "dtype", "MindSpore call", "reason", "where")
        off = [
            (
                g["placement"],
                g["op"],
                g["count"],
                g["dtype"],
                ", ".join(g["calls"]),
                g["reason"],
                ", ".join(g["where"][:6]),
            )
            for g in p["off_ai_core"]
        ]
        lines += [*table(header, off), ""]
    lines += ["### Tuning advice", "", "```", *advice_lines(rep), "```", ""]
    return lines
