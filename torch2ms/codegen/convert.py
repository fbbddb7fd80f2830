"""From a loaded graph to generated code: can it be converted (``find_problems``), convert it
(``convert_graph``), and write a stage's ``network.py`` + checkpoint and run it
(``generate_network``). The rebuild and fold stages, ``check``, ``bench`` and the per-op tests
all go through here."""

from __future__ import annotations

import copy
from pathlib import Path

from torch2ms.codegen.batch import BatchDependent, BatchVariant, same_structure
from torch2ms.codegen.builder import CodeBuilder, GeneratedNetwork, class_name_for, header_for
from torch2ms.converters.api import Unsupported
from torch2ms.converters.registry import Problem, analyse, format_problems
from torch2ms.errors import OnnxError, UnsupportedOpsError
from torch2ms.graph.cache import onnx_graph
from torch2ms.graph.ir import Graph
from torch2ms.passes import Pass, fold_passes, fusion_counts, rebuild_passes, run_passes

# the stage record's ``extra`` key with the seconds of each PyNative call of the stage's check
PYNATIVE_CALLS = "pynative_call_s"
# the run cache's key: stage -> its network.py's PyNative outputs on the reference inputs
PYNATIVE_OUTPUTS = "pynative_outputs"

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


def convert_graph(
    graph: Graph,
    class_name: str,
    source: str,
    sha: str,
    recipe_name: str,
    batch: BatchVariant | None = None,
    batch_required: bool = False,
    layout: str = "flat",
    modules: dict[str, str] | None = None,
    roles: dict[str, dict] | None = None,
) -> GeneratedNetwork:
    """Analyse every node, then generate code; raises UnsupportedOpsError listing all problems.

        With ``batch`` (the graph at a second batch size) the sizes that carry the batch are written
        in terms of the input's (``torch2ms.codegen.batch``). Where that is impossible the code keeps
        static sizes and ``batch_note`` says why, or, with ``batch_required``, it is an error.
        ``layout``: ``flat`` or ``modules`` (``torch2ms.codegen.modules``; ``modules`` maps module
        paths to PyTorch class names, ``roles`` each class to the names its ``forward`` gives its values:
    ``torch2ms.export.roles``)."""
    problems = analyse(graph)
    if problems:
        from torch2ms.custom.plugins import refusal

        raise UnsupportedOpsError(refusal(format_problems(problems, source, graph.opset)), problems)
    header = header_for(class_name, source, sha, graph.opset, recipe_name, CONVENTIONS)
    if batch is None:
        return CodeBuilder(graph, class_name).build(header, layout, modules, roles)
    try:
        return CodeBuilder(graph, class_name, batch).build(header, layout, modules, roles)
    except BatchDependent as err:
        if batch_required:
            raise batch_error(source, str(err), batch.seq is not None) from None
        net = CodeBuilder(graph, class_name).build(header, layout, modules, roles)
        net.batch_note = str(err)
        return net


def batch_error(source: str, reason: str, sequence: bool = False) -> OnnxError:
    what, field = ("sizes (batch, sequence length)", "inputs[].sequence") if sequence else ("batch sizes", "")
    return OnnxError(
        f"{source}: the network cannot serve several {what}: {reason}",
        hint="compute sizes from the input (x.shape[0], torch.flatten) rather than writing the batch as a number, "
        + (f"or drop {field} / inputs[].batch" if sequence else "or drop inputs[].batch"),
    )


def batch_variant(ctx, onnx_path: Path, graph: Graph, passes: list[Pass]) -> tuple[BatchVariant | None, str | None]:
    """The recipe's ONNX loaded at batch ``shape[0] + 1`` (and, with a sequence-length profile, at
    length ``shape[1] + 1``) and run through ``passes``, to tell the sizes that carry the batch
    (and the length) from the others; ``(None, reason)`` when the model does not take another
    size (an error when the recipe lists batch sizes or lengths)."""
    recipe = ctx.recipe
    listed = recipe.batch_sizes()
    lengths = recipe.sequence_lengths()
    batched = [i for i in recipe.inputs if len(i.shape) > 1 and (len(i.batch_sizes()) > 1 or not listed)]
    if not batched:
        return None, "no input has a batch dimension"
    first = batched[0].shape[0]
    other = first + 1
    profiled = [i for i in recipe.inputs if i.sequence is not None]
    seq = profiled[0].shape[1] if profiled else None
    where = f"at batch {other}"
    try:
        if any(i.shape[0] != first for i in batched):
            raise BatchDependent(f"the inputs have different batch sizes ({[i.shape[0] for i in batched]})")
        second = None
        if seq is None or listed:  # a length profile alone keeps the batch static
            second = onnx_graph(ctx, onnx_path, {i.name: other for i in batched})
            run_passes(second, passes)
            same_structure(graph, second, first, other)
        seq_graphs = []
        # the other length: seq + 1, or seq - 1 when seq is the longest listed (a model may take no
        # longer input, e.g. CLIP's 77 positions)
        seq_other = None if seq is None else seq + 1 if seq < max(lengths) else seq - 1
        for b in ((first, other) if listed else (first,)) if seq is not None else ():
            where = f"at batch {b}, sequence length {seq_other}"
            g = onnx_graph(ctx, onnx_path, {i.name: b for i in batched}, {i.name: seq_other for i in profiled})
            run_passes(g, passes)
            same_structure(graph, g, first, b)
            seq_graphs.append(g)
        longest = None
        if seq is not None and max(lengths) > seq + 1:
            where = f"at sequence length {max(lengths)}"
            longest = onnx_graph(ctx, onnx_path, seq={i.name: max(lengths) for i in profiled})
            run_passes(longest, passes)
            same_structure(graph, longest, first, first)
    except (OnnxError, BatchDependent, Unsupported, ValueError) as err:  # a pass refusing the other shapes
        if listed or lengths:
            raise batch_error(onnx_path.name, f"{where}: {err}", lengths is not None) from None
        return None, f"{where}: {err}"
    if seq is None:
        return BatchVariant(second, first, other, batched[0].name), None
    return BatchVariant(
        second or seq_graphs[0],
        first,
        other,
        batched[0].name,
        seq,
        profiled[0].name,
        tuple(seq_graphs),
        batch_moves=bool(listed),
        longest=longest,
        seq_other=seq_other,
    ), None


