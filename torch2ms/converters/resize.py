"""Resize (and the deprecated Upsample) of the two spatial axes of an NCHW tensor, with a static
output size.

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
writes MindSpore's resize when they agree (on NCHW the ``ops.ResizeBilinearV2`` /
``ops.ResizeNearestNeighborV2`` primitive ``ops.interpolate`` calls, which, unlike
``ops.interpolate``, compiles with a dynamic batch); otherwise it writes the resize as what it is, a fixed
map per axis: linear as ``rows @ x @ cols`` with constant interpolation matrices, nearest as two
``ops.gather`` with constant source indices. Coordinates are computed in float32 like
onnxruntime and PyTorch.

Cubic is such a fixed map too: source coordinate ``c = floor(c) + t`` takes the 4 pixels
``floor(c) - 1 ... floor(c) + 2`` (clamped to the edge) with Keys' weights for
``A = cubic_coeff_a``::

    w(d) = (A + 2)|d|^3 - (A + 3)|d|^2 + 1        |d| <= 1
    w(d) = A|d|^3 - 5A|d|^2 + 8A|d| - 4A          1 < |d| < 2

``exclude_outside=1`` gives pixels outside the input weight 0 and renormalizes. ``antialias=1``
(opset 18, linear and cubic) widens the filter by ``1 / scale`` when downscaling, as Pillow does:
output pixel ``x`` with ``center = c + 0.5`` averages input pixels ``p`` with weights
``w((p + 0.5 - center) * scale)`` over ``|p + 0.5 - center| < support / scale``, normalized to sum
1 (support 1 for linear, 2 for cubic); weights falling outside the input go to the edge pixel,
or are dropped with ``exclude_outside=1``. This follows onnxruntime's implementation.
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


def cubic_matrix(coords: np.ndarray, n_in: int, a: float, exclude_outside: bool) -> np.ndarray:
    """(out, in) matrix of cubic-convolution weights (unclamped coordinates, edge pixels repeated)."""
    c = coords.astype(np.float64)
    base = np.floor(c)
    t = c - base
    a = float(np.float32(a))
    weights = np.stack(
        [
            ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
        ],
        -1,
    )
    idx = base.astype(np.int64)[:, None] + np.arange(-1, 3)
    if exclude_outside:
        weights = np.where((idx >= 0) & (idx < n_in), weights, 0.0)
        weights /= weights.sum(-1, keepdims=True)
    m = np.zeros((len(c), n_in))
    np.add.at(m, (np.repeat(np.arange(len(c)), 4), np.clip(idx, 0, n_in - 1).reshape(-1)), weights.reshape(-1))
    return m


def _triangle(x: np.ndarray, a: float) -> np.ndarray:  # noqa: ARG001 - same signature as _keys
    return np.clip(1 - np.abs(x), 0, None)


def _keys(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def antialias_matrix(coords: np.ndarray, n_in: int, scale: float, mode: str, a: float, exclude_outside: bool):
    """(out, in) matrix of the antialiasing filter (onnxruntime's Pillow-style resampling)."""
    n_out = len(coords)
    if n_out == n_in:
        return np.eye(n_in)  # onnxruntime copies an axis whose size does not change
    inv = _F(1) / _F(scale)  # input pixels per output pixel
    support = (2.0 if mode == "linear" else 4.0) * 0.5
    if inv >= 1:
        support *= float(inv)
    window = int(np.ceil(support)) * 2 + 1
    filt, stretch = (_triangle if mode == "linear" else _keys), (1 / float(inv) if inv >= 1 else 1.0)
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = float(_F(0.5) + (_F(i) if inv == 1 else coords[i]))
        lo = int(np.floor(center - support + 0.5))
        hi = lo + int(np.clip(np.floor(center + support + 0.5) - lo, 0, window))
        lo_cut, hi_cut = min(max(lo, 0), n_in), min(max(hi, 0), n_in)
        if exclude_outside:
            lo, hi = lo_cut, hi_cut
        if lo_cut >= hi_cut:
            continue
        p = np.arange(lo, hi)
        w = filt((p - center + 0.5) * stretch, float(np.float32(a)))
        total = w.sum()
        np.add.at(m[i], np.clip(p, 0, n_in - 1), w / (total if total != 0 else 1.0))
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
    scales = em.require_const(2, "scales") if em.has_input(2) else None
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


def _matrices(em, x: str, rows: np.ndarray, cols: np.ndarray) -> str:
    """``rows @ x @ cols.T`` with constant matrices (an identity is left out)."""
    base = em.name_hint("resize")
    dtype = em.value(0).dtype or np.float32
    if not _is_identity(rows):
        x = f"ops.matmul({em.tensor(rows.astype(dtype), f'{base}_rows')}, {x})"
    if not _is_identity(cols):
        x = f"ops.matmul({x}, {em.tensor(cols.T.astype(dtype), f'{base}_cols')})"
    return x


def _gathers(em, x: str, idx: list[np.ndarray], in_hw) -> str:
    base = em.name_hint("resize")
    for axis, i, n, part in zip((2, 3), idx, in_hw, ("rows", "cols")):
        if not np.array_equal(i, np.arange(n)):
            x = f"ops.gather({x}, {em.tensor(i.astype(np.int32), f'{base}_{part}')}, {axis})"
    return x


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
    """Resize(X, roi?, scales?, sizes?) -> Y   attrs: mode (nearest, linear, cubic), coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside, antialias, axes, keep_aspect_ratio_policy"""  # noqa: E501 - the signature line is the operator table's
    ctm = coordinate_transformation_mode
    if em.rank(0) != 4:
        raise Unsupported(f"only 4-D (NCHW) inputs are supported (rank {em.rank(0)})")
    if mode not in ("linear", "nearest", "cubic"):
        raise Unsupported(f"mode={mode!r} not supported")
    if ctm not in _MODES:
        raise Unsupported(f"coordinate_transformation_mode={ctm!r} not supported")
    if mode == "nearest" and nearest_mode not in _NEAREST:
        raise Unsupported(f"nearest_mode={nearest_mode!r} not supported")
    if antialias and mode == "nearest":
        raise Unsupported("antialias=1 with mode='nearest' not supported (it applies to linear and cubic)")
    if em.dtype(0).kind != "f" and mode != "nearest":
        raise Unsupported(f"mode={mode!r} on {em.dtype(0)} data not supported (nearest only)")
    in_shape, out_shape = em.shape(0), em.out_shape()
    scales = _scales(em, axes, keep_aspect_ratio_policy)
    if tuple(in_shape[:2]) != tuple(out_shape[:2]) or scales[:2] != [1.0, 1.0]:
        raise Unsupported("resizing the batch or channel axis is not supported")
    in_hw, size = in_shape[2:], tuple(int(d) for d in out_shape[2:])
    coords = [source_coordinates(ctm, n_in, n_out, s) for n_in, n_out, s in zip(in_hw, size, scales[2:])]
    x = em.x(0)
    if antialias:
        rows, cols = (
            antialias_matrix(c, n, s, mode, cubic_coeff_a, bool(exclude_outside))
            for c, n, s in zip(coords, in_hw, scales[2:])
        )
        return _matrices(em, x, rows, cols)
    if mode == "cubic":
        rows, cols = (cubic_matrix(c, n, cubic_coeff_a, bool(exclude_outside)) for c, n in zip(coords, in_hw))
        return _matrices(em, x, rows, cols)
    if mode == "linear":
        clamped = [np.clip(c, 0, n - 1) for c, n in zip(coords, in_hw)]
        for align in (ctm == "align_corners", ctm != "align_corners"):
            if all(_same_coordinates(c, _ms_bilinear(n, m, align), n) for c, n, m in zip(clamped, in_hw, size)):
                return _bilinear(x, size, align)
        rows, cols = (linear_matrix(c, n) for c, n in zip(coords, in_hw))
        return _matrices(em, x, rows, cols)
    idx = [nearest_indices(c, nearest_mode, n) for c, n in zip(coords, in_hw)]
    if em.dtype(0).kind != "f":
        return _gathers(em, x, idx, in_hw)  # ResizeNearestNeighborV2 on CPU takes floats and uint8 only
    for ms_mode in ("nearest", "nearest-exact"):
        if all(np.array_equal(i, _ms_nearest(n, m, ms_mode == "nearest-exact")) for i, n, m in zip(idx, in_hw, size)):
            return _nearest(x, size, ms_mode)
    return _gathers(em, x, idx, in_hw)


def _bilinear(x: str, size: tuple[int, ...], align: bool) -> str:
    """MindSpore's bilinear resize; on NCHW the primitive ``ops.interpolate`` calls, because
    ``ops.interpolate`` itself fails to compile when the batch is dynamic (MindSpore 2.10: it looks
    its options up by ``F.rank(x)``, which is then not a constant)."""
    if len(size) != 2:
        return f'ops.interpolate({x}, size={size!r}, mode="bilinear", align_corners={align})'
    return f"ops.ResizeBilinearV2(align_corners={align}, half_pixel_centers={not align})({x}, {size!r})"


def _nearest(x: str, size: tuple[int, ...], ms_mode: str) -> str:
    """``ops.interpolate``'s nearest / nearest-exact; its primitive on NCHW (see ``_bilinear``)."""
    if len(size) != 2:
        return f'ops.interpolate({x}, size={size!r}, mode="{ms_mode}")'
    exact = ms_mode == "nearest-exact"
    kwargs = "half_pixel_centers=True" if exact else ""
    return f"ops.ResizeNearestNeighborV2({kwargs})({x}, ops.tuple_to_array({size!r}))"


@converter("Upsample", since=7)
def upsample(em, *, mode="nearest", scales=None):
    """Upsample(X, scales?) -> Y   attrs: mode (nearest: floor, linear), scales (opset 7); deprecated since opset 10"""
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"mode={mode!r} not supported")
    if em.rank(0) != 4:
        raise Unsupported(f"only 4-D (NCHW) inputs are supported (rank {em.rank(0)})")
    scales = [float(s) for s in (em.require_const(1, "scales").reshape(-1) if em.has_input(1) else scales)]
    if scales[:2] != [1.0, 1.0]:
        raise Unsupported("resizing the batch or channel axis is not supported")
    in_hw = em.shape(0)[2:]
    size = [int(np.floor(n * _F(s))) for n, s in zip(in_hw, scales[2:])]
    # Upsample maps like Resize's asymmetric mode: source = x / scale, nearest rounds down.
    coords = [source_coordinates("asymmetric", n, m, s) for n, m, s in zip(in_hw, size, scales[2:])]
    if mode == "nearest":
        return _gathers(em, em.x(0), [nearest_indices(c, "floor", n) for c, n in zip(coords, in_hw)], in_hw)
    rows, cols = (linear_matrix(c, n) for c, n in zip(coords, in_hw))
    return _matrices(em, em.x(0), rows, cols)
