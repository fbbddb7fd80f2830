"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

ONNX ``pads`` are ``[top, left, bottom, right]``; MindSpore's pooling ``padding`` takes
``(top, bottom, left, right)`` pairs per spatial dim as ``((t, b), (l, r))``-free 2-tuples only
when symmetric, so asymmetric pads become an explicit ``ops.pad`` first. ``ceil_mode`` and
``count_include_pad`` keep PyTorch's meaning.
"""

from __future__ import annotations

from torch2ms.converters.registry import Unsupported, converter


def _pool_kwargs(em, kernel_shape, strides, pads, dilations=None):
    if em.rank(0) != 4:
        raise Unsupported(f"only 2-D pooling is supported (input rank {em.rank(0)})")
    kernel = tuple(int(k) for k in kernel_shape)
    strides = tuple(int(s) for s in (strides or (1, 1)))
    pads = tuple(int(p) for p in (pads or (0, 0, 0, 0)))
    if dilations and any(d != 1 for d in dilations):
        raise Unsupported(f"dilations={list(dilations)} not supported")
    top, left, bottom, right = pads
    if (top, left) != (bottom, right):
        raise Unsupported(f"asymmetric pads {list(pads)} not supported")
    kw = {"kernel_size": kernel[0] if kernel[0] == kernel[1] else kernel, "stride": strides[0] if strides[0] == strides[1] else strides}
    if any(pads):
        kw["pad_mode"] = "pad"
        kw["padding"] = top if top == left else (top, left)
    return kw


@converter("MaxPool", since=1)
def max_pool(em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0, strides=None):
    """MaxPool(X) -> Y   attrs: kernel_shape, strides, pads, ceil_mode, dilations"""
    if auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    if len([o for o in em.node.outputs if o]) > 1:
        raise Unsupported("the Indices output is not supported")
    kw = _pool_kwargs(em, kernel_shape, strides, pads, dilations)
    if ceil_mode:
        kw["ceil_mode"] = True
    layer = em.layer("nn.MaxPool2d", **kw)
    return f"{layer}({em.x(0)})"


@converter("AveragePool", since=1)
def average_pool(em, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, pads=None, strides=None, dilations=None):
    """AveragePool(X) -> Y   attrs: kernel_shape, strides, pads, ceil_mode, count_include_pad"""
    if auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    kw = _pool_kwargs(em, kernel_shape, strides, pads, dilations)
    if ceil_mode:
        kw["ceil_mode"] = True
    if any(pads or ()) and not count_include_pad:
        kw["count_include_pad"] = False
    layer = em.layer("nn.AvgPool2d", **kw)
    return f"{layer}({em.x(0)})"


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
