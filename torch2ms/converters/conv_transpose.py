"""Transposed convolution: ONNX ``ConvTranspose`` over 1, 2 or 3 spatial axes.

Along one axis, with input length ``n``, kernel ``k``, stride ``s``, dilation ``d``, the full
transposed convolution is ``F = s * (n - 1) + (k - 1) * d + 1`` long; ONNX keeps
``F[pad_begin : pad_begin + out]`` of it, where ``out = F + output_padding - pad_begin - pad_end``
(positions past ``F`` hold only the bias). ``output_shape`` and ``auto_pad=SAME_*`` instead fix
``out`` and derive the pads from ``total = F + output_padding - out`` as the spec and
onnxruntime do: ``SAME_UPPER`` cuts the odd pixel at the end (``pad_begin = total // 2``), the
other modes at the beginning (``pad_begin = total - total // 2``).

MindSpore's ``nn.Conv2dTranspose(output_padding=p)`` zero-pads its result after adding the bias,
so it matches PyTorch/ONNX only where those ``p`` rows get no contribution and there is no bias.
So ``output_padding`` is folded into the crop instead: the layer gets ``padding = (pad_begin,
F - pad_begin - out)`` (asymmetric padding crops exactly), and only where ``out`` reaches past
``F`` is the rest an ``output_padding`` (bias then added outside the 2-D layer).
``nn.Conv3dTranspose`` pads correctly itself but refuses a dilation along depth: that dilation is
written into the weights (zeros between the taps). ``nn.Conv1dTranspose`` pads both ends alike;
any other 1-D case runs as ``nn.Conv2dTranspose`` over a height-1 image. A float16 transposed
convolution runs as float32 (weights stored in float32) between two casts.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, squash
from torch2ms.converters.conv import stride_dilation_group


def transpose_pads(em, kernel, strides, dilations, output_padding, pads, auto_pad, output_shape) -> list[int]:
    """Begin pad per spatial axis (the part of the full result cut off at the start)."""
    n = em.rank(0) - 2
    sizes = em.shape(0)[2:]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        targets = list(output_shape) if output_shape is not None else [size * s for size, s in zip(sizes, strides)]
        begins = []
        for size, k, s, d, p, out in zip(sizes, kernel, strides, dilations, output_padding, targets):
            total = max(s * (size - 1) + p + (k - 1) * d + 1 - int(out), 0)
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        return begins
    if auto_pad == "VALID":
        return [0] * n
    if auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    return [int(p) for p in (pads or [0] * (2 * n))[:n]]


def _dilate_depth(w: np.ndarray, d: int) -> np.ndarray:
    """Weights (C_in, C_out/g, kD, kH, kW) with ``d - 1`` zero planes between depth taps."""
    k = w.shape[2]
    out = np.zeros(w.shape[:2] + ((k - 1) * d + 1,) + w.shape[3:], w.dtype)
    out[:, :, ::d] = w
    return out


@converter("ConvTranspose", since=1)
def conv_transpose(
    em,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    """ConvTranspose(X, W, B?) -> Y   attrs: those of Conv, output_padding, output_shape; 1-D, 2-D, 3-D"""
    rank = em.rank(0)
    if rank not in (3, 4, 5):
        raise Unsupported(f"input rank {rank} not supported (1-D, 2-D or 3-D transposed convolution)")
    n = rank - 2
    w = em.require_const(1, "weight")
    kernel = [int(k) for k in (kernel_shape or w.shape[2:])]
    strides = [int(s) for s in (strides or [1] * n)]
    dilations = [int(d) for d in (dilations or [1] * n)]
    output_padding = [int(p) for p in (output_padding or [0] * n)]
    begins = transpose_pads(em, kernel, strides, dilations, output_padding, pads, auto_pad, output_shape)
    # Per axis: the crop at the end of the full result, or (negative) how far the output reaches past it.
    ends = [
        s * (size - 1) + (k - 1) * d + 1 - b - out
        for size, k, s, d, b, out in zip(em.shape(0)[2:], kernel, strides, dilations, begins, em.out_shape()[2:])
    ]
    extra = [max(-e, 0) for e in ends]
    ends = [max(e, 0) for e in ends]
    if any(b < 0 for b in begins):
        raise Unsupported(f"pads={list(pads or [])} with a negative begin pad not supported")
    if any(p >= max(s, d) for p, s, d in zip(extra, strides, dilations)):
        raise Unsupported(f"output_shape={list(output_shape or [])} beyond the full transposed convolution")
    c_in, c_out = int(em.shape(0)[1]), int(w.shape[1]) * int(group)
    bias = em.require_const(2, "bias") if em.has_input(2) else None
    if n == 3 and dilations[0] != 1:  # nn.Conv3dTranspose takes no dilation along depth
        w, kernel[0], dilations[0] = _dilate_depth(w, dilations[0]), (kernel[0] - 1) * dilations[0] + 1, 1
    x = em.x(0)
    half = em.dtype(0) == np.float16  # computed in float32 by a float32 layer, then cast back
    if half:
        x, w, bias = (
            f"ops.cast({x}, ms.float32)",
            w.astype(np.float32),
            None if bias is None else bias.astype(np.float32),
        )
    as_2d = n == 1 and (begins[0] != ends[0] or extra[0])  # nn.Conv1dTranspose: equal pads, no output_padding
    if as_2d:
        kernel, strides, dilations = ([1] + v for v in (kernel, strides, dilations))
        begins, ends, extra = ([0] + v for v in (begins, ends, extra))
        x = f"ops.expand_dims({x}, 2)"
    bias_outside = bias is not None and any(extra) and n + as_2d == 2  # nn.Conv2dTranspose pads after its bias
    # MindSpore's "valid" gives in * stride + max(extent - stride, 0), one row too many where the
    # kernel's extent d * (k - 1) + 1 is below the stride; "pad" (0) gives ONNX's (in - 1) * stride + extent
    short = any(d * (k - 1) + 1 < s for k, s, d in zip(kernel, strides, dilations))
    kw: dict = {"pad_mode": "pad" if any(begins + ends + extra) or short else "valid"}
    if any(begins + ends):
        kw["padding"] = begins[0] if n == 1 and not as_2d else squash([v for p in zip(begins, ends) for v in p])
    if any(extra):
        kw["output_padding"] = squash(extra)
    kw.update(stride_dilation_group(strides, dilations, group))
    params = {"weight": w[:, :, None] if n == 1 else w}  # nn.Conv1dTranspose's weight is (C_in, C_out/g, 1, k)
    if bias is not None and not bias_outside:
        kw["has_bias"] = True
        params["bias"] = bias
    cls = {1: "nn.Conv1dTranspose", 2: "nn.Conv2dTranspose", 3: "nn.Conv3dTranspose"}[n + as_2d]
    layer = em.layer(cls, c_in, c_out, squash(kernel), params=params, **kw)
    expr = f"{layer}({x})"
    if bias_outside:
        expr = f"{expr} + {em.tensor(bias.reshape(-1, 1, 1), (em.layer_name or 'deconv') + '_bias')}"
    if as_2d:
        expr = f"ops.squeeze({expr}, 2)"
    return f"ops.cast({expr}, ms.float16)" if half else expr
