"""ONNX ``pads`` / ``auto_pad`` of a convolution or pooling window as explicit pads: the one place
``auto_pad=SAME_*`` is resolved (ConvTranspose's ``SAME_*`` fixes the output size instead:
``conv_transpose.transpose_pads``).

``SAME_UPPER`` / ``SAME_LOWER`` pad so that ``out = ceil(in / stride)``; the total pad per axis is
``max((out - 1) * stride + (kernel - 1) * dilation + 1 - in, 0)``, and the odd pixel goes at the
end (``SAME_UPPER``) or at the beginning (``SAME_LOWER``).
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported


def explicit_pads(sizes, kernel, strides, dilations, pads, auto_pad: str) -> tuple[list[int], list[int]]:
    """(begins, ends) per spatial axis of an input of spatial ``sizes``; ``pads`` are ONNX's
    ``[begins..., ends...]`` (None: no padding)."""
    n = len(sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            total = max((-(-int(size) // s) - 1) * s + (k - 1) * d + 1 - int(size), 0)
            small = total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
        return begins, ends
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    if auto_pad != "NOTSET":
        raise Unsupported(f"auto_pad={auto_pad!r} not supported")
    pads = [int(p) for p in (pads or [0] * (2 * n))]
    return pads[:n], pads[n:]
