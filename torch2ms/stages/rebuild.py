"""Stage 2, rebuild: ONNX -> generated MindSpore source (``network.py``) + ``network.ckpt``.

Every node is analysed before anything is written, and all unsupported ops are reported at
once. Conv -> BatchNorm -> activation chains become ``nn.Conv2dBnAct`` (recipe
``rebuild.fuse_conv_bn_act``). Checked: the generated Cell in PyNative mode vs PyTorch.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.conversion import generate_network
from torch2ms.passes import rebuild_passes
from torch2ms.pipeline.stage import Stage, StageOutput


class RebuildStage(Stage):
    name = "rebuild"
    summary = "ONNX -> generated network.py + network.ckpt (nn.Conv2dBnAct blocks)"
    section = "rebuild"
    reads = ("model.onnx", "reference.npz")
    writes = ("network.py", "network.ckpt", "tensor_map.json", "conversion.json")
    localize = True

    def notes(self, record: dict) -> str:
        c = record.get("counts", {})
        return f"{c.get('conv2d_bn_act')} Conv2dBnAct, {c.get('batchnorm_layers')} BatchNorm left"

    def run(self, ctx, out: Path) -> StageOutput:
        return generate_network(ctx, out, rebuild_passes(ctx.recipe.rebuild.fuse_conv_bn_act), "rebuild")
