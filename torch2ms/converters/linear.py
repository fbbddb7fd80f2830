"""Matrix products: Gemm (``nn.Dense`` when B is a constant) and MatMul."""

from __future__ import annotations

from torch2ms.converters.registry import Unsupported, converter


@converter("Gemm", since=7)
def gemm(em, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    """Gemm(A, B, C?) -> Y = alpha * A' @ B' + beta * C   attrs: alpha, beta, transA, transB"""
    if transA:
        raise Unsupported("transA=1 not supported")
    b = em.const(1)
    if b is None:
        raise Unsupported("B must be a constant (a weight)")
    weight = b if transB else b.T  # nn.Dense keeps (out_features, in_features)
    params = {"weight": weight * alpha}
    kw = {}
    if em.has_input(2):
        c = em.require_const(2, "C")
        if c.size not in (1, weight.shape[0]):
            raise Unsupported(f"bias C of shape {list(c.shape)} not supported")
        params["bias"] = (c * beta).reshape(-1)
        if c.size == 1:
            params["bias"] = params["bias"].repeat(weight.shape[0])
    else:
        kw["has_bias"] = False
    layer = em.layer("nn.Dense", int(weight.shape[1]), int(weight.shape[0]), params=params, **kw)
    return f"{layer}({em.x(0)})"


@converter("MatMul", since=1)
def matmul(em):
    """MatMul(A, B) -> Y   (NumPy matmul semantics)"""
    return f"ops.matmul({em.x(0)}, {em.x(1)})"
