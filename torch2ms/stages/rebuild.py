"""Stage 2, rebuild: ONNX -> generated MindSpore source (``network.py``) + ``network.ckpt``.

Every node is analysed before anything is written, and all unsupported ops are reported at
once. Conv -> BatchNorm -> activation chains become ``nn.Conv2dBnAct`` (recipe
``rebuild.fuse_conv_bn_act``). Checked: the generated Cell in PyNative mode vs PyTorch.
The fold stage reuses ``generate_network`` with the BatchNorm-folding pass added.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.codegen.builder import CodeBuilder, Emitter, class_name_for, header_for
from torch2ms.converters.registry import analyse, format_problems
from torch2ms.errors import UnsupportedOpsError
from torch2ms.passes import rebuild_passes, run_passes
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import atomic_write_text, sha256_file, write_json

CONVENTIONS = [
    "BatchNorm momentum is MindSpore's (= 1 - PyTorch's momentum).",
    "Conv padding is (top, bottom, left, right) with pad_mode='pad'; MindSpore's default 'same' pads like TensorFlow.",
]


def convert_graph(graph, class_name: str, source: str, sha: str, recipe_name: str):
    """Analyse every node, then generate code; raises UnsupportedOpsError listing all problems."""
    builder = CodeBuilder(graph, class_name)
    problems = analyse(graph, lambda node: Emitter(CodeBuilder(graph, class_name), node))
    if problems:
        raise UnsupportedOpsError(format_problems(problems, source, graph.opset), problems)
    return builder.build(header_for(class_name, source, sha, graph.opset, recipe_name, CONVENTIONS))


def generate_network(ctx, out: Path, passes, tag: str) -> StageOutput:
    from torch2ms import msutil

    onnx_path = ctx.stage_dir("export") / "model.onnx"
    graph = ctx.onnx_graph(onnx_path)
    fired = run_passes(graph, passes)
    net = convert_graph(graph, class_name_for(ctx.recipe.name), "model.onnx", sha256_file(onnx_path), ctx.recipe.name)
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    atomic_write_text(out / "network.py", net.source)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()], str(out / "network.ckpt"))
    write_json(out / "tensor_map.json", net.tensor_map)
    cell = msutil.build_network(out, tag)
    inputs = ctx.reference_inputs()
    names = list(ctx.reference()[1][0])
    outputs = msutil.run_cell(cell, inputs, names)
    layers = net.layer_counts
    counts = {
        "passes": fired,
        "conv2d_bn_act": layers.get("nn.Conv2dBnAct", 0),
        "batchnorm_layers": sum(v for k, v in layers.items() if k.startswith("nn.BatchNorm")),
        "conv2d": layers.get("nn.Conv2d", 0),
        "graph_nodes": len(graph.nodes),
        "graph_ops": graph.op_counts(),
        "layers": layers,
        "parameters": len(net.params),
    }
    write_json(out / "conversion.json", counts)
    return StageOutput(outputs, counts=counts)


class RebuildStage(Stage):
    name = "rebuild"
    reads = "export"

    def run(self, ctx, out: Path) -> StageOutput:
        return generate_network(ctx, out, rebuild_passes(ctx.recipe.rebuild.fuse_conv_bn_act), "rebuild")
