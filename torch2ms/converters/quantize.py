"""Quantization: QuantizeLinear / DequantizeLinear (per tensor, per axis, per block),
DynamicQuantizeLinear, and the integer ops MatMulInteger, QLinearMatMul, QLinearConv
(ConvInteger is in conv.py).

A QDQ model converts with the exact fake-quant arithmetic onnxruntime uses, in float32::

    QuantizeLinear     y = saturate(round(x / scale) + zero_point)      round: half to even
    DequantizeLinear   y = (x - zero_point) * scale
    QLinear*           acc = (a - a_zero_point) @ (b - b_zero_point) [+ bias]          (int32)
                       y = saturate(round(acc * (a_scale * b_scale / y_scale)) + y_zero_point)

``ops.round`` rounds half to even like onnxruntime's ``nearbyint``; ``saturate`` clamps to the
output type's range; the multiplier ``a_scale * b_scale / y_scale`` is computed in float32 in
that order, as onnxruntime does. Integer matrix products run as int32 ``ops.matmul`` (exact).
MindSpore's CPU convolution is float32 only: an integer convolution is exact there when every
partial sum stays below 2**24 in magnitude (integers up to 2**24 are exact in float32, in any
summation order); the bound is checked from the constant weights and the input type's range, and
a weight whose bound is too large is split into 16 * high + low, two convolutions that each stay
exact, added in int32. float8, int4, int2 and float4 types have no MindSpore dtype and are refused.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, literal, ms_dtype
from torch2ms.converters.conv import conv_geometry

# ONNX element type -> (numpy dtype, min, max) of the quantized types MindSpore has
_QTYPES = {
    2: (np.uint8, 0, 255),
    3: (np.int8, -128, 127),
    4: (np.uint16, 0, 65535),
    5: (np.int16, -32768, 32767),
}
_BY_NAME = {np.dtype(t).name: (t, lo, hi) for t, lo, hi in _QTYPES.values()}
_EXACT = 2**24  # float32 holds every integer up to this magnitude


def _qtype(dtype) -> tuple:
    name = np.dtype(dtype).name
    if name not in _BY_NAME:
        raise Unsupported(f"quantized dtype {name} not supported (uint8, int8, uint16, int16)")
    return _BY_NAME[name]


def _broadcast(em, i: int, shape, axis: int, dtype, what: str, block_size: int = 0) -> str | None:
    """Input ``i`` (a scale or zero point, per tensor, per ``axis`` of ``shape`` or per block) as an
    expression of ``dtype`` that broadcasts against ``shape``; None for an absent or all-zero zero
    point. Constants become literals or stored tensors, runtime values a cast and a reshape."""
    if not em.has_input(i):
        return None
    rank, axis = len(shape), axis % len(shape)
    per_axis = [-1 if a == axis else 1 for a in range(rank)]
    c = em.const(i)
    if c is None:
        size = int(np.prod(em.shape(i)))
        expr = em.x(i) if em.dtype(i) == dtype else f"ops.cast({em.x(i)}, {ms_dtype(dtype)})"
        if size == 1:
            return expr
        if block_size or size != shape[axis]:
            raise Unsupported(f"{what} (input {i}) must be a constant (per block, or shaped {list(em.shape(i))})")
        return expr if axis == rank - 1 else f"ops.reshape({expr}, {tuple(per_axis)})"
    if what.endswith("zero_point") and not c.any():
        return None
    if c.size == 1:
        value = np.asarray(c).reshape(()).item()
        return literal(int(value) if what.endswith("zero_point") else np.asarray(value, dtype).item())
    if block_size:
        if c.ndim != rank:
            raise Unsupported(f"{what} of shape {list(c.shape)} for block_size={block_size}")
        c = np.repeat(c, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    elif c.ndim != 1 or c.shape[0] != shape[axis]:
        raise Unsupported(f"{what} of shape {list(c.shape)} (not one per element of axis {axis})")
    else:
        c = c.reshape(per_axis)
    return em.tensor(c.astype(dtype), f"{em.name_hint('q')}_{what}")


def _saturate(expr: str, lo: int, hi: int, dtype) -> str:
    return f"ops.cast(ops.clamp({expr}, {lo}, {hi}), {ms_dtype(dtype)})"


@converter("QuantizeLinear", since=10)
def quantize_linear(em, *, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
    """QuantizeLinear(x, y_scale, y_zero_point?) -> y = saturate(round(x / y_scale) + y_zero_point)"""
    if em.dtype(0) != np.float32 or em.dtype(1) != np.float32:
        raise Unsupported(f"x dtype {em.dtype(0).name} / y_scale dtype {em.dtype(1).name} (float32 only)")
    if precision not in (0, 1):
        raise Unsupported(f"precision={precision} (float32 division only)")
    dtype, lo, hi = _qtype(em.out_dtype(0))
    scale = _broadcast(em, 1, em.shape(0), axis, np.float32, "scale", block_size)
    zero_point = _broadcast(em, 2, em.shape(0), axis, np.float32, "zero_point", block_size)
    value = f"ops.round({em.x(0)} / {scale})"
    if zero_point is not None:
        value = f"{value} + {zero_point}"
    return _saturate(value, lo, hi, dtype)


@converter("DequantizeLinear", since=10)
def dequantize_linear(em, *, axis=1, block_size=0, output_dtype=0):
    """DequantizeLinear(x, x_scale, x_zero_point?) -> y = (x - x_zero_point) * x_scale"""
    if em.dtype(1) != np.float32:
        raise Unsupported(f"x_scale dtype {em.dtype(1).name} (float32 only)")
    if output_dtype not in (0, 1):
        raise Unsupported(f"output_dtype={output_dtype} (float32 only)")
    if em.dtype(0) == np.int32:
        if em.has_input(2) and (em.const(2) is None or em.const(2).any()):
            raise Unsupported("x_zero_point must be 0 for int32 x")
        x, zero_point = f"ops.cast({em.x(0)}, ms.float32)", None
    else:
        _qtype(em.dtype(0))
        x = f"ops.cast({em.x(0)}, ms.float32)"
        zero_point = _broadcast(em, 2, em.shape(0), axis, np.float32, "zero_point", block_size)
    if zero_point is not None:
        x = f"({x} - {zero_point})"
    return f"{x} * {_broadcast(em, 1, em.shape(0), axis, np.float32, 'scale', block_size)}"


_DYNAMIC = '''
def onnx_dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear as onnxruntime computes it: uint8 over [min(x, 0), max(x, 0)]; scale 1 if that
    range is empty. Returns y, y_scale, y_zero_point."""
    low, high = ops.minimum(ops.amin(x), 0.0), ops.maximum(ops.amax(x), 0.0)
    scale = ops.where(high == low, ops.ones_like(high), (high - low) / 255.0)
    zero_point = ops.round(ops.clamp(-low / scale, 0.0, 255.0))
    y = ops.clamp(ops.round(x / scale) + zero_point, 0.0, 255.0)
    return ops.cast(y, ms.uint8), scale, ops.cast(zero_point, ms.uint8)
