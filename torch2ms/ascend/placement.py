"""Place every op of a network on the Ascend 310: AI Core, AI CPU or unsupported.

Each node of the deployed graph (the fold stage's IR, after its passes) is run through its
converter with a recording sink, as ``torch2ms check`` does, so what is placed is exactly the
MindSpore code the stage writes: the calls in the node's expression (``ops.*``, operators,
subscripts), the layers it declares (``nn.*`` with their keyword arguments) and the module-level
helpers it defines. Each call is lowered to CANN ops (``lowering.py``) and each CANN op placed
for the packaged precision (``table.py``). A node runs where its slowest op runs.

Nothing here runs on a board: the placement is what the op lists say, the ATC / converter_lite
log on the board is authoritative.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from torch2ms.ascend.lowering import NOT_EMITTED, Site, lower
from torch2ms.ascend.table import AI_CORE, AI_CPU, NONE, UNSUPPORTED, Where, place
from torch2ms.converters.api import DrySink, Emitter, Unsupported
from torch2ms.converters.registry import call_converter, lookup
from torch2ms.graph.ir import Graph, Node
from torch2ms.graph.names import module_path

UNKNOWN = "unknown"
RANK = {NONE: 0, AI_CORE: 1, AI_CPU: 2, UNSUPPORTED: 3, UNKNOWN: 4}
_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.MatMult: "@",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
}
_CMPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class RecordingSink(DrySink):
    """A dry sink that keeps the layers (callee, args, kwargs) and helper sources a converter declares."""

    def __init__(self) -> None:
        self.layers: dict[str, tuple[str, tuple, dict]] = {}
        self.defined: list[str] = []

    def add_layer(self, node, callee, args, kwargs, params) -> str:
        name = f"layer{len(self.layers)}"
        self.layers[name] = (callee, tuple(args), dict(kwargs))
        return name

    def define(self, name: str, source: str) -> str:
        self.defined.append(source)
        return name


def _value(node: ast.AST):
    """A literal argument's value (``float("-inf")`` included), or None."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" and node.args:
        try:
            return float(ast.literal_eval(node.args[0]))
        except (ValueError, SyntaxError, TypeError):
            return None
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_scalar(node: ast.AST) -> bool:
    """Python arithmetic on constants only (``2 * 3 + -1``): evaluated in Python, runs nowhere."""
    return not any(isinstance(n, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)) for n in ast.walk(node))


def calls_in(source: str, layers: dict[str, tuple[str, tuple, dict]]) -> list[tuple[str, dict, tuple]]:
    """(name, literal kwargs, literal args) of every device call in ``source`` (an expression or module)."""
    try:
        tree = ast.parse(source.strip(), mode="eval" if "\n" not in source.strip() else "exec")
    except SyntaxError:
        tree = ast.parse(source, mode="exec")
    found: list[tuple[str, dict, tuple]] = []
    constructors: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            if id(n) in constructors:
                continue
            func = n.func
            kw = {k.arg: _value(k.value) for k in n.keywords if k.arg}
            args = tuple(_value(a) for a in n.args)
            if isinstance(func, ast.Call):  # ops.Primitive(attrs)(inputs)
                constructors.add(id(func))
                name = _dotted(func.func)
                kw = {k.arg: _value(k.value) for k in func.keywords if k.arg} | kw
            else:
                name = _dotted(func)
            if name is None:
                continue
            if name.startswith("self."):
                layer = layers.get(name.split(".", 1)[1])
                # a layer of a helper class the node defines (OnnxLSTM) is placed from that class's source
                if layer is not None and layer[0].split(".")[0] in ("ops", "nn"):
                    found.append((layer[0], layer[2], layer[1]))
                continue
            if name.split(".")[0] in ("ops", "nn", "P"):
                found.append((name, kw, args))
        elif isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Compare)) and _is_scalar(n):
            continue
        elif isinstance(n, ast.BinOp):
            found.append((_BINOPS.get(type(n.op), type(n.op).__name__), {}, ()))
        elif isinstance(n, ast.UnaryOp):
            if isinstance(n.op, ast.USub):
                found.append(("neg", {}, ()))
            elif isinstance(n.op, (ast.Invert, ast.Not)):
                found.append(("~", {}, ()))
        elif isinstance(n, ast.Compare):  # 'is None' / 'in' are Python-level tests, not tensor ops
            found += [(_CMPS[type(op)], {}, ()) for op in n.ops if type(op) in _CMPS]
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
            found.append(("getitem", {}, ()))
    return found


@dataclass
class OpPlacement:
    node: str  # the IR node's name
    module: str  # its PyTorch module path ('' when the exporter gave none)
    op_type: str  # the IR node's op type
    call: str  # the MindSpore call
    cann: str  # the CANN op
    where: Where


@dataclass
class NodeInfo:
    node: Node
    ops: list[OpPlacement] = field(default_factory=list)

    @property
    def placement(self) -> str:
        return max((o.where.placement for o in self.ops), key=RANK.__getitem__, default=NONE)


def node_dtype(graph: Graph, node: Node) -> str:
    """The dtype a node computes in: its first float input's, else its first input's, else its output's."""
    dts = [graph.values[i].dtype for i in node.inputs if i and graph.values.get(i) is not None]
    dts = [np.dtype(d) for d in dts if d is not None]
    for d in dts:
        if d.kind == "f":
            return d.name
    if dts:
        return dts[0].name
    outs = [graph.values[o].dtype for o in node.outputs if o and graph.values.get(o) is not None]
    return np.dtype(outs[0]).name if outs and outs[0] is not None else "float32"


