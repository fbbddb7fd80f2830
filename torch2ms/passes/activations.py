"""Activations the exporter writes out as several nodes, put back together as one node.

PyTorch's TorchScript exporter has no ONNX op for most modern activations at the opsets it
targets, so it writes their formula:

    SiLU       x * Sigmoid(x)                                   (every opset; ONNX has no SiLU)
    GELU       Div(x, sqrt2) -> Erf -> Add 1 -> Mul x -> Mul 0.5 (below opset 20)
    GELU tanh  0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    Mish       x * Tanh(Softplus(x))                            (ONNX Mish only from opset 18)
    HardSwish  x * HardSigmoid(x)                               (below opset 14)

and hand-written modules spell HardSigmoid / HardSwish as ``Clip(x + 3, 0, 6) / 6`` and
``x * Clip(x + 3, 0, 6) / 6`` (``F.relu6`` and ``F.hardtanh(x + 3, 0, 6)`` both export as
``Clip(0, 6)``). Each pattern here becomes one node: a standard ONNX op where one exists at
every supported opset (HardSigmoid), otherwise a ``torch2ms``-domain node (``Silu``, ``Gelu``
with ``approximate``, ``Mish``, ``HardSwish``) converted by ``converters/fused.py`` into one
MindSpore call, and recognised by the Conv/Dense fusions as an activation the fused cell can
apply.

A pattern fires only when it is the whole formula of one tensor ``x``: every intermediate is
used only inside the pattern (a second consumer of the sigmoid, say, would lose its value),
and every place the formula reads ``x`` reads the same tensor. Constants are compared in
float32 (``sqrt(2) = 1.4142135``, ``1/6 = 0.16666667``).

``activation_of`` says whether a node is an activation nn.Conv2dBnAct / nn.Dense can apply
itself, and if it is one that they cannot (ELU with alpha != 1: MindSpore's Elu kernel refuses
any other alpha), why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass, remove_node, replace_node, topological
from torch2ms.passes.match import ONNX, float_const, producer_of

# Activation kinds the fused cells (nn.Conv2dBnAct, nn.DenseBnAct, nn.Dense) can apply, in the
# names the fused nodes carry.
CELL_KINDS = (
    "Relu",
    "Relu6",
    "Sigmoid",
    "Silu",
    "Gelu",
    "Mish",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Tanh",
    "LeakyRelu",
    "PRelu",
)
_SIMPLE = {"Relu", "Sigmoid", "Tanh", "HardSwish", "Silu", "Mish"}


@dataclass(frozen=True)
class Act:
    """An activation a fused cell applies: its kind, attributes and (PRelu) the slope tensor."""

    kind: str
    attrs: dict = field(default_factory=dict)
    slope: str = ""


def _close(a: float | None, b: float, rtol: float = 1e-6) -> bool:
    return a is not None and abs(a - b) <= rtol * abs(b)


def clip_bounds(graph: Graph, node: Node) -> tuple[float | None, float | None]:
    """Clip's (min, max); None for an open bound (opset 11+ inputs, or the opset 6 attributes)."""
    if len(node.inputs) == 1 and ("min" in node.attrs or "max" in node.attrs):
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        return (None if lo is None or lo <= -3.4e38 else lo, None if hi is None or hi >= 3.4e38 else hi)
    lo = float_const(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    hi = float_const(graph, node.inputs[2]) if len(node.inputs) > 2 else None
    return lo, hi


def activation_of(graph: Graph, node: Node) -> tuple[Act | None, str | None]:
    """``(Act, None)`` if a fused cell computes ``node`` exactly; ``(None, reason)`` for an
    activation it cannot; ``(None, None)`` when ``node`` is no activation."""
    op, domain = node.op_type, node.domain
    if domain not in ONNX and domain != "torch2ms":
        return None, None
    if op in _SIMPLE:
        return Act(op), None
    if op == "Clip":
        lo, hi = clip_bounds(graph, node)
        if lo == 0.0 and hi == 6.0:
            return Act("Relu6"), None
        if lo == 0.0 and hi is None:
            return Act("Relu"), None
        return None, None
    if op == "Gelu":
        return Act("Gelu", {"approximate": node.attrs.get("approximate", "none")}), None
    if op == "LeakyRelu":
        return Act("LeakyRelu", {"alpha": float(node.attrs.get("alpha", 0.01))}), None
    if op == "Elu":
        alpha = float(node.attrs.get("alpha", 1.0))
        if alpha != 1.0:
            return None, f"Elu alpha={alpha:g}: MindSpore's Elu kernel computes only alpha=1"
        return Act("Elu"), None
    if op == "HardSigmoid":
        alpha, beta = node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)
        if not (_close(alpha, 1 / 6) and _close(beta, 0.5)):
            return None, f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) is not nn.HSigmoid's (1/6, 1/2)"
        return Act("HardSigmoid"), None
    if op == "PRelu":
        if graph.const(node.inputs[1]) is None:
            return None, "PRelu slope is not a constant"
        return Act("PRelu", slope=node.inputs[1]), None
    return None, None


