"""Normalizations the exporter writes out, put back into one node each.

LayerNorm below opset 17 (ONNX LayerNormalization arrived in 17), and any hand-written one::

    mean = ReduceMean(x, axes)            d = Sub(x, mean)
    var  = ReduceMean(Pow(d, 2), axes)    (or Mul(d, d))
    y    = Div(d, Sqrt(Add(var, eps)))    (or Mul(d, Reciprocal(Sqrt(...))))
    y    = Add(Mul(y, gamma), beta)       (the affine part is optional; either operand order)

becomes ``torch2ms.LayerNormalization(x, gamma, beta; axis, epsilon)`` when ``axes`` are the
trailing axes (nn.LayerNorm normalizes from ``begin_norm_axis`` to the end) and gamma / beta
vary only along them.

GroupNorm, at every opset the TorchScript exporter targets::

    r = Reshape(x, (N, G, -1)) -> InstanceNormalization(r, ones(G), zeros(G), eps)
      -> Reshape(back to x's shape) -> Mul(gamma[C, 1, ...]) -> Add(beta[C, 1, ...])

becomes ``torch2ms.GroupNormalization(x, gamma, beta; num_groups, epsilon)``. Both are
converted by ``converters/fused.py`` into ``nn.LayerNorm`` / ``nn.GroupNorm`` holding the weights.

RMSNorm (Llama, T5; ONNX RMSNormalization arrived only in opset 23)::

    ms = ReduceMean(Pow(x, 2), trailing axes)       (or Mul(x, x))
    r  = Div(1, Sqrt(Add(ms, eps)))                 (or Reciprocal(Sqrt(...)))
    y  = Mul(x, r) [-> Mul(gamma)]                  (either operand order; Div(x, Sqrt(...)) too)

becomes ``torch2ms.RMSNormalization(x, gamma; axis, epsilon)``; a Cast to x's own dtype on the
way in or out (transformers computes RMSNorm "in float32") is dropped with it, unless another
node reads the cast input too (Llama's residual does: then the Cast stays before the norm). MindSpore 2.10 has
no RMSNorm cell and its ``ops.rms_norm`` kernel is Ascend-only (on CPU: "The kernel RmsNorm
unregistered"), so the converter writes the formula as one expression with ``ops.rsqrt``.
"""

from __future__ import annotations

import numpy as np

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.activations import FormulaPattern, PatternMatch
from torch2ms.passes.match import ONNX, float_const, producer_of


