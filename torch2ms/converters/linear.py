"""Matrix products: Gemm (``nn.Dense`` when B is a constant), MatMul, and the fused
``torch2ms.Linear`` (MatMul by a constant or Gemm, + BatchNorm1d, + activation).

``nn.Dense`` keeps its weight as ``(out_features, in_features)`` (PyTorch's layout, ONNX's
``transB=1``) and adds one bias per output feature, so Gemm's ``alpha`` is folded into the
weight and ``beta * C`` into the bias; a ``C`` that varies along the rows cannot be a bias.

A fused Linear with BatchNorm is ``nn.DenseBnAct(has_bn=True)``; without, ``nn.Dense(activation=
...)``. Both take the activation as a string that makes the layer with its defaults, so where
those differ from ONNX the layer is passed instead: GELU's string is the tanh approximation,
PReLU's one slope of 0.25, and nn.Dense has no ``alpha`` for LeakyReLU (nn.DenseBnAct has).
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter
from torch2ms.converters.cell_activation import cell_activation, cell_batchnorm


@converter("Gemm", since=7)
def gemm(em, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    """Gemm(A, B, C?) -> Y = alpha * A' @ B' + beta * C   attrs: alpha, beta, transA, transB"""
    b = em.const(1)
    if b is None:
        raise Unsupported("B must be a constant (a weight)")
    weight = b if transB else b.T
    dtype = weight.dtype
    params = {"weight": (weight * alpha).astype(dtype)}
    kw = {}
    if em.has_input(2):
        c = em.require_const(2, "C")
        if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1) or (c.ndim and c.shape[-1] not in (1, weight.shape[0])):
            raise Unsupported(f"C of shape {list(c.shape)} (not one value per output feature) not supported")
        bias = (c * beta).astype(dtype).reshape(-1)
        params["bias"] = bias.repeat(weight.shape[0]) if bias.size == 1 else bias
    else:
        kw["has_bias"] = False
    layer = em.layer("nn.Dense", int(weight.shape[1]), int(weight.shape[0]), params=params, **kw)
    a = f"ops.transpose({em.x(0)}, (1, 0))" if transA else em.x(0)
    return f"{layer}({a})"


@converter("MatMul", since=1)
def matmul(em):
    """MatMul(A, B) -> Y   (NumPy matmul semantics)

    A of rank > 2 times a 2-D B (a Linear layer on a sequence) is written as one 2-D matmul
    between reshapes: in GRAPH_MODE MindSpore lowers ``ops.matmul`` of (S, 1, K) x (K, N) to
    BroadcastTo(B -> (S, K, N)) + BatchMatMul: a copy of the weight per layer, S times over
    (benchmarks/results/design_measurements.md).
    """
    a, b = em.shape(0), em.shape(1)
    if len(a) > 2 and len(b) == 2:
        rows = 1
        for d in a[:-1]:
            rows *= int(d)
        flat = f"ops.matmul(ops.reshape({em.x(0)}, {(rows, int(a[-1]))}), {em.x(1)})"
        return f"ops.reshape({flat}, {tuple(int(d) for d in em.out_shape())})"
    return f"ops.matmul({em.x(0)}, {em.x(1)})"


@converter("Linear", domain="torch2ms")
def linear(em, *, activation="", has_bn=0, epsilon=1e-5, momentum=0.9, alpha=0.01, approximate="none"):
    """torch2ms.Linear(X, W, B?, scale?, bias?, mean?, var?, slope?) -> act(BN(X @ W + B))

    Made by passes/matmul_linear.py from MatMul + Add, and by passes/fuse_dense.py from it or a
    Gemm with the BatchNorm1d (inputs 3-6, while ``has_bn``) and activation after it.
    """
    w = em.require_const(1, "W")
    features = int(w.shape[1])
    dense = {"weight": np.ascontiguousarray(w.T)}
    kw = {}
    if em.has_input(2):
        dense["bias"] = em.require_const(2, "B").astype(w.dtype).reshape(-1)
    else:
        kw["has_bias"] = False
    params = dense
    if has_bn:
        if em.rank(0) != 2:
            raise Unsupported(f"BatchNorm after a Linear on a rank-{em.rank(0)} input not supported")
        bn_kw, bn_params = cell_batchnorm(em, momentum, epsilon, default_momentum=0.9)
        kw.update(bn_kw)
        params = {f"dense.{k}": v for k, v in dense.items()} | bn_params
    if activation:
        act_kw, act_params = cell_activation(
            em, activation, alpha, approximate, features, "nn.DenseBnAct" if has_bn else "nn.Dense", has_bn
        )
        kw.update(act_kw)
        params.update(act_params)
    callee = "nn.DenseBnAct" if has_bn else "nn.Dense"
    layer = em.layer(callee, int(w.shape[0]), features, params=params, **kw)
    return f"{layer}({em.x(0)})"
