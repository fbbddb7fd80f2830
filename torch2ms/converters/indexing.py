"""Indexing: the gather and scatter families, OneHot, Compress, ReverseSequence.

Indices may be constants or computed at run time; only an input that decides the output's
*shape* must be a constant (OneHot's depth, Compress's condition). ONNX counts negative indices
from the end of the axis; MindSpore's gather kernels do not (``ops.gather_elements`` silently
reads index 0, ``ops.gather_nd`` raises). Constant indices are therefore wrapped here and
stored as int32; run-time indices are wrapped in the generated code with ``% size`` (floor
modulo: -1 % 5 == 4).

GatherND with ``batch_dims = b`` is ``ops.gather_nd`` with the b batch coordinates prepended
to every index tuple. ScatterElements with a reduction is ScatterND over full coordinates
(every axis's own position, except ``axis``, where the index is), because
``ops.tensor_scatter_elements`` reduces with ``add`` only, and on CPU only.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import MS_DTYPES, Unsupported, converter, literal, refuse

refuse("NonZero", reason="its output shape depends on the data (the number of non-zero elements)")
refuse("Unique", reason="its output shape depends on the data (the number of distinct values)")

_SCATTER_ND = {
    "none": "ops.tensor_scatter_update",
    "add": "ops.tensor_scatter_add",
    "mul": "ops.tensor_scatter_mul",
    "max": "ops.tensor_scatter_max",
    "min": "ops.tensor_scatter_min",
}


def _ms_int(dtype: np.dtype) -> str:
    return MS_DTYPES[np.dtype(dtype).name]


def _wrapped(em, i: int, sizes, hint: str) -> str:
    """Index input ``i`` with negative entries wrapped by ``sizes`` (one size, or one per index
    component along the last axis)."""
    c = em.const(i)
    if c is not None:
        return em.tensor(np.where(c < 0, c + np.asarray(sizes), c).astype(np.int32), hint)
    if np.ndim(sizes) == 0:
        return f"{em.x(i)} % {int(sizes)}"
    sizes = tuple(int(s) for s in sizes)
    if len(set(sizes)) == 1:
        return f"{em.x(i)} % {sizes[0]}"
    return f"{em.x(i)} % ms.Tensor({sizes!r}, {_ms_int(em.dtype(i))})"


@converter("Gather", since=1)
def gather(em, *, axis=0):
    """Gather(data, indices) -> output   attrs: axis (constant or run-time indices)"""
    axis = int(axis) % em.rank(0)
    n = em.shape(0)[axis]
    idx = em.const(1)
    if idx is not None and idx.ndim == 0:
        items = [":"] * axis + [str(int(idx) % n)]
        return f"{em.x(0)}[{', '.join(items)}]"
    return f"ops.gather({em.x(0)}, {_wrapped(em, 1, n, 'indices')}, {axis})"


@converter("GatherElements", since=11)
def gather_elements(em, *, axis=0):
    """GatherElements(data, indices) -> output   attrs: axis"""
    axis = int(axis) % em.rank(0)
    idx = _wrapped(em, 1, em.shape(0)[axis], "indices")
    return f"ops.gather_elements({em.x(0)}, {axis}, {idx})"


def _with_batch_coords(em, i: int, batch_dims: int, sizes, hint: str) -> str:
    """Index input ``i`` (wrapped) with the ``batch_dims`` leading coordinates prepended to each tuple."""
    if not batch_dims:
        return _wrapped(em, i, sizes, hint)
    lead = em.shape(i)[:-1]
    batch = lead[:batch_dims]
    grid = np.stack(np.indices(batch), -1).reshape(batch + (1,) * (len(lead) - batch_dims) + (batch_dims,))
    grid = np.broadcast_to(grid, lead + (batch_dims,))
    c = em.const(i)
    if c is not None:
        full = np.concatenate([grid, np.where(c < 0, c + np.asarray(sizes), c)], -1)
        return em.tensor(full.astype(np.int32), hint)
    return f"ops.concat(({em.tensor(grid.astype(em.dtype(i)), f'{hint}_batch')}, {_wrapped(em, i, sizes, hint)}), -1)"


@converter("GatherND", since=11)
def gather_nd(em, *, batch_dims=0):
    """GatherND(data, indices) -> output   attrs: batch_dims"""
    b = int(batch_dims)
    k = em.shape(1)[-1]
    sizes = em.shape(0)[b : b + k]
    return f"ops.gather_nd({em.x(0)}, {_with_batch_coords(em, 1, b, sizes, 'indices')})"


def _check_reduction(em, reduction: str) -> None:
    if reduction not in _SCATTER_ND:
        raise Unsupported(f"reduction={reduction!r} not supported")
    if reduction != "none" and em.dtype(0) == np.bool_:
        raise Unsupported(f"reduction={reduction!r} on bool data not supported")


@converter("ScatterND", since=11)
def scatter_nd(em, *, reduction="none"):
    """ScatterND(data, indices, updates) -> output   attrs: reduction (none, add, mul, max, min)"""
    _check_reduction(em, reduction)
    k = em.shape(1)[-1]
    idx = _wrapped(em, 1, em.shape(0)[:k], "indices")
    return f"{_SCATTER_ND[reduction]}({em.x(0)}, {idx}, {em.x(2)})"


@converter("ScatterElements", since=11)
def scatter_elements(em, *, axis=0, reduction="none"):
    """ScatterElements(data, indices, updates) -> output   attrs: axis, reduction (none, add, mul, max, min)"""
    _check_reduction(em, reduction)
    rank = em.rank(0)
    axis = int(axis) % rank
    n = em.shape(0)[axis]
    if reduction == "none":
        extra = f", axis={axis}" if axis else ""
        return f"ops.tensor_scatter_elements({em.x(0)}, {_wrapped(em, 1, n, 'indices')}, {em.x(2)}{extra})"
    # Full coordinates: the position along every axis, the index along `axis`.
    grid = np.stack(np.indices(em.shape(1)), -1)
    c = em.const(1)
    if c is not None:
        grid[..., axis] = np.where(c < 0, c + n, c)
        coords = em.tensor(grid.astype(np.int32), "indices")
    else:
        dtype = em.dtype(1)
        parts = [f"ops.expand_dims({_wrapped(em, 1, n, 'indices')}, -1)"]
        if axis:
            parts.insert(0, em.tensor(grid[..., :axis].astype(dtype), "indices_before"))
        if axis < rank - 1:
            parts.append(em.tensor(grid[..., axis + 1 :].astype(dtype), "indices_after"))
        coords = f"ops.concat(({', '.join(parts)}), -1)"
    return f"{_SCATTER_ND[reduction]}({em.x(0)}, {coords}, {em.x(2)})"


@converter("Scatter", since=9)
def scatter(em, *, axis=0):
    """Scatter(data, indices, updates) -> output   attrs: axis (deprecated: ScatterElements without reduction)"""
    return scatter_elements(em, axis=axis)


def _scalar_of(value, dtype: np.dtype) -> str:
    """A typed MindSpore scalar tensor for one of OneHot's values."""
    v = value.item()
    if dtype == np.float32 and isinstance(v, float):
        return literal(v)
    return f"ms.Tensor({literal(v)}, {MS_DTYPES[dtype.name]})"


