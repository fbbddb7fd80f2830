"""Stage 3, fold: BatchNorm folded into the preceding convolution's weights and bias.

With ``fold.ascend_rewrites`` (the default) the Ascend rewrites run last (``torch2ms.passes.ascend_rewrites``):
ops the 310 would run on AI CPU become AI Core equivalents, checked against PyTorch like the rest.

The same generation as rebuild from ``export/model.onnx``, plus the ``FoldBatchNorm`` pass (formula in
``torch2ms.passes.fold_bn``): fused blocks become ``nn.Conv2dBnAct(has_bn=False,
has_bias=True)``; and ``FoldConvAffine``: a constant per-channel ``Mul`` / ``Add`` / ``Sub`` right after
a conv (a frozen BatchNorm written out) goes into its weights and bias too.
Checked: the folded Cell in PyNative mode vs PyTorch. Reports how many
BatchNorms were folded and how many are left (only those with no conv before them).
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.codegen.convert import generate_network
from torch2ms.graph.cache import onnx_graph
from torch2ms.passes import ascend_passes, fold_passes
from torch2ms.pipeline.stage import Stage, StageOutput


def ascend_counts(ctx, fuse: bool, rewrites: bool) -> dict:
    """The zoo's Ascend 310 figures for the folded network: CANN ops off AI Core (on AI CPU, or with
    no kernel at all), with and without the rewrites, and the MACs lost to channel padding
    (``torch2ms.ascend``)."""
    from torch2ms.ascend.report import ascend_report

    rep = ascend_report(onnx_graph(ctx, ctx.artifact("model.onnx")), "fp16", fuse=fuse, rewrites=rewrites, inplace=True)
    off = rep["placement"]["off_ai_core"]
    return {
        "ai_cpu_ops": rep["placement"]["ai_cpu_ops"],
        "off_ai_core_ops": rep["placement"]["off_ai_core_ops"],
        "off_ai_core_ops_unrewritten": rep["placement_unrewritten"]["off_ai_core_ops"],
        "off_ai_core": [f"{g['op']} x{g['count']} ({g['placement']})" for g in off],
        "channel_waste_pct": rep["channels"]["waste_pct"],
        "ascend_rewrites": rep["rewrites"],
    }


class FoldStage(Stage):
    name = "fold"
    summary = "BatchNorm folded into the conv weights and bias"
    section = "fold"
    reads = ("model.onnx", "reference.npz")
    writes = ("network.py", "network.ckpt", "tensor_map.json", "conversion.json")
    localize = True

    def enabled(self, recipe) -> bool:
        return recipe.fold.enabled

    def config(self, recipe):
        # regenerated with the rebuild's passes too, so the rebuild options are an input
        return {**super().config(recipe), "rebuild": recipe.rebuild.model_dump(mode="json")}

    def notes(self, record: dict) -> str:
        c = record.get("counts", {})
        affine = c.get("affine_folded")
        also = f", {affine} per-channel Mul/Add/Sub folded into convs" if affine else ""
        return f"{c.get('batchnorm_folded')} BatchNorm folded, {c.get('batchnorm_left')} left{also}"

    def run(self, ctx, out: Path) -> StageOutput:
        passes = fold_passes(ctx.recipe.rebuild.fuse_conv_bn_act)
        if ctx.recipe.fold.ascend_rewrites:
            passes += ascend_passes()
        result = generate_network(ctx, out, passes, "fold")
        result.counts.update(ascend_counts(ctx, ctx.recipe.rebuild.fuse_conv_bn_act, ctx.recipe.fold.ascend_rewrites))
        result.counts["batchnorm_folded"] = result.counts["passes"].get("fold_batchnorm", 0)
        result.counts["batchnorm_left"] = result.counts["batchnorm_layers"]
        result.counts["affine_folded"] = result.counts["passes"].get("fold_conv_affine", 0)
        return result
