"""Activations and other one-input elementwise ops.

Ops that map one-to-one onto a ``mindspore.ops`` function are a table; the rest have a small
converter each. Clip(0, 6) is ReLU6 (how PyTorch exports it); HardSigmoid with PyTorch's
alpha=1/6, beta=1/2 is ``ops.hardsigmoid``.
"""

from __future__ import annotations

from torch2ms.codegen.builder import literal
from torch2ms.converters.registry import Unsupported, converter

UNARY = {
    "Relu": "ops.relu",
    "Sigmoid": "ops.sigmoid",
    "Tanh": "ops.tanh",
    "HardSwish": "ops.hardswish",
    "Erf": "ops.erf",
    "Sqrt": "ops.sqrt",
    "Exp": "ops.exp",
    "Log": "ops.log",
    "Abs": "ops.abs",
    "Neg": "ops.neg",
    "Reciprocal": "ops.reciprocal",
    "Floor": "ops.floor",
    "Ceil": "ops.ceil",
    "Softplus": "ops.softplus",
}


def _unary(op: str, fn: str):
    def convert(em):
        return f"{fn}({em.x(0)})"

    convert.__name__ = op
    convert.__doc__ = f"{op}(X) -> Y   as {fn}"
    return convert


for _op, _fn in UNARY.items():
    converter(_op, since=1)(_unary(_op, _fn))


@converter("Clip", since=11)
def clip(em):
    """Clip(input, min?, max?) -> output   (min/max are inputs from opset 11)"""
    lo = em.require_const(1, "min").item() if em.has_input(1) else None
    hi = em.require_const(2, "max").item() if em.has_input(2) else None
    if lo == 0 and hi == 6:
        return f"ops.relu6({em.x(0)})"
    if lo == 0 and hi is None:
        return f"ops.relu({em.x(0)})"
    return f"ops.clamp({em.x(0)}, {literal(lo)}, {literal(hi)})"


@converter("Clip", since=1)
def clip_v6(em, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002 - ONNX names
    """Clip(input) -> output   attrs: min, max (before opset 11)"""
    if min == 0 and max == 6:
        return f"ops.relu6({em.x(0)})"
    return f"ops.clamp({em.x(0)}, {literal(float(min))}, {literal(float(max))})"


@converter("HardSigmoid", since=6)
def hard_sigmoid(em, *, alpha=0.2, beta=0.5):
    """HardSigmoid(X) -> Y = max(0, min(1, alpha * X + beta))"""
    if abs(alpha - 1 / 6) < 1e-7 and abs(beta - 0.5) < 1e-7:
        return f"ops.hardsigmoid({em.x(0)})"
    return f"ops.clamp({em.x(0)} * {literal(float(alpha))} + {literal(float(beta))}, 0.0, 1.0)"


@converter("LeakyRelu", since=6)
def leaky_relu(em, *, alpha=0.01):
    """LeakyRelu(X) -> Y   attrs: alpha"""
    return f"ops.leaky_relu({em.x(0)}, {literal(float(alpha))})"


@converter("Softmax", since=13)
def softmax(em, *, axis=-1):
    """Softmax(input) -> output   attrs: axis (opset 13: one axis)"""
    return f"ops.softmax({em.x(0)}, axis={int(axis)})"


@converter("Softmax", since=1)
def softmax_v1(em, *, axis=1):
    """Softmax(input) -> output   attrs: axis (before 13: flattens from axis)"""
    if axis % em.rank(0) != em.rank(0) - 1:
        raise Unsupported(f"axis={axis} before opset 13 flattens the input; only the last axis is supported")
    return f"ops.softmax({em.x(0)}, axis=-1)"


@converter("Gelu", since=20)
def gelu(em, *, approximate="none"):
    """Gelu(X) -> Y   attrs: approximate ('none' | 'tanh')"""
    return f"ops.gelu({em.x(0)}, approximate={approximate!r})"


@converter("Identity", "Dropout", since=1)
def identity(em, *, ratio=None, seed=None, is_test=None):
    """Identity(input) -> output; Dropout in inference is the identity too"""
    return em.x(0)
