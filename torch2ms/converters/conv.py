"""Convolutions: ONNX ``Conv`` (1-D, 2-D, 3-D), ``ConvInteger`` (through float32, exact within
a checked bound), ``DeformConv`` (``ops.deformable_conv2d``) and the fused ``torch2ms.ConvBnAct``
made by the fusion pass (``nn.Conv2dBnAct``, or for 3-D the generated ``Conv3dBnAct`` cell).

Padding: ONNX ``pads`` are ``[top, left, bottom, right]`` (all begins, then all ends);
MindSpore's ``padding`` 4-tuple is ``(top, bottom, left, right)``, ``nn.Conv3d``'s 6-tuple
``(head, tail, top, bottom, left, right)``. ``nn.Conv1d`` pads both ends alike, so unequal 1-D
pads become an ``ops.pad`` first. We always write ``pad_mode`` explicitly: MindSpore's default
``'same'`` pads like TensorFlow (extra pad at the end), not like PyTorch; ONNX's ``auto_pad=SAME_*``
is computed into explicit pads (``padding.explicit_pads``). A float16 convolution runs as float32 (weights stored in
float32) between two casts.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, ms_dtype, squash
from torch2ms.converters.cell_activation import cell_activation, cell_batchnorm
from torch2ms.converters.padding import explicit_pads


def conv_geometry(em, kernel_shape, strides, dilations, pads, auto_pad, weight: int = 1) -> dict:
    """Keyword arguments shared by nn.Conv2d and nn.Conv2dBnAct, from ONNX Conv attributes (the
    kernel defaults to the shape of input ``weight``)."""
    if em.rank(0) != 4:
        raise Unsupported(f"only 2-D convolution is supported (input rank {em.rank(0)})")
    w = em.require_const(weight, "weight" if weight == 1 else "w")
    kernel = tuple(int(k) for k in (kernel_shape or w.shape[2:]))
    strides = tuple(int(s) for s in (strides or (1, 1)))
    dilations = tuple(int(d) for d in (dilations or (1, 1)))
    (top, left), (bottom, right) = explicit_pads(em.shape(0)[2:], kernel, strides, dilations, pads, auto_pad)
    kw: dict = {"kernel_size": squash(kernel)}
    if any(s != 1 for s in strides):
        kw["stride"] = squash(strides)
    if any((top, left, bottom, right)):
        kw["pad_mode"] = "pad"
        kw["padding"] = squash((top, bottom, left, right))
    else:
        kw["pad_mode"] = "valid"
    if any(d != 1 for d in dilations):
        kw["dilation"] = squash(dilations)
    return kw


def stride_dilation_group(strides, dilations, group) -> dict:
    """A MindSpore conv layer's ``stride``/``dilation``/``group`` keywords, where not the default 1."""
    kw = {}
    if any(s != 1 for s in strides):
        kw["stride"] = squash(strides)
    if any(d != 1 for d in dilations):
        kw["dilation"] = squash(dilations)
    if group != 1:
        kw["group"] = int(group)
    return kw


def nd_geometry(em, x, w, kernel_shape, strides, dilations, pads, auto_pad, group) -> tuple[str, int | tuple, dict]:
    """``(x, kernel_size, kw)`` for nn.Conv1d / nn.Conv3d over ``x``: ``x`` gains an ``ops.pad`` where
    a 1-D conv's two ends differ (nn.Conv1d pads both alike); ``kw``: pad_mode, padding, stride, ..."""
    n = em.rank(0) - 2
    kernel = tuple(int(k) for k in (kernel_shape or w.shape[2:]))
    strides = tuple(int(s) for s in (strides or [1] * n))
    dilations = tuple(int(d) for d in (dilations or [1] * n))
    begins, ends = explicit_pads(em.shape(0)[2:], kernel, strides, dilations, pads, auto_pad)
    kw: dict = {"pad_mode": "valid"}
    if n == 1 and begins != ends:
        x = f"ops.pad({x}, {(begins[0], ends[0])!r})"
    elif any(begins + ends):
        kw = {"pad_mode": "pad", "padding": begins[0] if n == 1 else squash([v for p in zip(begins, ends) for v in p])}
    kw.update(stride_dilation_group(strides, dilations, group))
    return x, squash(kernel), kw


def _conv_nd(em, x, w, bias, kernel_shape, strides, dilations, pads, auto_pad, group) -> str:
    """A convolution of ``x`` over 1 or 3 spatial axes: nn.Conv1d / nn.Conv3d."""
    n = em.rank(0) - 2
    x, kernel, kw = nd_geometry(em, x, w, kernel_shape, strides, dilations, pads, auto_pad, group)
    params = {"weight": w if n == 3 else w[:, :, None, :]}  # nn.Conv1d's weight is (out, in, 1, k)
    if bias is not None:
        kw["has_bias"] = True
        params["bias"] = bias
    cls = "nn.Conv1d" if n == 1 else "nn.Conv3d"
    layer = em.layer(cls, int(em.shape(0)[1]), int(w.shape[0]), kernel, params=params, **kw)
    return f"{layer}({x})"


