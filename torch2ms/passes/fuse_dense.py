"""Fuse a fully connected layer with the BatchNorm1d and the activation after it into one
``torch2ms.Linear`` node, written as ``nn.Dense(..., activation=...)`` or ``nn.DenseBnAct``.

Layers: ``torch2ms.Linear`` (MatMul by a constant, made by ``matmul_linear.py``) and ``Gemm``
with a constant ``B`` and ``transA=0`` (how nn.Linear on a 2-D input exports), taken in as
``W = alpha * B'`` (``B' = B^T`` when ``transB``, so W is ``(in, out)`` like Linear's) and bias
``beta * C`` when C holds one value per output feature.

BatchNorm joins only on a rank-2 output, where its channel axis is the feature axis
(BatchNorm1d after nn.Linear); on ``(N, C, L)`` it normalizes axis 1, which is not a Dense
layer's feature axis. nn.Dense flattens the leading dimensions, computes ``x @ W^T + b`` and the
activation on ``(rows, out)`` and reshapes back, so any elementwise activation (and PReLU with
one slope per output feature) gives the same numbers as after the layer.

The fused node's inputs are ``X, W, B?, scale?, bias?, mean?, var?, slope?`` as for ConvBnAct.
"""

from __future__ import annotations

import numpy as np

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.fuse_conv_bn_act import (
    ChainMatch,
    LayerBnActFusion,
    activation_after,
    fuse_chain,
)
from torch2ms.passes.match import ONNX, single_consumer


def _gemm_problem(graph: Graph, gemm: Node) -> str | None:
    b = graph.const(gemm.inputs[1])
    if b is None:
        return "Gemm's B is not a constant"
    if gemm.attrs.get("transA", 0):
        return "Gemm with transA=1"
    if b.dtype != np.float32:
        return "weight is not float32"
    if len(gemm.inputs) > 2 and gemm.inputs[2]:
        c = graph.const(gemm.inputs[2])
        n = b.shape[0] if gemm.attrs.get("transB", 0) else b.shape[1]
        if c is None or c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
            return "Gemm's C is not one value per output feature"
    return None


class FuseDenseBnAct(LayerBnActFusion):
    name = "fuse_dense_bn_act"

    def match(self, graph: Graph, node: Node):
        if node.op_type == "Linear" and node.domain == "torch2ms":
            if "has_bn" in node.attrs:
                return None  # already fused
        elif node.op_type != "Gemm" or node.domain not in ONNX:
            return None
        out = node.outputs[0]
        bn = single_consumer(graph, out)
        if bn is None or bn.op_type != "BatchNormalization" or len(graph.values[out].shape or ()) != 2:
            bn = None
        after = activation_after(graph, bn or node, self.formulas, channel_axis=-1)
        if bn is None and not after.kind:
            return None
        return ChainMatch(node, bn, after)

    def layer_problem(self, graph: Graph, m: ChainMatch) -> str | None:
        return _gemm_problem(graph, m.layer) if m.layer.op_type == "Gemm" else None

    def _linear_inputs(self, graph: Graph, layer: Node) -> list[str]:
        """``[X, W (in, out), B or ""]`` for a Linear node, or for a Gemm with alpha, beta folded in."""
        if layer.op_type == "Linear":
            return (list(layer.inputs) + [""] * 3)[:3]
        b = graph.const(layer.inputs[1])
        # B^T stays a view: the converter transposes back to nn.Dense's (out, in) = B without a copy
        # (VGG's 25088 x 4096 classifier weight took seconds to copy twice).
        w = b.T if layer.attrs.get("transB", 0) else b
        alpha = layer.attrs.get("alpha", 1.0)
        w_name = graph.add_const(layer.inputs[1] + "_dense", w if alpha == 1.0 else w * np.float32(alpha))
        bias = ""
        if len(layer.inputs) > 2 and layer.inputs[2]:
            c = graph.const(layer.inputs[2]).reshape(-1) * np.float32(layer.attrs.get("beta", 1.0))
            c = np.broadcast_to(c, (w.shape[1],)) if c.size == 1 else c
            bias = graph.add_const(layer.inputs[2] + "_dense", np.ascontiguousarray(c, np.float32))
        return [layer.inputs[0], w_name, bias]

    def fuse(self, graph: Graph, m: ChainMatch) -> None:
        # has_bn (set by fuse_chain) marks a fused layer: MatMulToLinear's nodes have no attributes
        fuse_chain(graph, "Linear", m.layer, m.bn, m.after, self._linear_inputs(graph, m.layer), {}, channel_axis=None)
