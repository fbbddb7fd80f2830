"""Fold an inference BatchNorm into the convolution before it.

BatchNorm in inference computes ``y = gamma * (x - mean) / sqrt(var + eps) + beta`` per output
channel; with ``x = W * i + b`` that is a convolution with ::

    std = sqrt(var + eps)
    W'  = W * (gamma / std)            (scaled along the output-channel axis)
    b'  = (b - mean) * gamma / std + beta

computed in float64 and stored as float32. The pass rewrites fused ``ConvBnAct`` nodes into
``ConvBnAct(has_bn=0)`` with a bias, and a plain ``Conv -> BatchNormalization`` (fusion off)
into one ``Conv``; a BatchNorm with no conv before it (e.g. after a Concat) stays. A fused
``Linear`` with BatchNorm (``nn.DenseBnAct``) folds the same way along its output features (its
``W`` is ``(in, out)``, so the scale runs along axis 1) and becomes ``nn.Dense``. PReLU's slope
(input 7 of the fused nodes) is kept.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import batchnorm_in_training
from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass, remove_node
from torch2ms.passes.fuse_conv_bn_act import SLOPE_INDEX
from torch2ms.passes.match import single_consumer


def fold_bn_weights(w, b, gamma, beta, mean, var, eps) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(W', b')``; ``b`` may be None (a conv without bias)."""
    w64 = np.asarray(w, np.float64)
    b64 = np.zeros(w64.shape[0]) if b is None else np.asarray(b, np.float64)
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + float(eps))
    w_f = w64 * scale.reshape((-1,) + (1,) * (w64.ndim - 1))
    b_f = (b64 - np.asarray(mean, np.float64)) * scale + np.asarray(beta, np.float64)
    dtype = np.asarray(w).dtype
    return w_f.astype(dtype), b_f.astype(dtype)


class FoldBatchNorm(Pass):
    name = "fold_batchnorm"

    def match(self, graph: Graph, node: Node):
        if node.op_type in ("ConvBnAct", "Linear") and node.domain == "torch2ms" and node.attrs.get("has_bn"):
            return (node, None)
        if node.op_type == "Conv" and node.domain in ("", "ai.onnx"):
            bn = single_consumer(graph, node.outputs[0])
            if bn is not None and bn.op_type == "BatchNormalization":
                return (node, bn)
        return None

    def check(self, graph: Graph, m) -> str | None:
        conv, bn = m
        names = conv.inputs[1:2] + ([conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else [])
        names += conv.inputs[3:7] if bn is None else bn.inputs[1:5]
        if any(graph.const(n) is None for n in names):
            return "weights or statistics are not constant"
        if bn is not None and batchnorm_in_training(bn):
            return "BatchNormalization in training mode"
        return None

    def rewrite(self, graph: Graph, m) -> None:
        conv, bn = m
        stats = conv.inputs[3:7] if bn is None else bn.inputs[1:5]
        eps = (conv if bn is None else bn).attrs.get("epsilon", 1e-5)
        b = graph.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        w = graph.const(conv.inputs[1])
        dense = conv.op_type == "Linear"  # W is (in, out): output features on axis 1
        w_f, b_f = fold_bn_weights(w.T if dense else w, b, *(graph.const(s) for s in stats), eps)
        w_name = graph.add_const(conv.inputs[1] + "_folded", np.ascontiguousarray(w_f.T) if dense else w_f)
        b_name = graph.add_const((conv.inputs[2] if b is not None else conv.inputs[1] + "_bias") + "_folded", b_f)
        if bn is None:
            slope = conv.inputs[SLOPE_INDEX] if len(conv.inputs) > SLOPE_INDEX else ""
            conv.inputs = [conv.inputs[0], w_name, b_name] + (["", "", "", "", slope] if slope else [])
            conv.attrs = {k: v for k, v in conv.attrs.items() if k not in ("epsilon", "momentum")}
            conv.attrs["has_bn"] = 0
        else:
            conv.inputs = [conv.inputs[0], w_name, b_name]
            conv.outputs = [bn.outputs[0]]
            conv.origin = conv.origin + [bn.name]
            remove_node(graph, bn)
        graph.remove_dead()
