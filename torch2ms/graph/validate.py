"""What torch2ms can take from an ONNX model, refused by name before anything runs.

``check_model`` refuses, so that no model reaches onnxruntime or numpy only to fail there:

- an opset outside ``SUPPORTED_OPSETS``. A model stamped with a newer opset is accepted when
  none of its ops changed after the newest supported one other than by admitting more element
  types (same inputs, outputs, attributes and specification text: Reshape-25 adds int2/uint2 to
  Reshape-23), so its nodes mean what they mean at that opset; otherwise the ops that changed are
  named;
- nodes of a domain other than the default ONNX one (``ai.onnx.ml``, training, vendor ops);
- a dtype MindSpore has no tensor type for (float8, int4/uint4, string, complex, ...) on a graph
  input or output, an initializer, a tensor attribute (``Constant``'s value) or a dtype attribute
  (``Cast(to=...)``); after inference, on any tensor of the graph;
- sequence, optional, map and sparse values (MindSpore code takes tensors);
- a dynamic input shape (a zero-size dimension is static: empty tensors are let through).
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from torch2ms.errors import OnnxError

# 11 ... 23. 23 is the newest opset the TorchScript exporter of the installed torch (2.14) writes;
# onnxruntime 1.32 runs up to 28.
SUPPORTED_OPSETS = range(11, 24)
DEFAULT_DOMAINS = ("", "ai.onnx")
# The ONNX element types MindSpore has a tensor type for (converters.api.MS_DTYPES has the same set).
MINDSPORE_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
}
_MINDSPORE_NUMPY = set(MINDSPORE_TYPES.values())
# INT attributes that name a dtype (the op's output type), by attribute name.
_DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype", "output_datatype")
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


def model_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in DEFAULT_DOMAINS:
            return int(o.version)
    domains = sorted({o.domain for o in model.opset_import})
    raise OnnxError(
        f"the model imports no default-domain opset (only {', '.join(map(repr, domains)) or 'none'})",
        hint="torch2ms converts ops of the default ONNX domain",
    )


def type_name(elem_type: int) -> str:
    """``float8e4m3fn``, ``int4``, ``string``: the ONNX name of an element type, lower case."""
    try:
        return onnx.TensorProto.DataType.Name(int(elem_type)).lower()
    except ValueError:
        return f"type {int(elem_type)}"


def check_model(model: onnx.ModelProto, source: str = "model") -> int:
    """The model's default-domain opset, once it is known torch2ms can take the model at all
    (opset, domains, dtypes, value kinds); raises ``OnnxError`` naming what it cannot."""
    opset = model_opset(model)
    nodes = list(_all_nodes(model.graph))
    lo, hi = SUPPORTED_OPSETS.start, SUPPORTED_OPSETS.stop - 1
    hint = f"re-export with opset_version between {lo} and {hi} (recipe field export.opset)"
    if opset < lo:
        raise OnnxError(f"{source}: opset {opset} is outside the supported range {lo}-{hi}", hint=hint)
    if opset > hi:
        changed = _changed_after(nodes, opset, hi)
        if changed:
            raise OnnxError(
                f"{source}: opset {opset} is outside the supported range {lo}-{hi}, and "
                + ", ".join(f"{op} (opset {v})" for op, v in changed)
                + f" changed after opset {hi}",
                hint=hint,
            )
    foreign: dict[str, list[str]] = {}
    # a custom op a plugin declared reaches here with its reference as a model-local function (graph.custom)
    local = {(f.domain, f.name) for f in model.functions}
    for n in nodes:
        if n.domain not in DEFAULT_DOMAINS and (n.domain, n.op_type) not in local:
            ops = foreign.setdefault(n.domain, [])
            if n.op_type not in ops:
                ops.append(n.op_type)
    if foreign:
        listed = "; ".join(f"domain {d!r}: {', '.join(ops)}" for d, ops in sorted(foreign.items()))
        from torch2ms.graph.custom import declared

        raise OnnxError(
            f"{source}: ops outside the default ONNX domain cannot be converted ({listed})" + declared(),
            hint="torch2ms converts ops of the default ONNX domain, and a custom op a converter plugin (recipe "
            "field converters) gives a reference for (docs/custom_ops.md)",
        )
    problems = _dtype_problems(model.graph, nodes)
    if problems:
        raise OnnxError(
            f"{source}: MindSpore has no tensor type for " + "; ".join(problems),
            hint="MindSpore tensors are float16/32/64, bfloat16, (u)int8/16/32/64 or bool",
        )
    return opset


def _all_nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def _changed_after(nodes, opset: int, newest: int) -> list[tuple[str, int]]:
    """Default-domain op types whose schema at ``opset`` differs from the one at ``newest`` by
    more than admitting new element types (same inputs, outputs, attributes and text)."""
    out = []
    for n in nodes:
        if n.domain not in DEFAULT_DOMAINS:
            continue
        try:
            now = onnx.defs.get_schema(n.op_type, opset, "")
            then = onnx.defs.get_schema(n.op_type, newest, "")
        except Exception:  # unknown, or new after ``newest``: the converters say "no converter"
            continue
        if (
            now.since_version > newest
            and not _only_admits_types(then, now)
            and (n.op_type, now.since_version) not in out
        ):
            out.append((n.op_type, now.since_version))
    return out


def _only_admits_types(old: onnx.defs.OpSchema, new: onnx.defs.OpSchema) -> bool:
    """``new`` is ``old`` with more element types allowed, and nothing else changed."""

    def signature(s):
        return (
            [(i.name, i.option, i.type_str) for i in s.inputs],
            [(o.name, o.option, o.type_str) for o in s.outputs],
            sorted((a.name, int(a.type), a.required, str(a.default_value)) for a in s.attributes.values()),
            s.doc,
        )

    if signature(old) != signature(new):
        return False
    before = {t.type_param_str: set(t.allowed_type_strs) for t in old.type_constraints}
    after = {t.type_param_str: set(t.allowed_type_strs) for t in new.type_constraints}
    return before.keys() == after.keys() and all(before[k] <= after[k] for k in before) and before != after


def _value_kind_problem(vi: onnx.ValueInfoProto, what: str) -> str | None:
    t = vi.type
    kind = t.WhichOneof("value")
    if kind is None:  # no type given (an output left to inference)
        return None
    if kind != "tensor_type":
        names = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map"}
        return f"{what} {vi.name!r} is {names.get(kind, kind)} value (MindSpore code takes tensors)"
    et = t.tensor_type.elem_type
    if et and et not in MINDSPORE_TYPES:
        return f"{what} {vi.name!r} ({type_name(et)})"
    return None


def _dtype_problems(graph: onnx.GraphProto, nodes) -> list[str]:
    problems = []
    for vi in graph.input:
        problems.append(_value_kind_problem(vi, "input"))
    for vi in graph.output:
        problems.append(_value_kind_problem(vi, "output"))
    for t in graph.initializer:
        if t.data_type not in MINDSPORE_TYPES:
            problems.append(f"initializer {t.name!r} ({type_name(t.data_type)})")
    if graph.sparse_initializer:
        problems.append(f"sparse initializer {graph.sparse_initializer[0].values.name!r}")
    for n in nodes:
        where = f"{n.op_type} node {n.name!r}" if n.name else f"{n.op_type} node"
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type not in MINDSPORE_TYPES:
                problems.append(f"attribute {a.name!r} of {where} ({type_name(a.t.data_type)})")
            elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
                problems.append(f"attribute {a.name!r} of {where} (a sparse tensor)")
            elif a.type in (onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS) and a.name.startswith("value_"):
                problems.append(f"attribute {a.name!r} of {where} (string)")
            elif (
                a.type == onnx.AttributeProto.INT
                and a.name in _DTYPE_ATTRIBUTES
                and n.domain in DEFAULT_DOMAINS
                and a.i not in MINDSPORE_TYPES
            ):
                problems.append(f"attribute {a.name}={type_name(a.i)} of {where}")
    seen, out = set(), []
    for p in problems:
        if p and p not in seen:
            seen.add(p)
            out.append(p)
    return out