'''


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(em):
    """DynamicQuantizeLinear(x) -> y, y_scale, y_zero_point   (uint8 over [min(x, 0), max(x, 0)])"""
    if em.dtype(0) != np.float32:
        raise Unsupported(f"x dtype {em.dtype(0).name} (float32 only)")
    call = f"{em.define('onnx_dynamic_quantize_linear', _DYNAMIC)}({em.x(0)})"
    n = len(em.node.outputs)
    return call if n == 3 else f"{call}[0]" if n == 1 else f"{call}[:2]"


# --- integer products -------------------------------------------------------------------------


def _shifted(em, i: int, zp: int, what: str, axis: int) -> str:
    """Integer input ``i`` minus its zero point (input ``zp``, per tensor or per ``axis``) in int32:
    a stored constant when both are constants."""
    _qtype(em.dtype(i))
    c, zc = em.const(i), em.const(zp) if em.has_input(zp) else np.zeros((), np.int64)
    if c is not None and zc is not None:
        zc = zc.reshape(() if zc.size == 1 else [-1 if a == axis % c.ndim else 1 for a in range(c.ndim)])
        return em.tensor((c.astype(np.int64) - zc).astype(np.int32), f"{em.name_hint('q')}_{what}")
    x = f"ops.cast({em.x(i)}, ms.int32)"
    zero_point = _broadcast(em, zp, em.shape(i), axis, np.int32, f"{what}_zero_point")
    return x if zero_point is None else f"({x} - {zero_point})"


def _int_matmul(em, a: int, a_zp: int, b: int, b_zp: int) -> str:
    """``(A - a_zp) @ (B - b_zp)`` in int32 (a_zp per row, b_zp per column); A of rank > 2 times a
    2-D B as one 2-D product."""
    lhs, rhs = _shifted(em, a, a_zp, "a", -2), _shifted(em, b, b_zp, "b", -1)
    sa, sb = em.shape(a), em.shape(b)
    if len(sa) > 2 and len(sb) == 2:
        rows = int(np.prod(sa[:-1]))
        flat = f"ops.matmul(ops.reshape({lhs}, {(rows, int(sa[-1]))}), {rhs})"
        return f"ops.reshape({flat}, {em.shape_code(tuple(sa[:-1]) + (int(sb[-1]),))})"
    return f"ops.matmul({lhs}, {rhs})"


@converter("MatMulInteger", since=10)
def matmul_integer(em):
    """MatMulInteger(A, B, a_zero_point?, b_zero_point?) -> Y = (A - a_zero_point) @ (B - b_zero_point) in int32"""
    return _int_matmul(em, 0, 2, 1, 3)


def _requantize(em, acc: str, scales: tuple[int, int, int], y_zp: int, axis: int) -> str:
    """``saturate(round(acc * (a_scale * b_scale / y_scale)) + y_zero_point)``; the multiplier in
    float32 in onnxruntime's order (float16 scales widened first), b_scale per tensor or per
    ``axis`` of the output."""
    for i in scales:  # float16 scales are widened first, as onnxruntime does
        if em.dtype(i) not in (np.float32, np.float16):
            raise Unsupported(f"scale dtype {em.dtype(i).name} (float32 or float16)")
    out = em.out_shape(0)
    consts = [em.const(i) for i in scales]
    if all(c is not None for c in consts):
        a, b, y = (np.asarray(c, np.float32) for c in consts)
        if b.size > 1:
            b = b.reshape([-1 if k == axis % len(out) else 1 for k in range(len(out))])
        m = (a.reshape(()) * b) / y.reshape(())
        multiplier = literal(m.item()) if m.size == 1 else em.tensor(m, f"{em.name_hint('q')}_multiplier")
    else:
        a, b, y = (
            _broadcast(em, i, out, axis, np.float32, name) for i, name in zip(scales, ("a_scale", "b_scale", "y_scale"))
        )
        multiplier = f"({a} * {b} / {y})"
    dtype, lo, hi = _qtype(em.out_dtype(0))
    value = f"ops.round(ops.cast({acc}, ms.float32) * {multiplier})"
    zero_point = _broadcast(em, y_zp, out, axis, np.float32, "y_zero_point")
    if zero_point is not None:
        value = f"{value} + {zero_point}"
    return _saturate(value, lo, hi, dtype)


@converter("QLinearMatMul", since=10)
def qlinear_matmul(em):
    """QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point) -> y"""
    return _requantize(em, _int_matmul(em, 0, 2, 3, 5), (1, 4, 6), 7, -1)


# --- integer convolutions -----------------------------------------------------------------------


def _conv_kwargs(em, w: int, auto_pad, dilations, group, kernel_shape, pads, strides) -> dict:
    """nn.Conv2d keyword arguments from ONNX Conv attributes; ``w``: the weight's input index."""
    kw = {**conv_geometry(em, kernel_shape, strides, dilations, pads, auto_pad, weight=w), "has_bias": False}
    if group != 1:
        kw["group"] = int(group)
    return kw


def _int_conv(em, x: int, x_zp: int, w: int, w_zp: int, attrs: dict) -> str:
    """``conv(X - x_zp, W - w_zp)`` as an int32 expression, exact in float32 (see the module docstring)."""
    x_type = _qtype(em.dtype(x))
    weight = em.require_const(w, "w")
    _qtype(weight.dtype)
    wzp = em.require_const(w_zp, "w_zero_point").astype(np.int64) if em.has_input(w_zp) else np.zeros(1, np.int64)
    shifted = weight.astype(np.int64) - wzp.reshape(-1, 1, 1, 1)
    xzp = em.const(x_zp) if em.has_input(x_zp) else np.zeros(1, np.int64)
    # the largest |X - x_zp|: from the type's range, about the zero point if it is known
    largest_x = x_type[2] - x_type[1] if xzp is None else max(int(xzp.item()) - x_type[1], x_type[2] - int(xzp.item()))
    # the largest partial sum of an output channel: |W - w_zp| summed over its window, times the largest |X - x_zp|
    parts = [shifted]
    if np.abs(shifted).reshape(len(shifted), -1).sum(axis=1).max(initial=0) * largest_x >= _EXACT:
        high = np.floor_divide(shifted, 16)
        parts = [high, shifted - 16 * high]  # W - w_zp = 16 * high + low, 0 <= low < 16
        if max(np.abs(p).reshape(len(p), -1).sum(axis=1).max() for p in parts) * largest_x >= _EXACT:
            raise Unsupported("w: the integer convolution's partial sums can exceed 2**24 (not exact in float32)")
    kw = _conv_kwargs(em, w, **attrs)
    cin, cout = int(em.shape(x)[1]), int(weight.shape[0])
    xin = f"ops.cast({em.x(x)}, ms.float32)"
    zero_point = _broadcast(em, x_zp, em.shape(x), 1, np.float32, "x_zero_point")
    if zero_point is not None:
        xin = f"({xin} - {zero_point})"
    if len(parts) == 1:
        layer = em.layer("nn.Conv2d", cin, cout, params={"weight": shifted.astype(np.float32)}, **kw)
        return f"ops.cast({layer}({xin}), ms.int32)"
    high = em.layer("nn.Conv2d", cin, cout, params={"weight": parts[0].astype(np.float32)}, **kw)
    low = em.layer("nn.Conv2d", cin, cout, params={"weight": parts[1].astype(np.float32)}, **kw)
    # W - w_zp = 16 * high + low: two convolutions whose partial sums stay exact in float32
    return f"16 * ops.cast({high}({xin}), ms.int32) + ops.cast({low}({xin}), ms.int32)"


@converter("QLinearConv", since=10)
def qlinear_conv(em, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B?) -> y"""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    acc = _int_conv(em, 0, 2, 3, 5, attrs)
    bias = _broadcast(em, 8, em.out_shape(0), 1, np.int32, "bias")
    if bias is not None:
        acc = f"{acc} + {bias}"
    return _requantize(em, acc, (1, 4, 6), 7, 1)