@converter("OneHot", since=9)
def one_hot(em, *, axis=-1):
    """OneHot(indices, depth, values) -> output   attrs: axis (depth a constant; values = [off, on])"""
    depth_arr = em.require_const(1, "depth").reshape(-1)
    depth = int(depth_arr[0])
    rank = em.rank(0)
    axis = int(axis) % (rank + 1) if axis < 0 else int(axis)
    if axis == rank:
        axis = -1
    c = em.const(0)
    if c is not None:
        c = c.astype(np.int64)
        idx = em.tensor(np.where(c < 0, c + depth, c).astype(np.int32), "indices")
    else:
        i = em.x(0)
        if em.dtype(0).name not in ("int32", "int64"):
            i = f"ops.cast({i}, ms.int64)"  # ONNX casts non-integer indices to int64
        idx = f"ops.where({i} < 0, {i} + {depth}, {i})"  # [-depth, -1] counts from the end; beyond stays off
    dtype = em.dtype(2)
    vals = em.const(2)
    if vals is not None:
        off, on = (_scalar_of(v, dtype) for v in vals.reshape(-1))
    else:
        off, on = f"{em.x(2)}[0]", f"{em.x(2)}[1]"
    extra = f", {axis}" if axis != -1 else ""
    return f"ops.one_hot({idx}, {depth}, {on}, {off}{extra})"


@converter("Compress", since=9)
def compress(em, *, axis=None):
    """Compress(input, condition) -> output   attrs: axis (condition a constant; none: of the flattened input)"""
    cond = em.const(1)
    if cond is None:
        raise Unsupported("condition (input 1) must be a constant: at run time the output shape would depend on it")
    x, shape = em.x(0), em.shape(0)
    if axis is None:
        shape = (int(np.prod(shape)),)
        x = f"ops.reshape({x}, (-1,))"
        axis = 0
    axis = int(axis) % len(shape)
    n = shape[axis]
    picked = np.flatnonzero(cond.reshape(-1)[:n].astype(bool))
    if len(picked) == n:
        return x
    lead = ":, " * axis
    if len(picked) == 0:
        return f"{x}[{lead}0:0]"
    if np.array_equal(picked, np.arange(picked[0], picked[-1] + 1)):
        return f"{x}[{lead}{picked[0]}:{picked[-1] + 1}]"
    return f"ops.gather({x}, {em.tensor(picked.astype(np.int32), 'condition')}, {axis})"


@converter("ReverseSequence", since=10)
def reverse_sequence(em, *, batch_axis=1, time_axis=0):
    """ReverseSequence(input, sequence_lens) -> Y   attrs: batch_axis, time_axis"""
    extra = f", batch_dim={int(batch_axis)}" if batch_axis else ""
    return f"ops.reverse_sequence({em.x(0)}, {em.x(1)}, seq_dim={int(time_axis)}{extra})"