def module_record(ctx) -> dict:
    """The export stage's modules.json (module classes, state_dict hashes); empty for an ONNX source."""
    import json

    path = ctx.artifact("modules.json")
    return json.loads(path.read_text()) if path.exists() else {}


def generate(ctx, onnx_path: Path, passes: list[Pass], sha: str | None = None):
    """``onnx_path`` through ``passes`` into generated code: (graph, passes fired, network, why the
    batch is static). ``sha``: the source hash the header names (default: ``onnx_path``'s)."""
    from torch2ms.pipeline.workspace import sha256_file

    graph = onnx_graph(ctx, onnx_path)
    fired = run_passes(graph, passes)
    batch, note = batch_variant(ctx, onnx_path, graph, passes)
    record = module_record(ctx)
    net = convert_graph(
        graph,
        record.get("root") or class_name_for(ctx.recipe.name),  # the PyTorch class, as mindcv names its networks
        "model.onnx",
        sha or sha256_file(onnx_path),
        ctx.recipe.name,
        batch,
        batch_required=ctx.recipe.batch_sizes() is not None or ctx.recipe.sequence_lengths() is not None,
        layout=ctx.recipe.rebuild.layout,
        modules=record.get("modules", {}),
        roles=record.get("roles", {}),
    )
    return graph, fired, net, note


def generate_network(ctx, out: Path, passes: list[Pass], tag: str):
    """The recipe's ONNX through ``passes`` into ``out``/network.py + network.ckpt +
    tensor_map.json + conversion.json (+ weight_map.json when the export recorded the state_dict),
    then built and run on the reference inputs in PyNative."""
    from torch2ms.codegen.weight_map import weight_map
    from torch2ms.pipeline.stage import StageOutput
    from torch2ms.pipeline.workspace import atomic_write_text, write_json
    from torch2ms.runtime import msutil

    onnx_path = ctx.artifact("model.onnx")
    graph, fired, net, note = generate(ctx, onnx_path, passes)
    record = module_record(ctx)
    if record.get("state_dict"):
        write_json(out / "weight_map.json", weight_map(onnx_path, record, net.params, net.param_origin))
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    atomic_write_text(out / "network.py", net.source)
    from torch2ms.custom import aot

    kernels = aot.install(net.source, out, aot.OPS)  # the user's AOT kernels, in kernels/ beside it
    # from_numpy shares the arrays' memory (ms.Tensor(v) would copy every weight once more)
    params = [{"name": k, "data": ms.Tensor.from_numpy(v)} for k, v in net.params.items()]
    ms.save_checkpoint(params, str(out / "network.ckpt"))
    n_params = len(net.params)
    del params
    net.params.clear()  # in the checkpoint now; the Cell below loads its own
    write_json(out / "tensor_map.json", net.tensor_map)
    cell = msutil.build_network(out, tag)
    inputs = ctx.reference_inputs()
    names = list(ctx.reference()[1][0])
    calls: list[float] = []
    outputs = msutil.run_cell(cell, inputs, names, calls)
    # what this network.py computes in PyNative on the reference inputs: a later stage's evidence
    # compares its compiled outputs with them (``divergence.evidence.for_compiled``) in this process
    ctx.cache.setdefault(PYNATIVE_OUTPUTS, {})[tag] = outputs
    layers = net.layer_counts
    counts = {
        "passes": fired,
        "conv2d_bn_act": layers.get("nn.Conv2dBnAct", 0),
        "conv3d_bn_act": layers.get("Conv3dBnAct", 0),  # the generated cell (MindSpore has no nn.Conv3dBnAct)
        "batchnorm_layers": sum(v for k, v in layers.items() if k.startswith("nn.BatchNorm")),
        "conv2d": layers.get("nn.Conv2d", 0),
        # Conv/Dense -> (BN) -> activation chains found and fused, by activation, what was left and why
        "fusion": fusion_counts(graph, passes),
        "graph_nodes": len(graph.nodes),
        "graph_ops": graph.op_counts(),
        "layers": layers,
        "parameters": n_params,
        # whether the code follows the input's batch (`batch = x.shape[0]`), or why it keeps static sizes
        "batch": {"follows_input": net.batch_source, "static_because": note or net.batch_note},
        # modules layout: the classes made, the modules kept inline in their parent and why
        "layout": net.layout,
        **({"custom_kernels": kernels} if kernels else {}),
    }
    write_json(out / "conversion.json", counts)
    # the check's PyNative calls, timed: the compile stage states its speedup against them
    return StageOutput(outputs, counts=counts, extra={PYNATIVE_CALLS: [round(t, 4) for t in calls]})