def _axes(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """ReduceMean's axes (attribute before opset 18, input from 18), normalized; None if unknown."""
    if node.attrs.get("keepdims", 1) != 1:
        return None
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        c = graph.const(node.inputs[1])
        axes = None if c is None else c.reshape(-1).tolist()
    rank = len(graph.values[node.inputs[0]].shape or ())
    if axes is None or not rank:
        return None
    return tuple(sorted(int(a) % rank for a in axes))


def _absorb(graph: Graph, last, op: str, shape, axes, nodes: list, default: np.ndarray):
    """The norm's ``op`` (Mul: gamma, Add: beta) by a constant along ``axes`` after ``last``, when
    there is one: (its constant, its node), the node appended to ``nodes``; else (``default``, ``last``)."""
    step = _affine_step(graph, last.outputs[0], op)
    value = _along(graph.const(step[1]), shape, axes) if step else None
    if value is None:
        return default, last
    nodes.append(step[0])
    return value, step[0]


def _affine_step(graph: Graph, value: str, op: str) -> tuple[Node, str] | None:
    """The single consumer of ``value`` if it is ``op(value, const)`` (either order): (node, const)."""
    if value in graph.outputs:
        return None
    users = graph.consumers(value)
    if len(users) != 1 or users[0].op_type != op or users[0].domain not in ONNX or len(users[0].inputs) != 2:
        return None
    n = users[0]
    other = n.inputs[1] if n.inputs[0] == value else n.inputs[0]
    if other == value or graph.const(other) is None or graph.const(other).dtype.kind != "f":
        return None
    return n, other


def _along(const: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray | None:
    """``const`` broadcast onto ``shape`` (ONNX broadcasting) as an array over ``axes`` only, or
    None if it varies along another axis or does not broadcast."""
    if const.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - const.ndim) + tuple(const.shape)
    if any(d != 1 and (i not in axes or d != shape[i]) for i, d in enumerate(full)):
        return None
    c = np.broadcast_to(const.reshape(full), tuple(shape[i] if i in axes else 1 for i in range(len(shape))))
    return np.ascontiguousarray(c.reshape(tuple(shape[i] for i in axes)), dtype=np.float32)


class NormPattern(FormulaPattern):
    """A norm formula whose match carries its constants as ``m.extra`` (role, array): they become graph
    constants named after the module the pattern sits in and their role
    (``/model/layers.0/input_layernorm/gamma``), not after the node that ended the pattern, so the
    class a module becomes stores ``self.gamma`` in every instance."""

    def rewrite(self, graph: Graph, m: PatternMatch) -> None:
        name = m.root.name
        scope = name.rsplit("/", 1)[0] + "/" if "/" in name else f"{name}_"
        m.extra = [graph.add_const(scope + role, a) for role, a in m.extra]
        super().rewrite(graph, m)


class FuseLayerNorm(NormPattern):
    name = "fuse_layer_norm"

    def match(self, graph: Graph, node: Node):
        if node.domain not in ONNX or node.op_type not in ("Div", "Mul") or len(node.inputs) != 2:
            return None
        d, denom = node.inputs
        nodes = [node]
        if node.op_type == "Mul":
            rec = producer_of(graph, denom, "Reciprocal")
            if rec is None:
                return None
            nodes.append(rec)
            denom = rec.inputs[0]
        sub, sqrt = producer_of(graph, d, "Sub"), producer_of(graph, denom, "Sqrt")
        if sub is None or sqrt is None:
            return None
        x, mean_out = sub.inputs
        mean = producer_of(graph, mean_out, "ReduceMean")
        add = producer_of(graph, sqrt.inputs[0], "Add")
        if mean is None or mean.inputs[0] != x or add is None:
            return None
        var_out, eps = (
            (add.inputs[0], add.inputs[1]) if float_const(graph, add.inputs[1]) is not None else add.inputs[::-1]
        )
        var = producer_of(graph, var_out, "ReduceMean")
        epsilon = float_const(graph, eps)
        if var is None or epsilon is None:
            return None
        sq = graph.producer(var.inputs[0])
        if sq is None or sq.domain not in ONNX:
            return None
        d2 = sq.inputs[0]
        if not (
            (sq.op_type == "Pow" and float_const(graph, sq.inputs[1]) == 2.0)
            or (sq.op_type == "Mul" and sq.inputs == [d2, d2])
        ):
            return None
        if d2 != d:  # the exporter may write x - mean twice, once for the variance
            sub2 = producer_of(graph, d2, "Sub")
            if sub2 is None or sub2.inputs != sub.inputs:
                return None
            nodes.append(sub2)
        axes = _axes(graph, mean)
        shape = tuple(graph.values[x].shape or ())
        if axes is None or axes != _axes(graph, var) or axes != tuple(range(len(shape) - len(axes), len(shape))):
            return None
        nodes += [sqrt, add, var, sq, sub, mean]
        normalized = tuple(shape[a] for a in axes)
        gamma, beta = np.ones(normalized, np.float32), np.zeros(normalized, np.float32)
        last = node
        gamma, last = _absorb(graph, last, "Mul", shape, axes, nodes, gamma)
        beta, last = _absorb(graph, last, "Add", shape, axes, nodes, beta)
        m = PatternMatch(last, x, nodes, "LayerNormalization", attrs={"axis": axes[0], "epsilon": epsilon})
        m.extra = [("gamma", gamma), ("beta", beta)]  # made constants in rewrite
        return m


class FuseGroupNorm(NormPattern):
    name = "fuse_group_norm"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "InstanceNormalization" or node.domain not in ONNX:
            return None
        r1 = producer_of(graph, node.inputs[0], "Reshape")
        if r1 is None:
            return None
        x = r1.inputs[0]
        shape = tuple(graph.values[x].shape or ())
        grouped = tuple(graph.values[r1.outputs[0]].shape or ())
        if len(shape) < 3 or len(grouped) != 3 or grouped[0] != shape[0] or shape[1] % grouped[1]:
            return None
        groups = grouped[1]
        scale, bias = graph.const(node.inputs[1]), graph.const(node.inputs[2])
        if scale is None or bias is None or not (np.all(scale == 1) and np.all(bias == 0)):
            return None
        users = graph.consumers(node.outputs[0])
        r2 = users[0] if len(users) == 1 and users[0].op_type == "Reshape" else None
        if r2 is None or tuple(graph.values[r2.outputs[0]].shape or ()) != shape:
            return None
        nodes, last = [r1, node, r2], r2
        channels = (shape[1],)
        gamma, beta = np.ones(channels, np.float32), np.zeros(channels, np.float32)
        step = _affine_step(graph, last.outputs[0], "Mul")
        g = _along(graph.const(step[1]), shape, (1,)) if step else None
        if g is not None:
            gamma, last = g, step[0]
            nodes.append(last)
        step = _affine_step(graph, last.outputs[0], "Add")
        b = _along(graph.const(step[1]), shape, (1,)) if step else None
        if b is not None:
            beta, last = b, step[0]
            nodes.append(last)
        epsilon = float(node.attrs.get("epsilon", 1e-5))
        m = PatternMatch(last, x, nodes, "GroupNormalization", attrs={"num_groups": groups, "epsilon": epsilon})
        m.extra = [("gamma", gamma), ("beta", beta)]
        return m


def _same_type_cast(graph: Graph, value: str) -> Node | None:
    """The Cast producing ``value`` from a tensor of the same dtype (a no-op), if any."""
    cast = producer_of(graph, value, "Cast")
    if cast is None or graph.values[cast.inputs[0]].dtype != graph.values[value].dtype:
        return None
    return cast


def _reciprocal(graph: Graph, value: str) -> Node | None:
    """The node computing ``value`` as ``Reciprocal(v)`` or ``Div(1, v)``, if so."""
    inv = producer_of(graph, value, "Reciprocal") or producer_of(graph, value, "Div")
    if inv is None or (inv.op_type == "Div" and float_const(graph, inv.inputs[0]) != 1.0):
        return None
    return inv


class FuseRMSNorm(NormPattern):
    name = "fuse_rms_norm"

    def match(self, graph: Graph, node: Node):
        if node.domain not in ONNX or node.op_type not in ("Div", "Mul") or len(node.inputs) != 2:
            return None
        nodes = [node]
        if node.op_type == "Div":  # x / Sqrt(...)
            x, sqrt = node.inputs[0], producer_of(graph, node.inputs[1], "Sqrt")
        else:  # x * (1 / Sqrt(...)) or x * Reciprocal(Sqrt(...)), either order
            found = [(a, _reciprocal(graph, b)) for a, b in (node.inputs, node.inputs[::-1]) if _reciprocal(graph, b)]
            if not found:
                return None
            x, inv = found[0]
            nodes.append(inv)
            sqrt = producer_of(graph, inv.inputs[-1], "Sqrt")
        add = producer_of(graph, sqrt.inputs[0], "Add") if sqrt is not None else None
        if add is None:
            return None
        ms_out, eps = (
            (add.inputs[0], add.inputs[1]) if float_const(graph, add.inputs[1]) is not None else add.inputs[::-1]
        )
        mean, epsilon = producer_of(graph, ms_out, "ReduceMean"), float_const(graph, eps)
        sq = graph.producer(mean.inputs[0]) if mean is not None else None
        if epsilon is None or sq is None or sq.domain not in ONNX:
            return None
        if not (
            (sq.op_type == "Pow" and sq.inputs[0] == x and float_const(graph, sq.inputs[1]) == 2.0)
            or (sq.op_type == "Mul" and sq.inputs == [x, x])
        ):
            return None
        shape = tuple(graph.values[x].shape or ())
        axes = _axes(graph, mean)
        if not shape or axes is None or axes != tuple(range(len(shape) - len(axes), len(shape))):
            return None
        nodes += [sqrt, add, mean, sq]
        cast_in = _same_type_cast(graph, x)
        inside = {id(n) for n in nodes}
        if cast_in is not None and all(id(u) in inside for u in graph.consumers(x)) and x not in graph.outputs:
            nodes.append(cast_in)  # else (the residual reads the cast too) the no-op Cast stays before
            x = cast_in.inputs[0]
        last = node
        users = graph.consumers(last.outputs[0])
        if len(users) == 1 and users[0].op_type == "Cast" and _same_type_cast(graph, users[0].outputs[0]):
            last = users[0]
            nodes.append(last)
        gamma = np.ones(tuple(shape[a] for a in axes), np.float32)
        gamma, last = _absorb(graph, last, "Mul", shape, axes, nodes, gamma)
        m = PatternMatch(last, x, nodes, "RMSNormalization", attrs={"axis": axes[0], "epsilon": epsilon})
        m.extra = [("gamma", gamma)]
        return m


def norm_passes() -> list[FormulaPattern]:
    return [FuseLayerNorm(), FuseGroupNorm(), FuseRMSNorm()]
