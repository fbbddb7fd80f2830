"""Resize / Upsample with a static output size (read from the graph's inferred shapes).

ONNX ``coordinate_transformation_mode`` ``half_pixel``/``pytorch_half_pixel`` is PyTorch's
``align_corners=False``; ``align_corners`` is ``align_corners=True``.
"""

from __future__ import annotations

from torch2ms.converters.registry import Unsupported, converter

_LINEAR_CTM = {"half_pixel": False, "pytorch_half_pixel": False, "align_corners": True}


@converter("Resize", since=11)
def resize(
    em,
    *,
    mode="nearest",
    coordinate_transformation_mode="half_pixel",
    nearest_mode="round_prefer_floor",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    antialias=0,
    axes=None,
    keep_aspect_ratio_policy="stretch",
):
    """Resize(X, roi?, scales?, sizes?) -> Y   attrs: mode, coordinate_transformation_mode, nearest_mode, ..."""
    if em.rank(0) != 4:
        raise Unsupported(f"only 4-D (NCHW) inputs are supported (rank {em.rank(0)})")
    if antialias:
        raise Unsupported("antialias=1 not supported")
    if tuple(em.shape(0)[:2]) != tuple(em.out_shape()[:2]):
        raise Unsupported("resizing the batch or channel axis is not supported")
    size = tuple(int(d) for d in em.out_shape()[2:])
    x = em.x(0)
    if mode == "linear":
        if coordinate_transformation_mode not in _LINEAR_CTM:
            raise Unsupported(f"mode='linear' with coordinate_transformation_mode={coordinate_transformation_mode!r} not supported")
        if coordinate_transformation_mode == "pytorch_half_pixel" and min(size) == 1:
            raise Unsupported("pytorch_half_pixel to an output size of 1 not supported")
        return f'ops.interpolate({x}, size={size!r}, mode="bilinear", align_corners={_LINEAR_CTM[coordinate_transformation_mode]})'
    if mode == "nearest":
        if coordinate_transformation_mode != "asymmetric" or nearest_mode != "floor":
            raise Unsupported(f"mode='nearest' needs coordinate_transformation_mode='asymmetric' and nearest_mode='floor' (got {coordinate_transformation_mode!r}, {nearest_mode!r})")
        return f'ops.interpolate({x}, size={size!r}, mode="nearest")'
    raise Unsupported(f"mode={mode!r} not supported")
