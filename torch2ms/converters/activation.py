"""Activations and other one-input elementwise ops.

Ops that map one-to-one onto a ``mindspore.ops`` function are a table; the rest have a small
converter each. Clip(0, 6) is ReLU6 (how PyTorch exports it); HardSigmoid with PyTorch's
alpha=1/6, beta=1/2 is ``ops.hardsigmoid``. Softmax, LogSoftmax and Hardmax before opset 13
normalise over all axes from ``axis`` on, as one flattened axis (opset 13 made it one axis).

Where MindSpore's function is narrower than ONNX the formula is written out: ``ops.elu`` takes
alpha=1 only (ONNX: x if x > 0 else alpha * (exp(x) - 1)); ``ops.selu`` has the fixed alpha and
gamma; ``ops.prelu`` takes one slope per channel (axis 1) in float16/float32, while ONNX
broadcasts the slope to X from the right; ``ops.hardshrink``/``ops.softshrink`` are Shrink with
bias 0 / bias = lambd in float16/float32. Integer Shrink is computed in float64 and truncated,
like onnxruntime.

MindSpore's CPU ``ops.softmax`` is wrong on every row of the batch after a row that is all -inf
(they come out 0 or with the wrong sum; ONNX gives NaN for that row alone), so a Softmax whose
input may hold -inf is written out as ONNX defines it, ``e = exp(x - max(x)); e / sum(e)``
(``onnx_masked_softmax``). "May hold -inf": a constant among its ancestors holds -inf or a value
below -FLT_MAX/2 (two of those add up to -inf), as a masked_fill(-inf) or an additive attention
mask has. A mask fed as a graph input is not seen.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, literal, ms_dtype

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
    "Softsign": "ops.softsign",
    "Mish": "ops.mish",
}
# The opset each op appeared in, where it is not 1 (before 7, opsets are out of the loader's range).
_SINCE = {
    **dict.fromkeys(["Sin", "Cos", "Tan", "Asin", "Acos", "Atan"], 7),
    **dict.fromkeys(["Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN"], 9),
    "Round": 11,
    "BitwiseNot": 18,
    "Mish": 18,
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


def may_hold_neg_inf(graph, value: str) -> bool:
    """Whether a constant among ``value``'s ancestors holds -inf or a float below -FLT_MAX/2."""
    producers = {o: n for n in graph.nodes for o in n.outputs}
    seen, todo = set(), [value]
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        v = graph.values.get(name)
        if v is not None and v.is_const:
            c = v.const
            if c.dtype.kind == "f" and c.size and (np.isneginf(c).any() or np.nanmin(c) < -_FLT_MAX / 2):
                return True
            continue
        node = producers.get(name)
        if node is not None:
            todo.extend(node.inputs)
    return False


_MASKED_SOFTMAX = '''
def onnx_masked_softmax(x, axis):
    """Softmax as ONNX writes it: MindSpore's CPU softmax corrupts every row after an all -inf row.
    An all -inf row is NaN, as in onnxruntime."""
    e = ops.exp(x - ops.amax(x, axis, keepdims=True))
    return e / ops.sum(e, dim=axis, keepdim=True)
'''


def _softmax(em):
    """``ops.softmax``, or ``onnx_masked_softmax`` where a row may be all -inf (see the module docstring)."""
    if may_hold_neg_inf(em.graph, em.node.inputs[0]):
        fn = em.define("onnx_masked_softmax", _MASKED_SOFTMAX)
        return lambda x, ax: f"{fn}({x}, {ax})"
    return lambda x, ax: f"ops.softmax({x}, axis={ax})"


@converter("Softmax", since=13)
def softmax(em, *, axis=-1):
    """Softmax(input) -> output   attrs: axis (opset 13: one axis)"""
    return _softmax(em)(em.x(0), int(axis))


@converter("Softmax", since=1)
def softmax_v1(em, *, axis=1):
    """Softmax(input) -> output   attrs: axis (before 13: over all axes from ``axis`` on, flattened)"""
    return _flattened(em, int(axis), _softmax(em))


@converter("Gelu", since=20)
def gelu(em, *, approximate="none"):
    """Gelu(X) -> Y   attrs: approximate ('none' | 'tanh')"""
    return f"ops.gelu({em.x(0)}, approximate={approximate!r})"


def _flattened(em, axis: int, fn) -> str:
    """``fn(x, -1)`` over the axes from ``axis`` on as one (the opset < 13 softmax family)."""
    shape = em.shape(0)
    axis = axis % len(shape)
    if axis == len(shape) - 1:
        return fn(em.x(0), -1)
    rows = (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))
    return f"ops.reshape({fn(f'ops.reshape({em.x(0)}, {rows!r})', -1)}, {tuple(shape)!r})"


@converter("LogSoftmax", since=13)
def log_softmax(em, *, axis=-1):
    """LogSoftmax(input) -> output   attrs: axis (opset 13: one axis)"""
    return f"ops.log_softmax({em.x(0)}, {int(axis)})"


