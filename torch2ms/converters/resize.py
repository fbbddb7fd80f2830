"""Resize of the two spatial axes of an NCHW tensor, with a static output size.

ONNX maps output pixel ``x`` of an axis to the source coordinate (``coordinate_transformation_mode``;
``scale`` is the given scale, or ``out / in`` when sizes are given)::

    half_pixel            (x + 0.5) / scale - 0.5          PyTorch align_corners=False
    pytorch_half_pixel    the same, but 0 when out == 1
    align_corners         x * (in - 1) / (out - 1)          PyTorch align_corners=True
    asymmetric            x / scale                         PyTorch nearest
    half_pixel_symmetric  (x + 0.5) / scale - 0.5 + in / 2 * (1 - out / (scale * in))

``ops.interpolate`` (ResizeBilinearV2 / ResizeNearestNeighborV2) only takes a size and maps with
``in / out`` instead of the scale: ``(x + 0.5) * in / out - 0.5`` (bilinear), ``x * (in - 1) /
(out - 1)`` (align_corners), ``floor(x * in / out)`` (nearest), ``floor((x + 0.5) * in / out)``
(nearest-exact). The two agree when sizes are given
or ``in * scale`` is an integer, and differ otherwise (13 * 0.5 -> 6 pixels: ONNX/PyTorch sample
at 2x + 0.5, MindSpore at 13/6 (x + 0.5) - 0.5). So the converter computes both mappings here and
writes ``ops.interpolate`` when they agree; otherwise it writes the resize as what it is, a fixed
map per axis: linear as ``rows @ x @ cols`` with constant interpolation matrices, nearest as two
``ops.gather`` with constant source indices. Coordinates are computed in float32 like
onnxruntime and PyTorch.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter

_F = np.float32
# tf_half_pixel_for_nn (removed in opset 13) and tf_crop_and_resize are refused.
_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coordinates(mode: str, n_in: int, n_out: int, scale: float) -> np.ndarray:
    """ONNX's source coordinate of every output pixel along one axis (unclamped)."""
    x, s = np.arange(n_out, dtype=_F), _F(scale)
    if mode == "half_pixel":
        return (x + _F(0.5)) / s - _F(0.5)
    if mode == "pytorch_half_pixel":
        return (x + _F(0.5)) / s - _F(0.5) if n_out > 1 else np.zeros(n_out, _F)
    if mode == "align_corners":
        return x * _F(n_in - 1) / _F(n_out - 1) if n_out > 1 else np.zeros(n_out, _F)
    if mode == "asymmetric":
        return x / s
    if mode == "half_pixel_symmetric":
        offset = _F(n_in / 2) * (_F(1) - _F(n_out) / (s * _F(n_in)))
        return offset + (x + _F(0.5)) / s - _F(0.5)
    raise ValueError(mode)


def nearest_indices(coords: np.ndarray, nearest_mode: str, n_in: int) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        idx = np.ceil(coords - _F(0.5))
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(coords + _F(0.5))
    elif nearest_mode == "floor":
        idx = np.floor(coords)
    else:
        idx = np.ceil(coords)
    return np.clip(idx, 0, n_in - 1).astype(np.int64)


def linear_matrix(coords: np.ndarray, n_in: int) -> np.ndarray:
    """(out, in) matrix of linear-interpolation weights; coordinates clamped to the input like onnxruntime."""
    c = np.clip(coords, 0, n_in - 1).astype(np.float64)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = c - lo
    m = np.zeros((len(c), n_in))
    np.add.at(m, (np.arange(len(c)), lo), 1 - frac)
    np.add.at(m, (np.arange(len(c)), hi), frac)
    return m


def _ms_bilinear(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
    """What ResizeBilinearV2 samples (clamped), for comparison with ONNX."""
    x = np.arange(n_out, dtype=_F)
    if align_corners:
        c = x * (_F(n_in - 1) / _F(n_out - 1)) if n_out > 1 else np.zeros(n_out, _F)
    else:
        c = (x + _F(0.5)) * (_F(n_in) / _F(n_out)) - _F(0.5)
    return np.clip(c, 0, n_in - 1)


def _ms_nearest(n_in: int, n_out: int, exact: bool) -> np.ndarray:
    """What ResizeNearestNeighborV2 picks: ``mode="nearest"`` (exact=False) or ``"nearest-exact"``."""
    x = np.arange(n_out, dtype=_F) + (_F(0.5) if exact else _F(0))
    return np.minimum(np.floor(x * (_F(n_in) / _F(n_out))), n_in - 1).astype(np.int64)


def _is_identity(m: np.ndarray) -> bool:
    return m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(len(m)))


