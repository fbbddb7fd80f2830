"""Data movement: Concat, Split, Slice, Gather, Reshape family, Transpose, Pad, Cast, Expand.

All shapes are static (the loader inferred them), so reshapes are written with the concrete
output shape: one ``ops.reshape`` whatever the ONNX spelling (Reshape, Flatten, Squeeze,
Unsqueeze).
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, literal, ms_dtype

# ONNX dtypes Cast converts to (float, uint8, int8, int32, int64, bool, float16, double).
_CAST_TO = {1, 2, 3, 6, 7, 9, 10, 11}


@converter("Concat", since=4)
def concat(em, *, axis):
    """Concat(inputs...) -> concat_result   attrs: axis"""
    parts = [em.x(i) for i in range(em.n_inputs())]
    return f"ops.concat(({', '.join(parts)}{',' if len(parts) == 1 else ''}), axis={int(axis)})"


@converter("Reshape", since=5)
def reshape(em, *, allowzero=0):
    """Reshape(data, shape) -> reshaped   (written with the static output shape)"""
    return f"ops.reshape({em.x(0)}, {tuple(em.out_shape())!r})"


@converter("Flatten", since=1)
def flatten(em, *, axis=1):
    """Flatten(input) -> output   attrs: axis"""
    return f"ops.reshape({em.x(0)}, {tuple(em.out_shape())!r})"


@converter("Squeeze", "Unsqueeze", since=1)
def squeeze(em, *, axes=None):
    """Squeeze/Unsqueeze(data, axes?) -> reshaped   (written with the static output shape)"""
    return f"ops.reshape({em.x(0)}, {tuple(em.out_shape())!r})"


@converter("Transpose", since=1)
def transpose(em, *, perm=None):
    """Transpose(data) -> transposed   attrs: perm"""
    perm = tuple(int(p) for p in (perm or reversed(range(em.rank(0)))))
    return f"ops.transpose({em.x(0)}, {perm!r})"


@converter("Split", since=2)
def split(em, *, axis=0, split=None, num_outputs=None):  # noqa: ARG001 - sizes come from the output shapes
    """Split(input, split?) -> outputs...   attrs: axis (split sizes read from the static output shapes)"""
    axis = int(axis) % em.rank(0)
    sizes = tuple(int(em.graph.values[o].shape[axis]) for o in em.node.outputs)
    if len(sizes) == 1:
        return em.x(0)  # ops.split would return a 1-tuple
    return f"ops.split({em.x(0)}, {sizes!r}, axis={axis})"


def _index_expr(x: str, per_axis: dict[int, str]) -> str:
    last = max(per_axis)
    items = [per_axis.get(a, ":") for a in range(last + 1)]
    return f"{x}[{', '.join(items)}]"


def _slice_text(lo: int, hi: int, step: int) -> str:
    """Python slice text for ``range(lo, hi, step)`` over an axis (``slice.indices`` output)."""
    if step < 0 and hi < 0:
        hi_text = ""  # runs down to index 0; a written -1 would mean the last element
    else:
        hi_text = str(hi)
    return f"{lo}:{hi_text}" + (f":{step}" if step != 1 else "")


@converter("Slice", since=10)
def slice_(em):
    """Slice(data, starts, ends, axes?, steps?) -> output   (constant starts/ends/axes/steps)"""
    shape = em.shape(0)
    starts = em.require_const(1, "starts").tolist()
    ends = em.require_const(2, "ends").tolist()
    axes = em.require_const(3, "axes").tolist() if em.has_input(3) else list(range(len(starts)))
    steps = em.require_const(4, "steps").tolist() if em.has_input(4) else [1] * len(starts)
    per_axis = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a % len(shape)
        lo, hi, step = slice(int(s), int(e), int(st)).indices(shape[a])
        if (lo, hi, step) == (0, shape[a], 1):
            continue
        per_axis[a] = _slice_text(lo, hi, step)
    if not per_axis:
        return em.x(0)
    return _index_expr(em.x(0), per_axis)


@converter("Gather", since=1)
def gather(em, *, axis=0):
    """Gather(data, indices) -> output   attrs: axis (constant indices)"""
    idx = em.require_const(1, "indices")
    axis = int(axis) % em.rank(0)
    if idx.ndim == 0:
        i = int(idx) % em.shape(0)[axis]
        return _index_expr(em.x(0), {axis: str(i)})
    idx = np.where(idx < 0, idx + em.shape(0)[axis], idx)
    return f"ops.gather({em.x(0)}, {em.tensor(idx.astype(np.int32), 'indices')}, {axis})"


@converter("Cast", since=6)
def cast(em, *, to, saturate=1, round_mode="up"):
    """Cast(input) -> output   attrs: to"""
    if to not in _CAST_TO:
        raise Unsupported(f"to={to} (ONNX dtype) not supported")
    return f"ops.cast({em.x(0)}, {ms_dtype(to)})"


@converter("Expand", since=8)
def expand(em):
    """Expand(input, shape) -> output   (written with the static output shape)"""
    return f"ops.broadcast_to({em.x(0)}, {tuple(em.out_shape())!r})"


@converter("Tile", since=6)
def tile(em):
    """Tile(input, repeats) -> output"""
    reps = tuple(int(r) for r in em.require_const(1, "repeats"))
    return f"ops.tile({em.x(0)}, {reps!r})"


@converter("Pad", since=11)
def pad(em, *, mode="constant"):
    """Pad(data, pads, constant_value?, axes?) -> output   attrs: mode

    Negative pads crop: they become a slice first (MindSpore's ops.pad gives wrong values for
    negative padding once another pad has run). ``reflect``/``edge`` pad the spatial axes only.
    """
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"mode={mode!r} not supported")
    rank = em.rank(0)
    given = [int(p) for p in em.require_const(1, "pads")]
    axes = [int(a) % rank for a in em.require_const(3, "axes")] if em.has_input(3) else list(range(rank))
    begins, ends = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begins[a], ends[a] = given[k], given[len(axes) + k]
    x = em.x(0)
    shape = em.shape(0)
    crops = {a: f"{-min(b, 0)}:{shape[a] + min(e, 0)}" for a, (b, e) in enumerate(zip(begins, ends)) if b < 0 or e < 0}
    if crops:
        x = _index_expr(x, crops)
    begins, ends = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
    # ops.pad takes (last_begin, last_end, second_last_begin, ...) like torch.nn.functional.pad.
    torch_pads = []
    for a in reversed(range(rank)):
        torch_pads += [begins[a], ends[a]]
    if mode == "constant":
        while len(torch_pads) > 2 and torch_pads[-2:] == [0, 0]:
            torch_pads = torch_pads[:-2]
    else:
        if rank not in (3, 4, 5) or any(torch_pads[2 * (rank - 2) :]):
            raise Unsupported(f"mode={mode!r} pads the spatial axes of a 3-D to 5-D input only")
        torch_pads = torch_pads[: 2 * (rank - 2)]  # MindSpore wants exactly the spatial axes
    if not any(torch_pads):
        return x
    value = em.require_const(2, "constant_value") if em.has_input(2) else None
    value = float(value.item()) if value is not None and value.size else 0.0
    if mode == "constant":
        extra = f", value={literal(value)}" if value != 0.0 else ""
    else:
        extra = f', mode="{"replicate" if mode == "edge" else mode}"'
    return f"ops.pad({x}, {tuple(torch_pads)!r}{extra})"
