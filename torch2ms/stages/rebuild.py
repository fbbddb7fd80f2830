"""Stage 2, rebuild: ONNX -> generated MindSpore source (``network.py``) + ``network.ckpt``.

Every node is analysed before anything is written, and all unsupported ops are reported at
once. Written-out activations and norms become one call each; Conv -> (BatchNorm) ->
activation chains become ``nn.Conv2dBnAct`` (3-D: a generated ``Conv3dBnAct``) and fully
connected ones ``nn.Dense(activation=...)`` (recipe ``rebuild.fuse_conv_bn_act``); the notes say
how many chains were fused of those found, and why the others were not. Checked: the generated
Cell in PyNative mode vs PyTorch.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.codegen.convert import generate_network
from torch2ms.passes import rebuild_passes
from torch2ms.passes.coverage import blocks_text, coverage_text
from torch2ms.pipeline.stage import Stage, StageOutput


class RebuildStage(Stage):
    name = "rebuild"
    summary = "ONNX -> generated network.py + network.ckpt (nn.Conv2dBnAct blocks)"
    section = "rebuild"
    reads = ("model.onnx", "reference.npz", "modules.json")  # modules.json: the module tree, for the classes
    writes = ("network.py", "network.ckpt", "tensor_map.json", "conversion.json")
    localize = True

    def notes(self, record: dict) -> str:
        c = record.get("counts", {})
        fusion = c.get("fusion") or {}
        blocks = blocks_text(fusion)
        notes = f"{c.get('conv2d_bn_act')} Conv2dBnAct"
        if c.get("conv3d_bn_act"):
            notes += f", {c['conv3d_bn_act']} Conv3dBnAct"
        notes += f" ({blocks})" if blocks else ""
        notes += f", {c.get('batchnorm_layers')} BatchNorm left"
        coverage = coverage_text(fusion)
        notes = f"{notes}; {coverage}" if coverage else notes
        failed = (c.get("layout") or {}).get("modules_failed")
        # the module classes could not be made: the code is the flat listing, and the report says so
        return f"{notes}; flat layout, the module classes failed: {failed}" if failed else notes

    def run(self, ctx, out: Path) -> StageOutput:
        return generate_network(ctx, out, rebuild_passes(ctx.recipe.rebuild.fuse_conv_bn_act), "rebuild")