def per_channel_slope(graph: Graph, slope: str, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """PRelu's slope as one value per channel along ``axis`` of ``out_shape`` (what nn.PReLU
    holds), or None if it varies along another axis. ONNX broadcasts the slope from the right."""
    s = graph.const(slope)
    if s is None or s.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - s.ndim) + tuple(s.shape)
    channels = out_shape[axis]
    if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, channels):
        return None
    return np.asarray(s, np.float32).reshape(-1)


# --- pattern matching helpers -----------------------------------------------------------------


def _factors(graph: Graph, value: str, nodes: list[Node]) -> list[str]:
    """The factors of a product tree: ``value`` expanded through ``Mul`` nodes used only once
    (those join ``nodes``), so ``(x * 0.5) * y`` and ``x * (0.5 * y)`` read alike."""
    mul = producer_of(graph, value, "Mul")
    if mul is None or value in graph.outputs or graph.use_count(value) != 1 or len(mul.inputs) != 2:
        return [value]
    nodes.append(mul)
    return _factors(graph, mul.inputs[0], nodes) + _factors(graph, mul.inputs[1], nodes)


def _split_consts(graph: Graph, factors: list[str]) -> tuple[float, list[str]]:
    """(product of the one-element constant factors, the other factors)."""
    scale, rest = 1.0, []
    for f in factors:
        c = float_const(graph, f)
        if c is None:
            rest.append(f)
        else:
            scale *= c
    return scale, rest


def _scaled_product(graph: Graph, root: Node) -> tuple[float, list[str], list[Node]] | None:
    """``root`` as ``scale * f1 * f2 ...``: a Mul tree, or a Mul tree divided by a constant."""
    nodes = [root]
    if root.op_type == "Div":
        d = float_const(graph, root.inputs[1])
        if d is None or d == 0:
            return None
        scale, rest = _split_consts(graph, _factors(graph, root.inputs[0], nodes))
        return scale / d, rest, nodes
    if root.op_type == "Mul" and len(root.inputs) == 2:
        scale, rest = _split_consts(
            graph, _factors(graph, root.inputs[0], nodes) + _factors(graph, root.inputs[1], nodes)
        )
        return scale, rest, nodes
    return None


def _add_const(graph: Graph, value: str, c: float) -> tuple[str, Node] | None:
    """``value = Add(x, c)`` (either order): returns (x, the Add)."""
    add = producer_of(graph, value, "Add")
    if add is None or len(add.inputs) != 2:
        return None
    for i in (0, 1):
        if _close(float_const(graph, add.inputs[1 - i]), c) and float_const(graph, add.inputs[i]) is None:
            return add.inputs[i], add
    return None


def _divided(graph: Graph, value: str, d: float) -> tuple[str, Node] | None:
    """``value = x / d`` or ``x * (1/d)``: returns (x, the node)."""
    n = graph.producer(value) if value else None
    if n is None or n.domain not in ONNX or len(n.inputs) != 2:
        return None
    if n.op_type == "Div" and _close(float_const(graph, n.inputs[1]), d):
        return n.inputs[0], n
    if n.op_type == "Mul":
        for i in (0, 1):
            if _close(float_const(graph, n.inputs[1 - i]), 1 / d) and float_const(graph, n.inputs[i]) is None:
                return n.inputs[i], n
    return None


def _relu6_of_x_plus_3(graph: Graph, value: str) -> tuple[str, list[Node]] | None:
    """``value = Clip(x + 3, 0, 6)``: returns (x, [Clip, Add])."""
    clip = producer_of(graph, value, "Clip")
    if clip is None or clip_bounds(graph, clip) != (0.0, 6.0):
        return None
    inner = _add_const(graph, clip.inputs[0], 3.0)
    return (inner[0], [clip, inner[1]]) if inner else None


