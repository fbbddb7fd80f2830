"""Load an ONNX model into the IR with static shapes, folding shape arithmetic away.

The TorchScript exporter emits shape arithmetic even for static inputs (Shape -> Gather ->
Concat -> Resize sizes; swin_t alone has ~470 Shape nodes). With the input shapes fixed by the
recipe, every node whose inputs are all constant (initializers, ``Constant`` nodes, ``Shape``
of a tensor of known shape) is constant too. One onnxruntime run of the model, extended to
output the shape of every tensor and the value of every constant one, gives both the static
shapes and the folded values; the constant nodes then leave the graph, so the generated
MindSpore code only contains real computation.

Why onnxruntime and not ONNX's own shape inference, which is cheaper: the inference gets some
shapes wrong where onnxruntime and PyTorch agree (ceil-mode pooling whose last window starts in
the padding, onesided DFT/STFT), accepts graphs onnxruntime cannot run, and a load at a second
batch size needs the run, since it is what shows the model takes the size
(``torch2ms.codegen.batch``). The comparison: benchmarks/results/design_measurements.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import torch2ms.graph.onnxrt as onnxrt
from torch2ms.errors import OnnxError
from torch2ms.graph.ir import Graph, Node, Value
from torch2ms.graph.scopes import module_scopes
from torch2ms.graph.validate import _MINDSPORE_NUMPY, _NONDETERMINISTIC, DEFAULT_DOMAINS, _attr_value, check_model
from torch2ms.runtime.memory import release_freed


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


def load_onnx(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None, fold: bool = True) -> Graph:
    model = read_onnx(path)
    from torch2ms.graph.custom import embed_references

    embed_references(model)  # a plugin's custom op, as onnxruntime runs it for the shapes (graph.custom)
    opset = check_model(model, str(path))
    return graph_from_model(model, opset, input_shapes, fold=fold, source=str(path), own_model=True)


def graph_from_model(
    model: onnx.ModelProto,
    opset: int,
    input_shapes=None,
    fold: bool = True,
    source: str = "model",
    input_values: dict[str, np.ndarray] | None = None,
    own_model: bool = False,
) -> Graph:
    """The IR of ``model`` (checked with ``check_model`` first by ``load_onnx``).

    ``input_values``: sample data for the graph inputs to infer shapes with; by default
    placeholders (zeros; ones for integer inputs). ``own_model``: the caller drops ``model``
    afterwards, so its large weights move into the graph's arrays instead of being copied
    (``_take_weights``), and ``model`` is left without them."""
    g = model.graph
    taken = _take_weights(g) if own_model else {}
    inits = {t.name: taken[t.name] if t.name in taken else numpy_helper.to_array(t) for t in g.initializer}
    values: dict[str, Value] = {name: Value(name, tuple(a.shape), a.dtype, a) for name, a in inits.items()}
    inputs = []
    for vi in g.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        if input_shapes and vi.name in input_shapes:
            shape = tuple(input_shapes[vi.name])
        elif input_values and vi.name in input_values:
            shape = tuple(np.shape(input_values[vi.name]))
        else:
            shape = tuple(dims)
        if any(d is None or d < 0 for d in shape):
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
    graph.scopes = module_scopes(g)
    if fold:
        _infer_and_fold(model, graph, source, input_values, taken)
    return graph


# element types whose raw_data is the array's own little-endian bytes (numpy_helper.to_array
# unpacks the others: bfloat16, float8, int4, strings)
_PLAIN = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}


def _take_weights(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Each initializer of ``onnxrt.EXTERNAL_TENSOR`` bytes or more as a read-only array over its bytes,
    which leave the proto: the model and the graph held every weight twice."""
    taken = {}
    for t in g.initializer:
        plain = t.data_type in _PLAIN and t.data_location != onnx.TensorProto.EXTERNAL and t.HasField("raw_data")
        if not plain or onnxrt.tensor_nbytes(t) < onnxrt.EXTERNAL_TENSOR:
            continue
        raw = t.raw_data
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        taken[t.name] = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(tuple(t.dims))
        t.ClearField("raw_data")
    return taken


def _constant_nodes(graph: Graph) -> list[Node]:
    const = {k for k, v in graph.values.items() if v.is_const}
    out = []
    for n in graph.nodes:
        if n.domain not in DEFAULT_DOMAINS or n.op_type in _NONDETERMINISTIC:
            continue
        real_inputs = [i for i in n.inputs if i]
        # Shape needs only the (static) shape; CastLike takes only the dtype of its second input.
        shape_only = n.op_type == "Shape" or (n.op_type == "CastLike" and real_inputs[0] in const)
        if shape_only or all(i in const for i in real_inputs):
            out.append(n)
            const.update(n.outputs)
    return out


