"""Fuse Conv -> BatchNormalization -> activation, and Conv -> activation, into one
``torch2ms.ConvBnAct`` node, which the code generator writes as ``nn.Conv2dBnAct`` (2-D), or as
a generated ``Conv3dBnAct`` cell of the same form (3-D: MindSpore has no such cell).

Pattern: a 2-D or 3-D ``Conv`` whose only consumer is an inference ``BatchNormalization``, or whose
output goes straight to an activation; the activation is the only consumer of the block's
output and one nn.Conv2dBnAct applies itself (``activations.activation_of``: ReLU, ReLU6,
Sigmoid, SiLU, GELU, Mish, HardSigmoid, HardSwish, ELU, Tanh, LeakyReLU, PReLU with one slope
per channel). The decomposed activations (``x * Sigmoid(x)``, ...) are one node by then: the
formula passes run first.

It does not fire when the conv output is used elsewhere (a graph output or a second consumer),
or when the conv is 1-D. When the activation cannot join (its input has other consumers,
its parameters are not ones the cell computes, its formula could not be recognised), Conv + BN
are fused without it and ``chains`` records why, for the coverage figure in the rebuild stage.

The fused node's inputs are ``X, W, B?, scale?, bias?, mean?, var?, slope?`` (BatchNorm's four
only while ``has_bn``; PReLU's slope, one value per output channel, at index 7).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch2ms.converters.api import batchnorm_in_training
from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.activations import Act, FormulaPattern, activation_of, per_channel_slope
from torch2ms.passes.base import Pass, remove_node, replace_node
from torch2ms.passes.match import single_consumer

BN_INPUTS = 4  # scale, bias, mean, var
SLOPE_INDEX = 7


@dataclass
class Chain:
    """One layer -> (BN) -> activation chain: fused or not, and why not."""

    node: str
    kind: str
    fused: bool
    reason: str = ""
    supported: bool = True  # False: an activation whose parameters the cell cannot compute


@dataclass
class ActAfter:
    """What consumes a block's output: the activation to fuse (``node``/``act``), or the kind of
    activation that cannot join and why (``reason``); ``kind`` is "" when there is none."""

    node: Node | None = None
    act: Act | None = None
    kind: str = ""
    reason: str = ""
    supported: bool = True


def activation_after(graph: Graph, producer: Node, formulas: list[FormulaPattern], channel_axis: int = 1) -> ActAfter:
    """The activation that ``producer``'s output flows into, for a fused cell to apply."""
    value = producer.outputs[0]
    for f in formulas:
        if value in f.misses:
            kind, reason = f.misses[value]
            return ActAfter(kind=kind, reason=reason)
    user = single_consumer(graph, value)
    if user is not None:
        act, why_not = activation_of(graph, user)
        if why_not:
            return ActAfter(kind=user.op_type, reason=why_not, supported=False)
        if act is None:
            return ActAfter()
        if act.kind == "PRelu":
            shape = tuple(graph.values[value].shape or ())
            if per_channel_slope(graph, act.slope, shape, channel_axis % max(len(shape), 1)) is None:
                slope_shape = list(graph.const(act.slope).shape)
                return ActAfter(kind="PRelu", reason=f"PRelu slope {slope_shape} is not one value per channel")
        return ActAfter(user, act, act.kind)
    users = graph.consumers(value)
    for u in users:
        act, why_not = activation_of(graph, u)
        if act is not None or why_not:
            where = "is a graph output" if value in graph.outputs else f"has {graph.use_count(value)} consumers"
            return ActAfter(kind=act.kind if act else u.op_type, reason=f"{producer.op_type} output {where}")
    return ActAfter()


def activation_attrs(graph: Graph, after: ActAfter, out_shape: tuple[int, ...], axis: int) -> tuple[dict, str | None]:
    """The fused node's activation attributes, and PReLU's per-channel slope as a new constant."""
    if after.act is None:
        return {"activation": ""}, None
    attrs = {"activation": after.act.kind, **after.act.attrs}
    if after.act.kind != "PRelu":
        return attrs, None
    slope = per_channel_slope(graph, after.act.slope, out_shape, axis)
    if slope.size == 1 and out_shape[axis] != 1:
        slope = slope.repeat(out_shape[axis])
    return attrs, graph.add_const(after.act.slope + "_per_channel", slope)


