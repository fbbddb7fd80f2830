"""The conversion's fusion rules in the board's terms: ATC's ``--fusion_switch_file``.

ATC fuses by named patterns, not by op types: graph fusion (the fusion engine rewrites the graph)
and UB fusion (kernels that share the AI Core's Unified Buffer). A switch file turns patterns off::

    {"Switch": {"GraphFusion": {"SoftmaxFusionPass": "off"}, "UBFusion": {"ALL": "off"}}}

(CANN ATC ``--fusion_switch_file``:
https://www.hiascend.com/document/detail/en/canncommercial/800/devaids/atc/atlasatcparam_16_0053.html and
its Chinese 8.0.RC2 page, which gives the JSON form and ``ALL``:
https://hiascend.com/document/detail/zh/canncommercial/80RC2/devaids/auxiliarydevtool/atlasatc_16_0085.html;
the pattern names: "Graph Fusion and UB Fusion Patterns",
https://www.hiascend.com/document/detail/en/canncommercial/800/graph/graphubfusionref.)

The rules come from the compile stage's record (``fusion_rules``: the recipe's ``compile.fusion`` and
``graph_kernel_flags`` plus the rule a failed graph-kernel build added), or from the recipe when the
record has none. ``opt_level: 0`` (no graph-kernel fusion) switches every pattern off; an op type in
``disable_cluster_ops`` switches off the patterns ``PASSES`` lists for it. An op type with no listed
pattern is named in the manifest's warnings: ATC keeps fusing it.
"""

from __future__ import annotations

import json

FILE = "fusion_switch.cfg"
# MindSpore op type -> the CANN patterns (graph fusion) that fuse it, from the pattern reference above:
# MatMulBiasAddFusionPass, SoftmaxFusionPass, ConvConcatFusionPass, PoolingFusionPass (the GraphFusion
# switches of the fusion-switch example in https://hiascend.com/document/detail/zh/Pytorch/60RC2/modthirdparty/
# torchairuseguide/torchair_0011.html), BatchMatmulNonAlignedFusionPass (graphubfusionref/atlasrr_30_0035.html),
# ConvScaleFusionPass (graphubfusionref/atlasrr_30_0016.html).
PASSES = {
    "MatMul": ("MatMulBiasAddFusionPass",),
    "BiasAdd": ("MatMulBiasAddFusionPass",),
    "BatchMatMul": ("BatchMatmulNonAlignedFusionPass",),
    "Softmax": ("SoftmaxFusionPass",),
    "Conv2D": ("ConvScaleFusionPass", "ConvConcatFusionPass"),
    "Concat": ("ConvConcatFusionPass",),
    "MaxPool": ("PoolingFusionPass",),
    "AvgPool": ("PoolingFusionPass",),
}


def switches(rules: dict) -> tuple[dict | None, list[str]]:
    """ATC's switch file for ``rules`` (None when no rule turns a pattern off), and the op types
    kept out of fusion that no listed pattern covers."""
    if rules.get("opt_level") == 0:
        return {"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ALL": "off"}}}, []
    ops = rules.get("disable_cluster_ops", [])
    graph = {p: "off" for op in ops for p in PASSES.get(op, ())}
    unmapped = [op for op in ops if op not in PASSES]
    if not graph:
        return None, unmapped
    return {"Switch": {"GraphFusion": dict(sorted(graph.items())), "UBFusion": {}}}, unmapped


def bundle_rules(recipe, records: dict) -> dict:
    """The fusion rules that applied: the compile record's, else the recipe's."""
    from torch2ms.runtime import graph_kernel

    recorded = ((records.get("compile") or {}).get("extra") or {}).get("fusion_rules")
    return recorded if recorded is not None else graph_kernel.rules(recipe.compile)


def add(files: dict, manifest: dict, recipe, records: dict, target_name: str) -> None:
    """Adds ``targets/<target>/fusion_switch.cfg`` and its ``--fusion_switch_file`` flag to atc.sh
    when a rule applies; names the op types ATC will still fuse in the manifest's warnings."""
    rules = bundle_rules(recipe, records)
    switch, unmapped = switches(rules)
    if unmapped:
        manifest["warnings"].append(
            f"fusion: no ATC fusion pattern is known for {unmapped} (compile.fusion.disable_cluster_ops): "
            "ATC may still fuse them on the board"
        )
    if switch is None:
        return
    tdir = f"targets/{target_name}"
    files[f"{tdir}/{FILE}"] = (json.dumps(switch, indent=2) + "\n").encode()
    atc = files[f"{tdir}/atc.sh"].decode()
    anchor = '\necho "wrote '
    if anchor not in atc:
        raise AssertionError("atc.sh has no 'echo \"wrote' line after its atc command")
    flag = f' \\\n  --fusion_switch_file="$HERE/{FILE}"'
    files[f"{tdir}/atc.sh"] = atc.replace(anchor, flag + anchor, 1).encode()