def session_with_outputs(
    model: onnx.ModelProto,
    outputs: list[str],
    extra_nodes: list[onnx.NodeProto] = (),
    purpose=None,
    weights: dict[str, np.ndarray] | None = None,
):
    """onnxruntime on a copy of ``model`` whose graph outputs are ``outputs``: any tensor names,
    intermediate ones included, computed by the model or by ``extra_nodes`` appended to it. Its
    options are ``purpose``'s (``graph.onnxrt``): SHAPES unless given (``diff`` runs REFERENCE).
    ``weights``: the data of initializers ``_take_weights`` took out of ``model``."""
    # ``model`` itself, its outputs swapped for the serialization and put back: a CopyFrom would
    # hold the weights once more while onnxruntime reads them
    kept_outputs = list(model.graph.output)
    n_nodes = len(model.graph.node)
    op_types = {n.op_type for n in model.graph.node}
    try:
        del model.graph.output[:]
        model.graph.node.extend(extra_nodes)
        model.graph.output.extend(helper.ValueInfoProto(name=name) for name in outputs)
        return onnxrt.session(model, purpose or onnxrt.SHAPES, op_types, weights=weights)
    finally:
        del model.graph.output[:]
        model.graph.output.extend(kept_outputs)
        del model.graph.node[n_nodes:]


# Weights above this make a graph load hand the memory its onnxruntime run freed back to the system.
RELEASE_ABOVE_BYTES = 64 << 20


def _infer_and_fold(model: onnx.ModelProto, graph: Graph, source: str, input_values=None, weights=None) -> None:
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
    why = "onnxruntime (which torch2ms runs to infer static shapes and fold constants)"
    model = _relaxed(model, {name: graph.values[name].shape for name in graph.inputs})
    try:
        sess = session_with_outputs(model, [w[2] for w in wanted], shape_nodes, weights=weights)
    except Exception as err:
        raise OnnxError(f"{source}: {why} cannot load the model: {_first_line(err)}") from None
    # Only shapes are read from this run. Integer inputs are ones, not zeros: an integer Div or Mod
    # by an input fails in onnxruntime on zeros ("Integer division by zero").
    feeds = {}
    for name in graph.inputs:
        v = graph.values[name]
        if input_values is not None and name in input_values:
            feeds[name] = np.asarray(input_values[name], v.dtype).reshape(v.shape)
        else:
            feeds[name] = (np.ones if v.dtype.kind in "iu" else np.zeros)(v.shape, v.dtype)
    names = [w[2] for w in wanted]
    try:
        results = dict(zip(names, sess.run(names, feeds))) if names else {}
    except Exception as err:
        placeholders = [n for n in graph.inputs if input_values is None or n not in input_values]
        raise OnnxError(
            f"{source}: {why} fails on "
            + (
                f"placeholder values for {', '.join(map(repr, placeholders))} (zeros; ones for integers)"
                if placeholders
                else "the sample inputs"
            )
            + f": {_first_line(err)}",
            hint="an input that sets a shape, an index or a count must be a constant (an initializer) of the ONNX",
        ) from None
    # the session holds a copy of every weight and what its run freed: gone before shape inference
    # copies the model again. Only worth it for a large model: the garbage collection costs most of
    # a small graph's load in a process that imported torch and MindSpore (design_measurements.md).
    del sess
    if sum(onnxrt.tensor_nbytes(t) for t in model.graph.initializer) > RELEASE_ABOVE_BYTES:
        release_freed()
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
    lacking = []
    for name, v in graph.values.items():
        if v.dtype is not None and np.dtype(v.dtype).name not in _MINDSPORE_NUMPY:
            producer = graph.producer(name)
            where = f"{producer.op_type} output {name!r}" if producer else repr(name)
            lacking.append(f"{where} ({np.dtype(v.dtype).name})")
    if lacking:
        raise OnnxError(
            f"{source}: MindSpore has no tensor type for " + "; ".join(lacking),
            hint="MindSpore tensors are float16/32/64, bfloat16, (u)int8/16/32/64 or bool",
        )


def _relaxed(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``model`` with the input dimensions that ``shapes`` overrides made symbolic, so onnxruntime
    takes inputs of another size than the export's (the graph at a second batch size: see
    ``torch2ms.codegen.batch``); the inferred shapes it keeps (value_info) are dropped with them."""

    def differs(vi) -> bool:
        shape, dims = shapes.get(vi.name), vi.type.tensor_type.shape.dim
        return (
            shape is not None
            and len(dims) == len(shape)
            and any(d.HasField("dim_value") and d.dim_value != want for d, want in zip(dims, shape))
        )

    if not any(differs(vi) for vi in model.graph.input):
        return model  # no copy of the weights when nothing changes
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if not differs(vi):
            continue
        for k, (d, want) in enumerate(zip(vi.type.tensor_type.shape.dim, shapes[vi.name])):
            if d.HasField("dim_value") and d.dim_value != want:
                d.dim_param = f"{vi.name}_dim{k}"
    del m.graph.value_info[:]
    for vi in m.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return m


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    for prefix in ("[ONNXRuntimeError] : ",):
        text = text.replace(prefix, "")
    return (text.splitlines() or [type(err).__name__])[0][:400]


def _inferred_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_large_initializers(model))
    except Exception:
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        et = vi.type.tensor_type.elem_type
        if et:
            out[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
    return out


def _without_large_initializers(model: onnx.ModelProto, limit: int = 1 << 16) -> onnx.ModelProto:
    """A copy of ``model`` for dtype inference: initializers over ``limit`` bytes become graph
    inputs of the same dtype and shape (their values decide no dtype), the small ones (shapes,
    axes, scalars) stay. ``infer_shapes`` serializes its argument and parses the result back, which
    on the whole model held the weights three more times."""
    m = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(m, field, getattr(model, field))
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    g, src = m.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        if t.ByteSize() <= limit:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m
