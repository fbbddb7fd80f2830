"""Sampling at computed positions: GridSample and AffineGrid (spatial transformer networks).

ONNX GridSample is ``torch.nn.functional.grid_sample`` and AffineGrid is ``affine_grid``;
MindSpore's ``ops.grid_sample`` / ``ops.affine_grid`` compute the same (measured against
onnxruntime: 2-D and 3-D, every padding mode, both ``align_corners``). The grid's last axis
holds normalized ``(x, y[, z])`` positions in [-1, 1]: ``align_corners=1`` puts -1 and 1 on the
centers of the corner pixels, ``0`` on their outer edges. Opset 20 renamed the modes
``bilinear``/``bicubic`` to ``linear``/``cubic``; cubic has no MindSpore kernel and is refused.

Nearest rounds a position exactly half-way between two pixels to the even one in onnxruntime
(``nearbyint``) but up in MindSpore, and such positions are common (an affine grid that halves
the size samples at 2i + 0.5). So the grid is first snapped to pixel centers: unnormalized with
onnxruntime's own float32 formula, ``u = ((g + 1) * size - 1) / 2`` (``align_corners=0``) or
``(g + 1) / 2 * (size - 1)`` (``1``), rounded half to even by ``ops.round``, and normalized
back; MindSpore's nearest kernel then reads it without a tie.
"""

from __future__ import annotations

from torch2ms.converters.api import Unsupported, converter, literal

_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest"}
_PADDING = ("zeros", "border", "reflection")


@converter("GridSample", since=16)
def grid_sample(em, *, mode="bilinear", padding_mode="zeros", align_corners=0):
    """GridSample(X, grid) -> Y   attrs: mode (bilinear/linear, nearest), padding_mode (zeros, border, reflection), align_corners"""  # noqa: E501 - the signature line is the operator table's
    if mode not in _MODES:
        raise Unsupported(f"mode={mode!r} not supported (ops.grid_sample has bilinear and nearest)")
    if padding_mode not in _PADDING:
        raise Unsupported(f"padding_mode={padding_mode!r} not supported")
    if em.rank(0) not in (4, 5):
        raise Unsupported(f"only 4-D and 5-D inputs are supported (rank {em.rank(0)})")
    if em.dtype(0).kind != "f":
        raise Unsupported(f"input dtype {em.dtype(0)} not supported (float only)")
    g = em.x(1)
    if _MODES[mode] == "nearest":
        sizes = em.shape(0)[:1:-1]  # (W, H[, D]): the grid's x, y[, z] order
        if align_corners:
            s = f"ms.Tensor({literal(tuple(float(max(n - 1, 1)) for n in sizes))}, ms.float32)"
            g = f"ops.round(({g} + 1) / 2 * {s}) * 2 / {s} - 1"
        else:
            s = f"ms.Tensor({literal(tuple(float(n) for n in sizes))}, ms.float32)"
            g = f"(ops.round((({g} + 1) * {s} - 1) / 2) * 2 + 1) / {s} - 1"
    elif em.value(1).is_const:
        g = f"{g}.value()"  # a stored grid is a Parameter, which ops.grid_sample refuses
    args = [em.x(0), g]
    if _MODES[mode] != "bilinear":
        args.append(f'mode="{_MODES[mode]}"')
    if padding_mode != "zeros":
        args.append(f'padding_mode="{padding_mode}"')
    args.append(f"align_corners={bool(align_corners)}")
    return f"ops.grid_sample({', '.join(args)})"


@converter("AffineGrid", since=20)
def affine_grid(em, *, align_corners=0):
    """AffineGrid(theta, size) -> grid   attrs: align_corners (size a constant: N, C, H, W or N, C, D, H, W)"""
    size = tuple(int(d) for d in em.require_const(1, "size").reshape(-1))
    if len(size) not in (4, 5):
        raise Unsupported(f"size {size} must have 4 (2-D) or 5 (3-D) entries")
    if align_corners and 1 in size[2:]:
        raise Unsupported(f"align_corners=1 with a spatial size of 1 (size {size}): undefined in ONNX")
    return f"ops.affine_grid({em.x(0)}, {em.shape_code(size)}, {bool(align_corners)})"