def _conv(em, x, w, bias, kernel_shape, strides, dilations, pads, auto_pad, group) -> str:
    """``x`` (an expression for input 0's values) convolved with the constant ``w`` (+ ``bias``)."""
    if em.rank(0) in (3, 5):
        return _conv_nd(em, x, w, bias, kernel_shape, strides, dilations, pads, auto_pad, group)
    kw = conv_geometry(em, kernel_shape, strides, dilations, pads, auto_pad)
    if group != 1:
        kw["group"] = int(group)
    params = {"weight": w}
    if bias is not None:
        kw["has_bias"] = True
        params["bias"] = bias
    layer = em.layer("nn.Conv2d", int(em.shape(0)[1]), int(w.shape[0]), params=params, **kw)
    return f"{layer}({x})"


@converter("Conv", since=1)
def conv(em, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv(X, W, B?) -> Y   attrs: auto_pad, dilations, group, kernel_shape, pads, strides; 1-D, 2-D, 3-D"""
    w = em.require_const(1, "weight")
    bias = em.require_const(2, "bias") if em.has_input(2) else None
    geometry = (kernel_shape, strides, dilations, pads, auto_pad, group)
    if em.dtype(0) == np.float16:  # computed in float32 by a float32 layer, then cast back
        bias = None if bias is None else bias.astype(np.float32)
        y = _conv(em, f"ops.cast({em.x(0)}, ms.float32)", w.astype(np.float32), bias, *geometry)
        return f"ops.cast({y}, ms.float16)"
    return _conv(em, em.x(0), w, bias, *geometry)


@converter("ConvInteger", since=10)
def conv_integer(em, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ConvInteger(x, w, x_zero_point?, w_zero_point?) -> y (int32)   attrs: those of Conv; in float32, exact

    ``y = conv(x - x_zero_point, w - w_zero_point)``, computed in float32 (MindSpore's CPU
    convolutions are float-only). Every partial sum is an integer no larger than
    ``max|x - x_zero_point| * sum|w - w_zero_point|`` over one output channel; the converter checks
    that this is below 2^24, where float32 holds every integer exactly, so the result is exact.
    Padding adds zeros after the zero point is subtracted (onnxruntime pads with the zero point).
    """
    w = em.require_const(1, "w").astype(np.int64)
    x_zp = int(em.require_const(2, "x_zero_point").reshape(-1)[0]) if em.has_input(2) else 0
    w_zp = em.require_const(3, "w_zero_point").astype(np.int64) if em.has_input(3) else np.zeros(1, np.int64)
    w = w - w_zp.reshape(-1, *[1] * (w.ndim - 1))
    info = np.iinfo(em.dtype(0))
    bound = max(x_zp - int(info.min), int(info.max) - x_zp) * int(np.abs(w).reshape(len(w), -1).sum(axis=1).max())
    if bound >= 2**24:
        raise Unsupported(f"weights whose sums reach {bound} >= 2^24 not supported (not exact in float32)")
    x = f"ops.cast({em.x(0)}, ms.float32)"
    if x_zp:
        x = f"({x} - {x_zp})"
    y = _conv(em, x, w.astype(np.float32), None, kernel_shape, strides, dilations, pads, auto_pad, group)
    return f"ops.cast({y}, ms.int32)"


@converter("DeformConv", since=19)
def deform_conv(em, *, dilations=None, group=1, kernel_shape=None, offset_group=1, pads=None, strides=None):
    """DeformConv(X, W, offset, B?, mask?) -> Y   attrs: dilations, group, kernel_shape, offset_group, pads, strides

    As ``ops.deformable_conv2d``, whose offsets tensor stacks all x offsets, then all y offsets, then
    the mask (``3 * offset_group * kH * kW`` channels); ONNX interleaves ``(y, x)`` per kernel tap
    and gives the mask apart (absent: ones).
    """
    if em.rank(0) != 4:
        raise Unsupported(f"input rank {em.rank(0)} not supported (2-D deformable convolution only)")
    w = em.require_const(1, "weight")
    kh, kw = (int(k) for k in (kernel_shape or w.shape[2:]))
    sh, sw = (int(s) for s in (strides or (1, 1)))
    dh, dw = (int(d) for d in (dilations or (1, 1)))
    top, left, bottom, right = (int(p) for p in (pads or (0, 0, 0, 0)))
    taps = int(offset_group) * kh * kw
    order = np.concatenate([np.arange(taps) * 2 + 1, np.arange(taps) * 2]).astype(np.int32)  # x offsets, y offsets
    hint = em.name_hint("deform_conv")
    offsets = f"ops.gather({em.x(2)}, {em.tensor(order, hint + '_offset_order')}, 1)"
    if em.has_input(4):
        mask = em.x(4)
    else:
        n, _, oh, ow = em.out_shape()
        mask = f"ops.ones({em.shape_code((n, taps, oh, ow))}, {ms_dtype(em.dtype(0))})"
    args = [
        em.x(0),
        em.tensor(w, hint + "_weight"),
        f"ops.concat(({offsets}, {mask}), 1)",
        repr((kh, kw)),
        repr((1, 1, sh, sw)),
        repr((top, bottom, left, right)),
    ]
    if em.has_input(3):
        args.append(f"bias={em.tensor(em.require_const(3, 'B'), hint + '_bias')}")
    if (dh, dw) != (1, 1):
        args.append(f"dilations={(1, 1, dh, dw)!r}")
    if group != 1:
        args.append(f"groups={int(group)}")
    if offset_group != 1:
        args.append(f"deformable_groups={int(offset_group)}")
    return f"ops.deformable_conv2d({', '.join(args)})"


# MindSpore has nn.Conv2dBnAct but no 3-D form: the generated code defines one, with the same
# arguments and parameter names (conv.*, batchnorm.*, activation.*).
_CONV3D_BN_ACT = '''
class Conv3dBnAct(nn.Cell):
    """nn.Conv2dBnAct in 3-D: nn.Conv3d, then nn.BatchNorm3d (has_bn), then the activation."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1,
                 group=1, has_bias=False, has_bn=False, momentum=0.997, eps=1e-5, activation=None, alpha=0.2):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, pad_mode=pad_mode,
                              padding=padding, dilation=dilation, group=group, has_bias=has_bias)
        self.has_bn = has_bn
        self.has_act = activation is not None
        if has_bn:
            self.batchnorm = nn.BatchNorm3d(out_channels, eps, momentum)
        if activation == "leakyrelu":
            self.activation = nn.LeakyReLU(alpha)
        else:
            self.activation = nn.get_activation(activation) if isinstance(activation, str) else activation

    def construct(self, x):
        x = self.conv(x)
        if self.has_bn:
            x = self.batchnorm(x)
        if self.has_act:
            x = self.activation(x)
        return x
'''


@converter("ConvBnAct", domain="torch2ms")
def conv_bn_act(
    em, *, activation="", has_bn=1, epsilon=1e-5, momentum=0.9, alpha=0.01, approximate="none", **conv_attrs
):
    """torch2ms.ConvBnAct(X, W, B?, scale?, bias?, mean?, var?, slope?) -> Y: Conv [+ BatchNormalization] [+ activation]

    Inputs 3-6 (BatchNorm) are present only while ``has_bn``; after folding, the node keeps
    ``X, W, B`` and ``nn.Conv2dBnAct(has_bn=False)`` applies conv + bias + activation. ``alpha``
    is LeakyRelu's, ``approximate`` GELU's; input 7 is PReLU's slope, one per output channel.
    A 3-D convolution (rank-5 input) is the generated ``Conv3dBnAct`` cell instead.
    """
    unknown = set(conv_attrs) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}
    if unknown:
        raise Unsupported(f"attribute {sorted(unknown)} not supported")
    w = em.require_const(1, "weight")
    geometry = [conv_attrs.get(k) for k in ("kernel_shape", "strides", "dilations", "pads")]
    auto_pad, group = conv_attrs.get("auto_pad", "NOTSET"), int(conv_attrs.get("group", 1))
    if em.rank(0) == 5:
        cell = em.define("Conv3dBnAct", _CONV3D_BN_ACT)
        _, kernel, kw = nd_geometry(em, em.x(0), w, *geometry, auto_pad, group)
        kw = {"kernel_size": kernel, **kw}
    else:
        cell = "nn.Conv2dBnAct"
        kw = conv_geometry(em, *geometry, auto_pad)
        if group != 1:
            kw["group"] = group
    params = {"conv.weight": w}
    if em.has_input(2):
        kw["has_bias"] = True
        params["conv.bias"] = em.require_const(2, "bias")
    if has_bn:
        bn_kw, bn_params = cell_batchnorm(em, momentum, epsilon, default_momentum=0.997)
        if cell != "nn.Conv2dBnAct":  # nn.BatchNorm3d keeps its parameters on an inner bn2d
            bn_params = {k.replace("batchnorm.", "batchnorm.bn2d."): v for k, v in bn_params.items()}
        kw.update(bn_kw)
        params.update(bn_params)
    if activation:
        act_kw, act_params = cell_activation(em, activation, alpha, approximate, int(w.shape[0]), cell)
        kw.update(act_kw)
        params.update(act_params)
    layer = em.layer(cell, int(em.shape(0)[1]), int(w.shape[0]), params=params, **kw)
    return f"{layer}({em.x(0)})"