def _scales(em, axes, keep_aspect_ratio_policy) -> list[float]:
    """The per-axis scale ONNX uses for the coordinate mapping."""
    rank, in_shape, out_shape = em.rank(0), em.shape(0), em.out_shape()
    axes = [int(a) % rank for a in (axes or range(rank))]
    scales = em.const(2) if em.has_input(2) else None
    full = [1.0] * rank
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.tolist()):
            full[a] = float(s)
        return full
    sizes = em.require_const(3, "sizes").tolist()
    if keep_aspect_ratio_policy == "stretch":
        for a in axes:
            full[a] = float(_F(out_shape[a]) / _F(in_shape[a]))
        return full
    ratios = [_F(sizes[i]) / _F(in_shape[a]) for i, a in enumerate(axes)]
    common = min(ratios) if keep_aspect_ratio_policy == "not_larger" else max(ratios)
    for a in axes:
        full[a] = float(common)
    return full


def _same_coordinates(onnx: np.ndarray, ms: np.ndarray, n_in: int) -> bool:
    """Equal up to float32 rounding (which grows with the coordinate)."""
    return np.allclose(onnx, ms, rtol=0, atol=max(1e-5, 1e-6 * n_in))


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
    """Resize(X, roi?, scales?, sizes?) -> Y   attrs: mode, coordinate_transformation_mode, nearest_mode, axes, keep_aspect_ratio_policy"""  # noqa: E501 - the signature line is the operator table's
    ctm = coordinate_transformation_mode
    if em.rank(0) != 4:
        raise Unsupported(f"only 4-D (NCHW) inputs are supported (rank {em.rank(0)})")
    if mode not in ("linear", "nearest"):
        raise Unsupported(f"mode={mode!r} not supported")
    if ctm not in _MODES:
        raise Unsupported(f"coordinate_transformation_mode={ctm!r} not supported")
    if mode == "nearest" and nearest_mode not in _NEAREST:
        raise Unsupported(f"nearest_mode={nearest_mode!r} not supported")
    if antialias:
        raise Unsupported("antialias=1 not supported")
    in_shape, out_shape = em.shape(0), em.out_shape()
    scales = _scales(em, axes, keep_aspect_ratio_policy)
    if tuple(in_shape[:2]) != tuple(out_shape[:2]) or scales[:2] != [1.0, 1.0]:
        raise Unsupported("resizing the batch or channel axis is not supported")
    coords = [
        source_coordinates(ctm, n_in, n_out, s) for n_in, n_out, s in zip(in_shape[2:], out_shape[2:], scales[2:])
    ]
    size = tuple(int(d) for d in out_shape[2:])
    x = em.x(0)
    base = em.name_hint("resize")
    dtype = em.value(0).dtype or np.float32
    if mode == "linear":
        clamped = [np.clip(c, 0, n - 1) for c, n in zip(coords, in_shape[2:])]
        for align in (ctm == "align_corners", ctm != "align_corners"):
            if all(_same_coordinates(c, _ms_bilinear(n, m, align), n) for c, n, m in zip(clamped, in_shape[2:], size)):
                return f'ops.interpolate({x}, size={size!r}, mode="bilinear", align_corners={align})'
        rows, cols = (linear_matrix(c, n) for c, n in zip(coords, in_shape[2:]))
        if not _is_identity(rows):
            x = f"ops.matmul({em.tensor(rows.astype(dtype), f'{base}_rows')}, {x})"
        if not _is_identity(cols):
            x = f"ops.matmul({x}, {em.tensor(cols.T.astype(dtype), f'{base}_cols')})"
        return x
    idx = [nearest_indices(c, nearest_mode, n) for c, n in zip(coords, in_shape[2:])]
    for ms_mode in ("nearest", "nearest-exact"):
        if all(
            np.array_equal(i, _ms_nearest(n, m, ms_mode == "nearest-exact")) for i, n, m in zip(idx, in_shape[2:], size)
        ):
            return f'ops.interpolate({x}, size={size!r}, mode="{ms_mode}")'
    for axis, i, n, part in zip((2, 3), idx, in_shape[2:], ("rows", "cols")):
        if not np.array_equal(i, np.arange(n)):
            x = f"ops.gather({x}, {em.tensor(i.astype(np.int32), f'{base}_{part}')}, {axis})"
    return x