def node_calls(graph: Graph, node: Node) -> list[tuple[str, dict, tuple]]:
    """The MindSpore calls ``node``'s converter emits (raises ``Unsupported`` like the converter)."""
    reg = lookup(node.op_type, graph.opset, node.domain)
    if reg is None:
        return []
    sink = RecordingSink()
    expr = call_converter(reg, Emitter(graph, node, sink), node)
    sources = [expr] if isinstance(expr, str) else [e for e in (expr or ()) if isinstance(e, str)]
    calls: list[tuple[str, dict, tuple]] = []
    for src in sources:
        calls += calls_in(src, sink.layers)
    for src in sink.defined:
        calls += calls_in(src, {})
    for _callee, _args, kwargs in sink.layers.values():
        for v in kwargs.values():  # an activation passed as a layer (nn.GELU(approximate=False))
            if not isinstance(v, (str, int, float, bool, tuple, list, type(None))):
                calls += calls_in(repr(v), {})
    return calls


def custom_placement(graph: Graph, node: Node, dtype: str, module: str) -> NodeInfo | None:
    """A node a converter plugin takes to a user AOT kernel (``torch2ms.custom.aot``): a custom op on
    AI Core when the plugin gives the kernel's Ascend implementation, else unsupported, saying what
    the user must supply; None for any other node."""
    from torch2ms.custom.aot import used_by

    reg = lookup(node.op_type, graph.opset, node.domain)
    if reg is None or reg.plugin is None:
        return None
    sink = RecordingSink()
    try:
        call_converter(reg, Emitter(graph, node, sink), node)
    except Unsupported:
        return None
    kernels = used_by("\n".join(sink.defined))
    if not kernels:
        return None
    info = NodeInfo(node)
    for k in kernels:
        if k.ascend is not None:
            where = Where(AI_CORE, dtype, f"custom op: the user's {k.ascend.kind} kernel {k.ascend.source.name}")
        else:
            where = Where(
                UNSUPPORTED,
                dtype,
                f"custom op {k.function} (plugin {k.plugin}): a host CPU kernel only; supply its Ascend "
                "implementation (TBE or Ascend C source and op-info) as AotKernel(ascend=AscendKernel(...))",
            )
        info.ops.append(OpPlacement(node.name, module, node.op_type, "ops.Custom", k.function, where))
    return info


def place_node(graph: Graph, node: Node, precision: str) -> NodeInfo:
    info = NodeInfo(node)
    dtype = node_dtype(graph, node)
    shapes = tuple(graph.values[i].shape if i and i in graph.values else None for i in node.inputs)
    dtypes = tuple(
        np.dtype(graph.values[i].dtype) if i and graph.values[i].dtype is not None else None
        for i in node.inputs
        if i in graph.values
    )
    module = ".".join(module_path(node.name))
    custom = custom_placement(graph, node, dtype, module)
    if custom is not None:
        return custom
    try:
        calls = node_calls(graph, node)
    except Unsupported as err:
        return NodeInfo(
            node, [OpPlacement(node.name, module, node.op_type, node.op_type, "?", Where(UNKNOWN, dtype, str(err)))]
        )
    for name, kw, args in calls:
        if name in NOT_EMITTED:
            continue
        cann = lower(name, Site(kw, args, shapes, dtypes))
        if cann is None:
            info.ops.append(
                OpPlacement(
                    node.name,
                    module,
                    node.op_type,
                    name,
                    "?",
                    Where(UNKNOWN, dtype, f"{name}: not in the lowering table"),
                )
            )
            continue
        for op in cann:
            info.ops.append(OpPlacement(node.name, module, node.op_type, name, op, place(op, dtype, precision)))
    return info


def place_graph(graph: Graph, precision: str = "fp16") -> list[NodeInfo]:
    """Every node of ``graph`` placed (nodes whose converter emits nothing are left out)."""
    infos = [place_node(graph, n, precision) for n in graph.nodes]
    return [i for i in infos if i.ops]


def summary(infos: list[NodeInfo]) -> dict:
    """Counts per placement (CANN ops), and the AI CPU / unsupported / unknown ops grouped by op and reason."""
    counts: Counter = Counter()
    slow: dict[tuple[str, str, str], list[OpPlacement]] = {}
    for info in infos:
        for o in info.ops:
            counts[o.where.placement] += 1
            if o.where.placement in (AI_CPU, UNSUPPORTED, UNKNOWN):
                slow.setdefault((o.where.placement, o.cann, o.where.reason), []).append(o)
    groups = [
        {
            "placement": p,
            "op": op,
            "reason": reason,
            "count": len(ops),
            "dtype": ops[0].where.dtype,
            "calls": sorted({o.call for o in ops}),
            "where": [o.module or o.node for o in ops],
        }
        for (p, op, reason), ops in sorted(slow.items(), key=lambda kv: (-RANK[kv[0][0]], kv[0][1]))
    ]
    return {
        "counts": {p: counts[p] for p in (AI_CORE, AI_CPU, UNSUPPORTED, UNKNOWN, NONE) if counts[p]},
        "ai_cpu_ops": counts[AI_CPU],
        "off_ai_core_ops": counts[AI_CPU] + counts[UNSUPPORTED] + counts[UNKNOWN],
        "off_ai_core": groups,
    }