# --- the passes -------------------------------------------------------------------------------


@dataclass
class PatternMatch:
    """One formula: ``root`` computes it from ``x``; ``nodes`` are all its nodes; it becomes one
    ``domain.op_type`` node over ``[x] + extra`` (``extra``: constants such as a norm's weights)."""

    root: Node
    x: str
    nodes: list[Node]
    op_type: str
    domain: str = "torch2ms"
    attrs: dict = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)


class FormulaPattern(Pass):
    """Rewrites a written-out formula into one node. ``misses`` maps the input tensor of each
    formula that was recognised but left alone to ``(op type, reason)``; the Conv/Dense
    fusions read it to say why a block kept its activation outside."""

    def __init__(self) -> None:
        super().__init__()
        self.misses: dict[str, tuple[str, str]] = {}

    def apply(self, graph: Graph) -> int:
        self.misses = {}
        return super().apply(graph)

    def check(self, graph: Graph, m: PatternMatch) -> str | None:
        inside = {id(n) for n in m.nodes}
        for n in m.nodes:
            if n is m.root:
                continue
            out = n.outputs[0]
            others = [c for c in graph.consumers(out) if id(c) not in inside]
            if out in graph.outputs:
                reason = f"{n.op_type} output {out!r} is a graph output"
            elif others:
                reason = f"{n.op_type} output has {len(others) + 1} consumers"
            else:
                continue
            self.misses[m.x] = (m.op_type, reason)
            return reason
        return None

    def rewrite(self, graph: Graph, m: PatternMatch) -> None:
        fused = Node(
            name=m.root.name,
            op_type=m.op_type,
            domain=m.domain,
            inputs=[m.x] + m.extra,
            outputs=[m.root.outputs[0]],
            attrs=dict(m.attrs),
            origin=[o for n in topological(graph, m.nodes) for o in n.origin],
        )
        replace_node(graph, m.root, fused)
        for n in m.nodes:
            if n is not m.root:
                remove_node(graph, n)


class FuseSilu(FormulaPattern):
    """``x * Sigmoid(x)`` (either order) -> ``torch2ms.Silu(x)``."""

    name = "fuse_silu"

    def match(self, graph: Graph, node: Node):
        if (
            node.op_type != "Mul"
            or node.domain not in ONNX
            or len(node.inputs) != 2
            or node.inputs[0] == node.inputs[1]
        ):
            return None
        for i in (0, 1):
            sig = producer_of(graph, node.inputs[i], "Sigmoid")
            if sig is not None and sig.inputs[0] == node.inputs[1 - i]:
                return PatternMatch(node, sig.inputs[0], [node, sig], "Silu")
        return None


class FuseHardSigmoid(FormulaPattern):
    """``Clip(x + 3, 0, 6) / 6`` (or ``* (1/6)``) -> ``HardSigmoid(x, alpha=1/6, beta=1/2)``."""

    name = "fuse_hard_sigmoid"

    def match(self, graph: Graph, node: Node):
        if node.op_type not in ("Div", "Mul") or node.domain not in ONNX:
            return None
        p = _scaled_product(graph, node)
        if p is None or len(p[1]) != 1 or len(p[2]) != 1 or not _close(p[0], 1 / 6):
            return None
        r = _relu6_of_x_plus_3(graph, p[1][0])
        if r is None:
            return None
        return PatternMatch(node, r[0], [node] + r[1], "HardSigmoid", "", {"alpha": 1 / 6, "beta": 0.5})


class FuseHardSwish(FormulaPattern):
    """``x * HardSigmoid(x)`` with nn.Hardsigmoid's alpha/beta, and ``x * Clip(x + 3, 0, 6) / 6``
    in any order of the product -> ``torch2ms.HardSwish(x)``."""

    name = "fuse_hard_swish"

    def match(self, graph: Graph, node: Node):
        if node.op_type not in ("Div", "Mul") or node.domain not in ONNX:
            return None
        p = _scaled_product(graph, node)
        if p is None or len(p[1]) != 2:
            return None
        scale, (a, b), nodes = p
        for x, gate in ((a, b), (b, a)):
            hs = producer_of(graph, gate, "HardSigmoid")
            if hs is not None and _close(scale, 1.0) and hs.inputs[0] == x:
                act, _ = activation_of(graph, hs)
                if act is not None:
                    return PatternMatch(node, x, nodes + [hs], "HardSwish")
            r = _relu6_of_x_plus_3(graph, gate)
            if r is not None and _close(scale, 1 / 6) and r[0] == x:
                return PatternMatch(node, x, nodes + r[1], "HardSwish")
        return None