def fuse_chain(
    graph: Graph,
    op_type: str,
    layer: Node,
    bn: Node | None,
    after: ActAfter,
    inputs: list[str],
    attrs: dict,
    channel_axis: int | None,
) -> Node:
    """Replace ``layer`` [-> ``bn``] [-> the activation in ``after``] by one torch2ms-domain node
    ``op_type``: the layer's ``inputs``, then the BatchNorm's scale, bias, mean and var (``has_bn``),
    then the activation's per-channel slope at input ``SLOPE_INDEX``; ``channel_axis`` None: the last."""
    last = after.node or bn or layer
    inputs = list(inputs)
    attrs = {**attrs, "has_bn": 0}
    if bn is not None:
        inputs += list(bn.inputs[1:5])
        attrs.update(epsilon=bn.attrs.get("epsilon", 1e-5), momentum=bn.attrs.get("momentum", 0.9), has_bn=1)
    shape = tuple(graph.values[last.outputs[0]].shape)
    act_attrs, slope = activation_attrs(graph, after, shape, len(shape) - 1 if channel_axis is None else channel_axis)
    attrs.update(act_attrs)
    if slope:
        inputs = inputs + [""] * (SLOPE_INDEX - len(inputs)) + [slope]
    fused = Node(
        name=layer.name,
        op_type=op_type,
        domain="torch2ms",
        inputs=inputs,
        outputs=[last.outputs[0]],
        attrs=attrs,
        origin=[o for n in (layer, bn, after.node) if n is not None for o in n.origin],
    )
    replace_node(graph, layer, fused)
    for n in (bn, after.node):
        if n is not None:
            remove_node(graph, n)
    return fused


@dataclass
class ChainMatch:
    layer: Node  # the Conv, Gemm or Linear
    bn: Node | None
    after: ActAfter


class LayerBnActFusion(Pass):
    """What the Conv and Dense fusions share: a layer, the BatchNorm after it if any, the
    activation after that; the chain is recorded (fused or why not) for the coverage figures.
    Subclasses give ``match``, ``layer_problem`` and ``fuse``."""

    def __init__(self, formulas: list[FormulaPattern] = ()) -> None:
        super().__init__()
        self.formulas = list(formulas)  # their misses say why an activation was not one node
        self.chains: list[Chain] = []

    def apply(self, graph: Graph) -> int:
        self.chains = []
        return super().apply(graph)

    def layer_problem(self, graph: Graph, m: ChainMatch) -> str | None:
        raise NotImplementedError

    def fuse(self, graph: Graph, m: ChainMatch) -> None:
        raise NotImplementedError

    def check(self, graph: Graph, m: ChainMatch) -> str | None:
        reason = self._why_not(graph, m)
        if reason and m.after.kind:
            self.chains.append(Chain(m.layer.name, m.after.kind, False, m.after.reason or reason, m.after.supported))
        return reason

    def _why_not(self, graph: Graph, m: ChainMatch) -> str | None:
        problem = self.layer_problem(graph, m)
        if problem:
            return problem
        if m.bn is not None:
            if batchnorm_in_training(m.bn):
                return "BatchNormalization in training mode"
            if any(graph.const(i) is None for i in m.bn.inputs[1:5]):
                return "BatchNormalization statistics are not constant"
        elif m.after.act is None:
            return m.after.reason  # no BatchNorm and an activation that cannot join: nothing to fuse
        return None

    def rewrite(self, graph: Graph, m: ChainMatch) -> None:
        if m.after.kind:
            self.chains.append(
                Chain(m.layer.name, m.after.kind, m.after.act is not None, m.after.reason, m.after.supported)
            )
        self.fuse(graph, m)


class FuseConvBnAct(LayerBnActFusion):
    name = "fuse_conv_bn_act"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            return None
        bn = next((u for u in graph.consumers(node.outputs[0]) if u.op_type == "BatchNormalization"), None)
        after = activation_after(graph, bn or node, self.formulas)
        if bn is None and not after.kind:
            return None
        return ChainMatch(node, bn, after)

    def layer_problem(self, graph: Graph, m: ChainMatch) -> str | None:
        conv = m.layer
        if m.bn is not None and single_consumer(graph, conv.outputs[0]) is not m.bn:
            return "the conv output is used by more than the BatchNormalization"
        if len(graph.values[conv.inputs[0]].shape or ()) not in (4, 5):
            return "not a 2-D or 3-D convolution"
        if graph.const(conv.inputs[1]) is None or (
            len(conv.inputs) > 2 and conv.inputs[2] and graph.const(conv.inputs[2]) is None
        ):
            return "conv weights are not constant"
        return None

    def fuse(self, graph: Graph, m: ChainMatch) -> None:
        inputs = (list(m.layer.inputs) + [""] * 3)[:3]
        fuse_chain(graph, "ConvBnAct", m.layer, m.bn, m.after, inputs, dict(m.layer.attrs), channel_axis=1)
