"""Activations and other one-input elementwise ops.

Ops that map one-to-one onto a ``mindspore.ops`` function are a table; the rest have a small
converter each. Clip(0, 6) is ReLU6 (how PyTorch exports it); HardSigmoid with PyTorch's
alpha=1/6, beta=1/2 is ``ops.hardsigmoid``. Softmax before opset 13 normalises over all axes from
``axis`` on, as one flattened axis (opset 13 made it one axis).
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, literal

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
    "Sin": "ops.sin",
    "Cos": "ops.cos",
    "Tan": "ops.tan",
    "Asin": "ops.asin",
    "Acos": "ops.acos",
    "Atan": "ops.atan",
    "Sinh": "ops.sinh",
    "Cosh": "ops.cosh",
    "Asinh": "ops.asinh",
    "Acosh": "ops.acosh",
    "Atanh": "ops.atanh",
    "Round": "ops.round",  # half to even, like ONNX
    "IsNaN": "ops.isnan",
    "BitwiseNot": "ops.invert",
}
# The opset each op appeared in, where it is not 1 (before 7, opsets are out of the loader's range).
_SINCE = {
    **dict.fromkeys(["Sin", "Cos", "Tan", "Asin", "Acos", "Atan"], 7),
    **dict.fromkeys(["Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN"], 9),
    "Round": 11,
    "BitwiseNot": 18,
}


def _unary(op: str, fn: str):
    def convert(em):
        return f"{fn}({em.x(0)})"

    convert.__name__ = op
    convert.__doc__ = f"{op}(X) -> Y   as {fn}"
    return convert


for _op, _fn in UNARY.items():
    converter(_op, since=_SINCE.get(_op, 1))(_unary(_op, _fn))


_FLT_MAX = 3.4028234663852886e38


def _clip(x: str, lo: float | None, hi: float | None) -> str:
    if lo == 0 and hi == 6:
        return f"ops.relu6({x})"
    if lo == 0 and hi is None:
        return f"ops.relu({x})"
    if lo is None and hi is None:
        return x  # ops.clamp refuses two open bounds
    return f"ops.clamp({x}, {literal(lo)}, {literal(hi)})"


@converter("Clip", since=11)
def clip(em):
    """Clip(input, min?, max?) -> output   (min/max are inputs from opset 11)"""
    lo = em.require_const(1, "min").item() if em.has_input(1) else None
    hi = em.require_const(2, "max").item() if em.has_input(2) else None
    return _clip(em.x(0), lo, hi)


@converter("Clip", since=1)
def clip_v6(em, *, min=-_FLT_MAX, max=_FLT_MAX):  # noqa: A002 - ONNX names
    """Clip(input) -> output   attrs: min, max (before opset 11; the defaults are -/+FLT_MAX)"""
    lo = None if min <= -_FLT_MAX else float(min)
    hi = None if max >= _FLT_MAX else float(max)
    return _clip(em.x(0), lo, hi)


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
    """Softmax(input) -> output   attrs: axis (before 13: over all axes from ``axis`` on, flattened)"""
    shape = em.shape(0)
    axis = axis % len(shape)
    if axis == len(shape) - 1:
        return f"ops.softmax({em.x(0)}, axis=-1)"
    rows = (int(np.prod(shape[:axis], dtype=np.int64)), -1)
    return f"ops.reshape(ops.softmax(ops.reshape({em.x(0)}, {rows!r}), axis=-1), {tuple(shape)!r})"


@converter("Gelu", since=20)
def gelu(em, *, approximate="none"):
    """Gelu(X) -> Y   attrs: approximate ('none' | 'tanh')"""
    return f"ops.gelu({em.x(0)}, approximate={approximate!r})"


@converter("Identity", since=1)
def identity(em):
    """Identity(input) -> output"""
    return em.x(0)


@converter("Dropout", since=1)
def dropout(em, *, ratio=None, seed=None, is_test=None):
    """Dropout(data, ratio?, training_mode?) -> output, mask?   (inference: output = data, mask all true)"""
    if em.has_input(2):
        training = em.require_const(2, "training_mode")
        if bool(training):
            raise Unsupported("training_mode=True (random dropout) not supported; export the model in eval mode")
    if len(em.node.outputs) > 1 and em.node.outputs[1]:
        return f"{em.x(0)}, ops.ones({tuple(em.shape(0))!r}, ms.bool_)"
    return em.x(0)