class FuseMish(FormulaPattern):
    """``x * Tanh(Softplus(x))`` (either order) -> ``torch2ms.Mish(x)``."""

    name = "fuse_mish"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Mul" or node.domain not in ONNX or len(node.inputs) != 2:
            return None
        for i in (0, 1):
            tanh = producer_of(graph, node.inputs[i], "Tanh")
            sp = producer_of(graph, tanh.inputs[0], "Softplus") if tanh is not None else None
            if sp is not None and sp.inputs[0] == node.inputs[1 - i]:
                return PatternMatch(node, sp.inputs[0], [node, tanh, sp], "Mish")
        return None


_SQRT2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class FuseGelu(FormulaPattern):
    """GELU written out, in any order of its products -> ``torch2ms.Gelu(x, approximate=...)``.

    erf:  ``0.5 * x * (1 + Erf(x / sqrt2))``                       approximate='none'
    tanh: ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` approximate='tanh'
    (``x^3`` as ``x * x * x`` or ``Pow(x, 3)``; ``x / sqrt2`` as ``x * (1/sqrt2)``).
    """

    name = "fuse_gelu"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Mul" or node.domain not in ONNX:
            return None
        p = _scaled_product(graph, node)
        if p is None or len(p[1]) != 2 or not _close(p[0], 0.5):
            return None
        _, (a, b), nodes = p
        for x, gate in ((a, b), (b, a)):
            one_plus = _add_const(graph, gate, 1.0)
            if one_plus is None:
                continue
            inner, add = one_plus
            erf = producer_of(graph, inner, "Erf")
            if erf is not None:
                d = _divided(graph, erf.inputs[0], _SQRT2)
                if d is not None and d[0] == x:
                    return PatternMatch(node, x, nodes + [add, erf, d[1]], "Gelu", attrs={"approximate": "none"})
            tanh = producer_of(graph, inner, "Tanh")
            if tanh is not None:
                poly = self._tanh_argument(graph, tanh.inputs[0], x)
                if poly is not None:
                    return PatternMatch(node, x, nodes + [add, tanh] + poly, "Gelu", attrs={"approximate": "tanh"})
        return None

    @staticmethod
    def _tanh_argument(graph: Graph, value: str, x: str) -> list[Node] | None:
        """Nodes of ``sqrt(2/pi) * (x + 0.044715 * x^3)`` computing ``value`` from ``x``, or None."""
        outer = producer_of(graph, value, "Mul")
        if outer is None:
            return None
        p = _scaled_product(graph, outer)
        if p is None or len(p[1]) != 1 or not _close(p[0], _SQRT_2_OVER_PI):
            return None
        nodes = p[2]
        s = graph.producer(p[1][0])
        if s is None or s.op_type != "Add" or s.domain not in ONNX or x not in s.inputs or len(s.inputs) != 2:
            return None
        cube = s.inputs[1] if s.inputs[0] == x else s.inputs[0]
        nodes.append(s)
        c = producer_of(graph, cube, "Mul")
        if c is None:
            return None
        p = _scaled_product(graph, c)
        if p is None or not _close(p[0], 0.044715, 1e-5):
            return None
        factors, nodes = p[1], nodes + p[2]
        if len(factors) == 1:
            pw = producer_of(graph, factors[0], "Pow")
            if pw is None or pw.inputs[0] != x or float_const(graph, pw.inputs[1]) != 3.0:
                return None
            return nodes + [pw]
        return nodes if factors == [x, x, x] else None


def activation_passes() -> list[FormulaPattern]:
    """In order: HardSigmoid before HardSwish (``x * (Clip(x+3, 0, 6) / 6)`` is x * HardSigmoid)."""
    return [FuseHardSigmoid(), FuseHardSwish(), FuseSilu(), FuseGelu(), FuseMish()]
