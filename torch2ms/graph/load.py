"""Load an ONNX model into the IR with static shapes, folding shape arithmetic away.

The TorchScript exporter emits shape arithmetic even for static inputs (Shape -> Gather ->
Concat -> Resize sizes; swin_t alone has ~470 Shape nodes). With the input shapes fixed by the
recipe, every node whose inputs are all constant (initializers, ``Constant`` nodes, ``Shape``
of a tensor of known shape) is constant too. One onnxruntime run of the model, extended to
output the shape of every tensor and the value of every constant one, gives both the static
shapes and the folded values; the constant nodes then leave the graph, so the generated
MindSpore code only contains real computation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from torch2ms.errors import OnnxError
from torch2ms.graph.ir import Graph, Node, Value

SUPPORTED_OPSETS = range(11, 21)  # 11 ... 20
# Nodes never folded even when their inputs are constant (their value is not fixed).
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}


def _attr_value(attr: onnx.AttributeProto):
    v = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.STRING:
        return v.decode()
    if attr.type == onnx.AttributeProto.STRINGS:
        return [s.decode() for s in v]
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(v)
    if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(v)
    return v


def read_onnx(path: str | Path) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise OnnxError(f"{path}: file not found")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError and friends
        raise OnnxError(
            f"{path}: not a readable ONNX model ({type(err).__name__}: {err})",
            hint="is the file truncated? re-export it",
        ) from None
    if not model.graph.node and not model.graph.output:
        raise OnnxError(
            f"{path}: not an ONNX model (no graph in the file)", hint="pass a .onnx file written by torch.onnx.export"
        )
    return model


def model_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    raise OnnxError("the model imports no default-domain opset")


def load_onnx(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None, fold: bool = True) -> Graph:
    model = read_onnx(path)
    opset = model_opset(model)
    if opset not in SUPPORTED_OPSETS:
        lo, hi = SUPPORTED_OPSETS.start, SUPPORTED_OPSETS.stop - 1
        raise OnnxError(
            f"{path}: opset {opset} is outside the supported range {lo}-{hi}",
            hint=f"re-export with opset_version between {lo} and {hi} (recipe field export.opset)",
        )
    return graph_from_model(model, opset, input_shapes, fold=fold, source=str(path))


def graph_from_model(
    model: onnx.ModelProto, opset: int, input_shapes=None, fold: bool = True, source: str = "model"
) -> Graph:
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    values: dict[str, Value] = {name: Value(name, tuple(a.shape), a.dtype, a) for name, a in inits.items()}
    inputs = []
    for vi in g.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        shape = tuple(input_shapes[vi.name]) if input_shapes and vi.name in input_shapes else tuple(dims)
        if any(d is None or d <= 0 for d in shape):
            raise OnnxError(
                f"{source}: input {vi.name!r} has a dynamic shape {dims}",
                hint="give its static shape in the recipe's inputs",
            )
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        values[vi.name] = Value(vi.name, shape, dtype)
        inputs.append(vi.name)
    nodes = []
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        nodes.append(
            Node(
                name, n.op_type, list(n.input), list(n.output), {a.name: _attr_value(a) for a in n.attribute}, n.domain
            )
        )
        for o in n.output:
            values.setdefault(o, Value(o))
    graph = Graph(nodes, values, inputs, [o.name for o in g.output], opset, name=g.name or "network")
    if fold:
        _infer_and_fold(model, graph)
    return graph


def _constant_nodes(graph: Graph) -> list[Node]:
    const = {k for k, v in graph.values.items() if v.is_const}
    out = []
    for n in graph.nodes:
        if n.domain not in ("", "ai.onnx") or n.op_type in _NONDETERMINISTIC:
            continue
        real_inputs = [i for i in n.inputs if i]
        if n.op_type == "Shape" or all(i in const for i in real_inputs):
            out.append(n)
            const.update(n.outputs)
    return out


def session_with_outputs(model: onnx.ModelProto, outputs: list[str], extra_nodes: list[onnx.NodeProto] = ()):
    """onnxruntime (no graph optimizations) on a copy of ``model`` whose graph outputs are
    ``outputs``: any tensor names, intermediate ones included, computed by the model or by
    ``extra_nodes`` appended to it."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.node.extend(extra_nodes)
    m.graph.output.extend(helper.ValueInfoProto(name=name) for name in outputs)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _infer_and_fold(model: onnx.ModelProto, graph: Graph) -> None:
    """Fill every value's shape/dtype; fold constant nodes out of the graph."""
    const_nodes = _constant_nodes(graph)
    const_outputs = [o for n in const_nodes for o in n.outputs if o]
    dynamic = [o for n in graph.nodes if n not in const_nodes for o in n.outputs if o]
    wanted, shape_nodes = [], []
    for name in const_outputs:
        wanted.append(("value", name, name))
    for k, name in enumerate(dynamic):
        s = f"__t2ms_shape_{k}"
        shape_nodes.append(helper.make_node("Shape", [name], [s], name=f"__t2ms_shape_node_{k}"))
        wanted.append(("shape", name, s))
    try:
        sess = session_with_outputs(model, [w[2] for w in wanted], shape_nodes)
    except Exception as err:
        raise OnnxError(f"onnxruntime cannot load the model to infer shapes: {err}") from None
    # Only shapes are read from this run. Integer inputs are ones, not zeros: an integer Div or Mod
    # by an input fails in onnxruntime on zeros ("Integer division by zero").
    feeds = {
        name: (np.ones if graph.values[name].dtype.kind in "iu" else np.zeros)(
            graph.values[name].shape, graph.values[name].dtype
        )
        for name in graph.inputs
    }
    names = [w[2] for w in wanted]
    results = dict(zip(names, sess.run(names, feeds))) if names else {}
    dtypes = _inferred_dtypes(model)
    for kind, name, out in wanted:
        v = graph.values[name]
        if kind == "value":
            arr = np.asarray(results[out])
            v.const, v.shape, v.dtype = arr, tuple(arr.shape), arr.dtype
        else:
            v.shape = tuple(int(d) for d in results[out])
            v.dtype = dtypes.get(name, np.dtype(np.float32))
    folded = set(id(n) for n in const_nodes)
    graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    graph.remove_dead()


def _inferred_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        et = vi.type.tensor_type.elem_type
        if et:
            out[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
    return out