@converter("LogSoftmax", since=1)
def log_softmax_v1(em, *, axis=1):
    """LogSoftmax(input) -> output   attrs: axis (before 13: over all axes from ``axis`` on, flattened)"""
    return _flattened(em, int(axis), lambda x, ax: f"ops.log_softmax({x}, {ax})")


def _hardmax(em, x: str, axis: int, depth: int) -> str:
    one_hot = f"ops.one_hot(ops.argmax({x}, {axis}), {depth}, 1.0, 0.0, {axis})"  # float32; ties: the first
    return one_hot if em.dtype(0) == np.float32 else f"ops.cast({one_hot}, {ms_dtype(em.dtype(0))})"


@converter("Hardmax", since=13)
def hardmax(em, *, axis=-1):
    """Hardmax(input) -> output   attrs: axis (1 at the first maximum along the axis, else 0)"""
    axis = int(axis) % em.rank(0)
    return _hardmax(em, em.x(0), axis, em.shape(0)[axis])


@converter("Hardmax", since=1)
def hardmax_v1(em, *, axis=1):
    """Hardmax(input) -> output   attrs: axis (before 13: over all axes from ``axis`` on, flattened)"""
    depth = int(np.prod(em.shape(0)[int(axis) % em.rank(0) :], dtype=np.int64))
    return _flattened(em, int(axis), lambda x, ax: _hardmax(em, x, ax, depth))


@converter("PRelu", since=1)
def prelu(em):
    """PRelu(X, slope) -> Y = X if X >= 0 else slope * X   (slope broadcast to X)"""
    x = em.x(0)
    slope = em.const(1)
    shape, dtype = em.shape(0), em.dtype(0)
    if slope is not None and dtype in (np.float16, np.float32) and len(shape) >= 2:
        aligned = (1,) * (len(shape) - slope.ndim) + slope.shape
        channels = int(shape[1])
        if slope.size == 1 or (aligned[1] == channels and int(np.prod(aligned)) == channels):
            weight = np.broadcast_to(slope.reshape(-1), (channels,)).astype(dtype)
            if dtype == np.float16:  # nn.PReLU's weight is float32
                return f"ops.prelu({x}, {em.tensor(weight, 'slope')})"
            layer = em.layer("nn.PReLU", channels, params={"w": weight})
            return f"{layer}({x})"
    return f"ops.where({x} < 0, {x} * {em.operand(1)}, {x})"


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * abs(b)


@converter("Elu", since=6)
def elu(em, *, alpha=1.0):
    """Elu(X) -> Y = X if X > 0 else alpha * (exp(X) - 1)"""
    if _close(alpha, 1.0):
        return f"ops.elu({em.x(0)})"
    return f"ops.where({em.x(0)} > 0, {em.x(0)}, {literal(float(alpha))} * ops.expm1({em.x(0)}))"


@converter("Selu", since=6)
def selu(em, *, alpha=_SELU_ALPHA, gamma=_SELU_GAMMA):
    """Selu(X) -> Y = gamma * (X if X > 0 else alpha * (exp(X) - 1))"""
    if _close(alpha, _SELU_ALPHA) and _close(gamma, _SELU_GAMMA):
        return f"ops.selu({em.x(0)})"
    x = em.x(0)
    return f"{literal(float(gamma))} * ops.where({x} > 0, {x}, {literal(float(alpha))} * ops.expm1({x}))"


@converter("Celu", since=12)
def celu(em, *, alpha=1.0):
    """Celu(X) -> Y = max(0, X) + min(0, alpha * (exp(X / alpha) - 1))"""
    return f"ops.celu({em.x(0)}, {literal(float(alpha))})" if not _close(alpha, 1.0) else f"ops.celu({em.x(0)})"


@converter("ThresholdedRelu", since=10)
def thresholded_relu(em, *, alpha=1.0):
    """ThresholdedRelu(X) -> Y = X if X > alpha else 0"""
    return f"ops.threshold({em.x(0)}, {literal(float(alpha))}, 0.0)"


@converter("Shrink", since=9)
def shrink(em, *, bias=0.0, lambd=0.5):
    """Shrink(input) -> output = x - bias if x > lambd, x + bias if x < -lambd, else 0"""
    x, dtype = em.x(0), em.dtype(0)
    if dtype in (np.float16, np.float32):
        if bias == 0:
            return f"ops.hardshrink({x}, {literal(float(lambd))})"
        if bias == lambd:
            return f"ops.softshrink({x}, {literal(float(lambd))})"
    wide = x if dtype.kind == "f" else f"ops.cast({x}, ms.float64)"
    b, lam = literal(float(bias)), literal(float(lambd))
    formula = f"ops.where({wide} > {lam}, {wide} - {b}, ops.where({wide} < -{lam}, {wide} + {b}, 0.0))"
    return formula if dtype.kind == "f" else f"ops.cast({formula}, {ms_dtype(dtype)})"


@converter("Swish", since=24)
def swish(em, *, alpha=1.0):
    """Swish(X) -> Y = X * sigmoid(alpha * X)"""
    if _close(alpha, 1.0):
        return f"ops.silu({em.x(0)})"
    return f"{em.x(0)} * ops.sigmoid({literal(float(alpha))} * {em.x(0)})"


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
