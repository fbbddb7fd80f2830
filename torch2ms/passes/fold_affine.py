"""Fold a per-channel constant ``Mul`` / ``Add`` / ``Sub`` after a convolution into its weights and bias.

A "frozen" BatchNorm written out as arithmetic (HF RT-DETR's ``RTDetrFrozenBatchNorm2d``, DETR's
and torchvision's ``FrozenBatchNorm2d`` once the exporter folded its statistics) reaches ONNX as
``Conv -> Mul(x, scale[1, C, 1, 1]) -> Add(x, shift[1, C, 1, 1])``. Per output channel that is ::

    W' = W * scale          (along the output-channel axis)
    b' = b * scale + shift

computed in float64 and stored in the weights' dtype, as ``FoldBatchNorm`` does.

Why it matters beyond speed: MindSpore's CPU ``Mul``/``Add``/``Sub`` kernel, for operands whose
shapes differ where neither is a single element, precomputes two ``size_t`` input indices per
output element (``input_index1_`` / ``input_index2_``, 16 bytes per element) and keeps them in
the kernel. In GRAPH_MODE every node has its own kernel, so each such node holds 4x its output's
size for the life of the compiled graph (RT-DETR's backbone: benchmarks/results/design_measurements.md).

The constant must keep the conv's output shape (size 1 or C on the channel axis, 1 elsewhere);
``x - c`` folds, ``c - x`` and ``Div`` are left alone.
"""

from __future__ import annotations

import numpy as np

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass, remove_node
from torch2ms.passes.match import ONNX, single_consumer

OPS = ("Mul", "Add", "Sub")


def _per_channel(c: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a float64 vector of ``channels`` entries when it broadcasts per channel against an
    output of ``rank`` dims (N, C, spatial...) without changing its shape, else None."""
    if c.dtype.kind != "f" or c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(np.asarray(c, np.float64).reshape(-1), (channels,)).copy()


def _operands(conv: Node, op: Node) -> tuple[str, bool]:
    """The name of ``op``'s other operand, and whether the conv's output comes first."""
    first = op.inputs[0] == conv.outputs[0]
    return op.inputs[1] if first else op.inputs[0], first


class FoldConvAffine(Pass):
    name = "fold_conv_affine"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Conv" or node.domain not in ONNX:
            return None
        op = single_consumer(graph, node.outputs[0])
        if op is None or op.op_type not in OPS or op.domain not in ONNX or len(op.inputs) != 2:
            return None
        return (node, op)

    def check(self, graph: Graph, m) -> str | None:
        conv, op = m
        w = graph.const(conv.inputs[1])
        has_b = len(conv.inputs) > 2 and bool(conv.inputs[2])
        if w is None or (has_b and graph.const(conv.inputs[2]) is None):
            return "weights are not constant"
        other, first = _operands(conv, op)
        if op.op_type == "Sub" and not first:
            return "constant minus the conv"
        c = graph.const(other)
        if c is None:
            return f"{op.op_type}'s other operand is not constant"
        if c.dtype != w.dtype:
            return "dtypes differ"
        if _per_channel(c, w.ndim, w.shape[0]) is None:
            return f"{op.op_type}'s constant {tuple(c.shape)} is not per output channel"
        return None

    def rewrite(self, graph: Graph, m) -> None:
        conv, op = m
        w = graph.const(conv.inputs[1])
        has_b = len(conv.inputs) > 2 and bool(conv.inputs[2])
        w64 = np.asarray(w, np.float64)
        b64 = np.asarray(graph.const(conv.inputs[2]), np.float64) if has_b else np.zeros(w.shape[0])
        c = _per_channel(graph.const(_operands(conv, op)[0]), w.ndim, w.shape[0])
        w_name = conv.inputs[1]
        if op.op_type == "Mul":
            w_name = graph.add_const(w_name + "_affine", (w64 * c.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype))
            b64 = b64 * c
        else:
            b64 = b64 + c if op.op_type == "Add" else b64 - c
        b_base = conv.inputs[2] if has_b else conv.inputs[1] + "_bias"
        conv.inputs = [conv.inputs[0], w_name, graph.add_const(b_base + "_affine", b64.astype(w.dtype))]
        conv.outputs = [op.outputs[0]]
        conv.origin = conv.origin + op.origin
        remove_node(graph, op)
        graph.remove_dead()
