"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

ONNX ``pads`` are ``[top, left, bottom, right]``. MindSpore's pooling layers pad symmetrically
only (``padding=(h, w)``), so asymmetric pads (and ``auto_pad=SAME_*``, computed like ONNX)
become an explicit ``ops.pad`` first, with ``-inf`` before a max pool and zeros before an average
pool. An average pool that must not count that padding (``count_include_pad=0``) then multiplies
by a constant ``window size / real elements`` tensor.

``ceil_mode``: MindSpore's ``ceil_mode=True`` follows PyTorch/ONNX (a last window that would start
in the end padding is dropped) but is refused with ``pad_mode='valid'``, so it is always written
with ``pad_mode='pad'``.
"""

from __future__ import annotations

import math

import numpy as np

from torch2ms.converters.api import Unsupported, converter


def same_pads(sizes, kernel, strides, dilations, auto_pad: str) -> list[int]:
    """ONNX ``auto_pad=SAME_UPPER/SAME_LOWER`` as explicit ``[begins..., ends...]`` pads."""
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def _squash(values) -> int | tuple:
    values = tuple(int(v) for v in values)
    return values[0] if len(set(values)) == 1 else values


def _geometry(em, kernel_shape, strides, pads, dilations, auto_pad):
    if em.rank(0) != 4:
        raise Unsupported(f"only 2-D pooling is supported (input rank {em.rank(0)})")
    kernel = tuple(int(k) for k in kernel_shape)
    strides = tuple(int(s) for s in (strides or (1, 1)))
    dilations = tuple(int(d) for d in (dilations or (1, 1)))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(em.shape(0)[2:], kernel, strides, dilations, auto_pad)
    elif auto_pad == "VALID":
        pads = None
    elif auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    pads = tuple(int(p) for p in (pads or (0, 0, 0, 0)))
    return kernel, strides, dilations, pads


def _layer_kwargs(kernel, strides, pads, ceil_mode) -> dict:
    kw = {"kernel_size": _squash(kernel), "stride": _squash(strides)}
    if any(pads) or ceil_mode:
        kw["pad_mode"] = "pad"  # ceil_mode is refused with the default pad_mode='valid'
    if any(pads):
        kw["padding"] = _squash(pads[:2])
    if ceil_mode:
        kw["ceil_mode"] = True
    return kw


def _explicit_pad(x: str, pads, value: str = "") -> str:
    top, left, bottom, right = pads
    return f"ops.pad({x}, {(left, right, top, bottom)!r}{value})"  # ops.pad: last axis first


@converter("MaxPool", since=1)
def max_pool(
    em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0, strides=None
):
    """MaxPool(X) -> Y, Indices?   attrs: kernel_shape, strides, pads, auto_pad, ceil_mode, dilations"""
    if len([o for o in em.node.outputs if o]) > 1:
        raise Unsupported("the Indices output is not supported")
    kernel, strides, dilations, pads = _geometry(em, kernel_shape, strides, pads, dilations, auto_pad)
    x = em.x(0)
    if pads[:2] != pads[2:]:
        x, pads = _explicit_pad(x, pads, ', value=float("-inf")'), (0, 0, 0, 0)
    kw = _layer_kwargs(kernel, strides, pads, ceil_mode)
    if any(d != 1 for d in dilations):
        kw["pad_mode"] = "pad"  # MindSpore takes dilation with pad_mode='pad' only
        kw["dilation"] = _squash(dilations)
    layer = em.layer("nn.MaxPool2d", **kw)
    return f"{layer}({x})"


def _divisor_correction(in_size: int, out_size: int, k: int, s: int, pad_begin: int, pad_end: int) -> np.ndarray:
    """Along one axis, per output position: what the pool divides by (window elements inside the
    explicitly padded input; ceil_mode's overhang is not counted) / elements inside the input."""
    starts = np.arange(out_size) * s
    in_padded = np.minimum(starts + k, pad_begin + in_size + pad_end) - starts
    real = np.minimum(starts + k, pad_begin + in_size) - np.maximum(starts, pad_begin)
    return in_padded / real


@converter("AveragePool", since=1)
def average_pool(
    em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, pads=None, strides=None, dilations=None
):
    """AveragePool(X) -> Y   attrs: kernel_shape, strides, pads, auto_pad, ceil_mode, count_include_pad"""
    kernel, strides, dilations, pads = _geometry(em, kernel_shape, strides, pads, dilations, auto_pad)
    if any(d != 1 for d in dilations):
        raise Unsupported(f"dilations={list(dilations)} not supported")
    if pads[:2] == pads[2:]:
        kw = _layer_kwargs(kernel, strides, pads, ceil_mode)
        if any(pads) and not count_include_pad:
            kw["count_include_pad"] = False
        return f"{em.layer('nn.AvgPool2d', **kw)}({em.x(0)})"
    layer = em.layer("nn.AvgPool2d", **_layer_kwargs(kernel, strides, (0, 0, 0, 0), ceil_mode))
    expr = f"{layer}({_explicit_pad(em.x(0), pads)})"
    if not count_include_pad:
        (h, w), (oh, ow) = em.shape(0)[2:], em.out_shape()[2:]
        rows = _divisor_correction(h, oh, kernel[0], strides[0], pads[0], pads[2])
        cols = _divisor_correction(w, ow, kernel[1], strides[1], pads[1], pads[3])
        factor = np.outer(rows, cols).astype(em.value(0).dtype or np.float32)
        if not np.all(factor == 1):
            expr = f"{expr} * {em.tensor(factor.reshape(1, 1, oh, ow), (em.layer_name or 'pool') + '_divisor')}"
    return expr


@converter("GlobalAveragePool", since=1)
def global_average_pool(em):
    """GlobalAveragePool(X) -> Y   (mean over all spatial axes, kept)"""
    axes = tuple(range(2, em.rank(0)))
    return f"ops.mean({em.x(0)}, axis={axes!r}, keep_dims=True)"


@converter("GlobalMaxPool", since=1)
def global_max_pool(em):
    """GlobalMaxPool(X) -> Y   (max over all spatial axes, kept)"""
    axes = tuple(range(2, em.rank(0)))
    return f"ops.amax({em.x(0)}, axis={axes!r}, keepdims=True)"
