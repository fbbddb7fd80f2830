"""Data movement: Concat, Split, Slice, Gather, Reshape family, Transpose, Pad, Cast, Expand.

All shapes are static (the loader inferred them), so reshapes are written with the concrete
output shape: one ``ops.reshape`` whatever the ONNX spelling (Reshape, Flatten, Squeeze,
Unsqueeze).
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.registry import Unsupported, converter

_MS_DTYPE = {1: "ms.float32", 6: "ms.int32", 7: "ms.int64", 9: "ms.bool_", 10: "ms.float16", 11: "ms.float64", 2: "ms.uint8", 3: "ms.int8"}


@converter("Concat", since=4)
def concat(em, *, axis):
    """Concat(inputs...) -> concat_result   attrs: axis"""
    parts = ", ".join(em.x(i) for i in range(em.n_inputs()))
    return f"ops.concat(({parts},), axis={int(axis)})"


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
    return f"ops.split({em.x(0)}, {sizes!r}, axis={axis})"


def _index_expr(x: str, rank: int, per_axis: dict[int, str]) -> str:
    last = max(per_axis)
    items = [per_axis.get(a, ":") for a in range(last + 1)]
    return f"{x}[{', '.join(items)}]"


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
        if step < 0:
            raise Unsupported("negative steps not supported")
        if (lo, hi, step) == (0, shape[a], 1):
            continue
        per_axis[a] = f"{lo}:{hi}" + (f":{step}" if step != 1 else "")
    if not per_axis:
        return em.x(0)
    return _index_expr(em.x(0), len(shape), per_axis)


@converter("Gather", since=1)
def gather(em, *, axis=0):
    """Gather(data, indices) -> output   attrs: axis (constant indices)"""
    idx = em.require_const(1, "indices")
    axis = int(axis) % em.rank(0)
    if idx.ndim == 0:
        i = int(idx) % em.shape(0)[axis]
        return _index_expr(em.x(0), em.rank(0), {axis: str(i)})
    idx = np.where(idx < 0, idx + em.shape(0)[axis], idx)
    return f"ops.gather({em.x(0)}, {em.tensor(idx.astype(np.int32), 'indices')}, {axis})"


@converter("Cast", since=6)
def cast(em, *, to, saturate=1, round_mode="up"):
    """Cast(input) -> output   attrs: to"""
    if to not in _MS_DTYPE:
        raise Unsupported(f"to={to} (ONNX dtype) not supported")
    return f"ops.cast({em.x(0)}, {_MS_DTYPE[to]})"


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
    """Pad(data, pads, constant_value?, axes?) -> output   attrs: mode"""
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"mode={mode!r} not supported")
    if em.has_input(3):
        raise Unsupported("the axes input is not supported")
    pads = [int(p) for p in em.require_const(1, "pads")]
    rank = em.rank(0)
    begins, ends = pads[:rank], pads[rank:]
    # ops.pad takes (last_begin, last_end, second_last_begin, ...) like torch.nn.functional.pad.
    torch_pads = []
    for a in reversed(range(rank)):
        torch_pads += [begins[a], ends[a]]
    while len(torch_pads) > 2 and torch_pads[-2:] == [0, 0]:
        torch_pads = torch_pads[:-2]
    value = float(em.const(2).item()) if em.has_input(2) and em.const(2) is not None and em.const(2).size else 0.0
    ms_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
    extra = f", value={value!r}" if mode == "constant" and value != 0.0 else ""
    return f'ops.pad({em.x(0)}, {tuple(torch_pads)!r}, mode="{ms_mode}"{extra})'
