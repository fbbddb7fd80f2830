"""From a loaded graph to generated code: can it be converted (``find_problems``), convert it
(``convert_graph``), and write a stage's ``network.py`` + checkpoint and run it
(``generate_network``). The rebuild and fold stages, ``check``, ``bench`` and the per-op tests
all go through here."""

from __future__ import annotations

import copy
from pathlib import Path

from torch2ms.codegen.builder import CodeBuilder, GeneratedNetwork, class_name_for, header_for
from torch2ms.converters.registry import Problem, analyse, format_problems
from torch2ms.errors import UnsupportedOpsError
from torch2ms.graph.ir import Graph
from torch2ms.passes import Pass, fold_passes, rebuild_passes, run_passes

CONVENTIONS = [
    "BatchNorm momentum is MindSpore's (= 1 - PyTorch's momentum).",
    "Conv padding is (top, bottom, left, right) with pad_mode='pad'; MindSpore's default 'same' pads like TensorFlow.",
]


def find_problems(graph: Graph, fuse_conv_bn_act: bool = True, fold: bool = True) -> list[Problem]:
    """Problems of ``graph`` as exported and after the rebuild (and fold) passes, each once: a
    fused node's problem is not missed, and problems are named after the user's ONNX nodes."""
    variants = [[], rebuild_passes(fuse_conv_bn_act)] + ([fold_passes(fuse_conv_bn_act)] if fold else [])
    seen, problems = set(), []
    for passes in variants:
        g = copy.deepcopy(graph)
        run_passes(g, passes)
        for p in analyse(g):
            if p not in seen:
                seen.add(p)
                problems.append(p)
    return problems


def convert_graph(graph: Graph, class_name: str, source: str, sha: str, recipe_name: str) -> GeneratedNetwork:
    """Analyse every node, then generate code; raises UnsupportedOpsError listing all problems."""
    problems = analyse(graph)
    if problems:
        raise UnsupportedOpsError(format_problems(problems, source, graph.opset), problems)
    header = header_for(class_name, source, sha, graph.opset, recipe_name, CONVENTIONS)
    return CodeBuilder(graph, class_name).build(header)


def generate_network(ctx, out: Path, passes: list[Pass], tag: str):
    """The recipe's ONNX through ``passes`` into ``out``/network.py + network.ckpt +
    tensor_map.json + conversion.json, then built and run on the reference inputs in PyNative."""
    from torch2ms import msutil
    from torch2ms.pipeline.stage import StageOutput
    from torch2ms.pipeline.workspace import atomic_write_text, sha256_file, write_json

    onnx_path = ctx.artifact("model.onnx")
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
