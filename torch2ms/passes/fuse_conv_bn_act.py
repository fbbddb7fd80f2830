"""Fuse Conv -> BatchNormalization -> activation into one ``torch2ms.ConvBnAct`` node, which the
code generator writes as ``nn.Conv2dBnAct``.

Pattern: ``Conv`` whose only consumer is an inference ``BatchNormalization`` whose only
consumer is one of Relu, Clip(0, 6) (ReLU6), HardSwish, Sigmoid; without such a consumer the
block has no activation. It does not fire when an intermediate output is used elsewhere (a
graph output or a second consumer), or when the conv is not 2-D.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch2ms.converters.api import batchnorm_in_training
from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass


@dataclass
class ConvBnActMatch:
    conv: Node
    bn: Node
    act: Node | None
    activation: str


def activation_kind(graph: Graph, node: Node) -> str | None:
    if node.op_type in ("Relu", "HardSwish", "Sigmoid"):
        return node.op_type
    if node.op_type == "Clip":
        lo = graph.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
        hi = graph.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if lo is None and hi is None and "min" in node.attrs:
            lo, hi = node.attrs.get("min"), node.attrs.get("max")
        if lo is not None and hi is not None and float(lo) == 0.0 and float(hi) == 6.0:
            return "Relu6"
    return None


def _single_consumer(graph: Graph, value: str) -> Node | None:
    if value in graph.outputs:
        return None
    users = graph.consumers(value)
    return users[0] if len(users) == 1 and users[0].inputs.count(value) == 1 else None


class FuseConvBnAct(Pass):
    name = "fuse_conv_bn_act"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            return None
        bn = next((u for u in graph.consumers(node.outputs[0]) if u.op_type == "BatchNormalization"), None)
        if bn is None:
            return None
        act = _single_consumer(graph, bn.outputs[0])
        kind = activation_kind(graph, act) if act is not None else None
        return ConvBnActMatch(node, bn, act if kind else None, kind or "")

    def check(self, graph: Graph, m: ConvBnActMatch) -> str | None:
        if _single_consumer(graph, m.conv.outputs[0]) is not m.bn:
            return "the conv output is used by more than the BatchNormalization"
        if len(graph.values[m.conv.inputs[0]].shape or ()) != 4:
            return "not a 2-D convolution"
        if batchnorm_in_training(m.bn):
            return "BatchNormalization in training mode"
        if any(graph.const(i) is None for i in m.bn.inputs[1:5]) or graph.const(m.conv.inputs[1]) is None:
            return "weights or statistics are not constant"
        return None

    def rewrite(self, graph: Graph, m: ConvBnActMatch) -> None:
        last = m.act or m.bn
        conv_inputs = list(m.conv.inputs) + [""] * (3 - len(m.conv.inputs))
        attrs = dict(m.conv.attrs)
        attrs.update(
            epsilon=m.bn.attrs.get("epsilon", 1e-5),
            momentum=m.bn.attrs.get("momentum", 0.9),
            has_bn=1,
            activation=m.activation,
        )
        fused = Node(
            name=m.conv.name,
            op_type="ConvBnAct",
            domain="torch2ms",
            inputs=conv_inputs[:3] + list(m.bn.inputs[1:5]),
            outputs=[last.outputs[0]],
            attrs=attrs,
            origin=[n.name for n in (m.conv, m.bn, m.act) if n is not None],
        )
        i = graph.nodes.index(m.conv)
        graph.nodes[i] = fused
        for n in (m.bn, m.act):
            if n is not None:
                graph.nodes.remove(n)
