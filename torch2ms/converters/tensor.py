"""Data movement and layout: Concat, Split, Slice, Reshape family, Transpose, Pad, Cast, Expand,
Tile, DepthToSpace / SpaceToDepth, CenterCropPad.

Shapes are static, so a reshape is written with its concrete target shape: one ``ops.reshape``
whatever the ONNX spelling (Reshape, Flatten, Squeeze, Unsqueeze). The target is computed here
from the input's shape and the node's *constant* shape/axes/sizes input. It is never read from
the loader's inferred output shape, which for an integer graph input comes from a run that fed
ones: a shape, axes, split, repeats or pads input that is not a constant is refused by name,
since the generated code would bake a shape computed from made-up values.

DepthToSpace (``DCR``: depth-column-row, ``CRD``: column-row-depth) and SpaceToDepth are the
reshape -> transpose -> reshape of the ONNX spec, one statement.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import MS_DTYPES, Unsupported, converter, literal, ms_dtype

# ONNX TensorProto element types: enum -> (name, numpy dtype name or None when MindSpore lacks it).
_ONNX_TYPES = {
    1: ("FLOAT", "float32"),
    2: ("UINT8", "uint8"),
    3: ("INT8", "int8"),
    4: ("UINT16", "uint16"),
    5: ("INT16", "int16"),
    6: ("INT32", "int32"),
    7: ("INT64", "int64"),
    8: ("STRING", None),
    9: ("BOOL", "bool"),
    10: ("FLOAT16", "float16"),
    11: ("DOUBLE", "float64"),
    12: ("UINT32", "uint32"),
    13: ("UINT64", "uint64"),
    14: ("COMPLEX64", None),
    15: ("COMPLEX128", None),
    16: ("BFLOAT16", "bfloat16"),
    17: ("FLOAT8E4M3FN", None),
    18: ("FLOAT8E4M3FNUZ", None),
    19: ("FLOAT8E5M2", None),
    20: ("FLOAT8E5M2FNUZ", None),
    21: ("UINT4", None),
    22: ("INT4", None),
    23: ("FLOAT4E2M1", None),
    24: ("FLOAT8E8M0", None),
    25: ("UINT2", None),
    26: ("INT2", None),
}


def _require_dtype(em, i: int, what: str) -> str:
    """``ms.<dtype>`` of input ``i``; Unsupported naming the input when MindSpore lacks the dtype."""
    try:
        return ms_dtype(em.dtype(i))
    except Unsupported:
        raise Unsupported(f"{what} (input {i}) has dtype {em.dtype(i)}, which MindSpore lacks") from None


def _axes_of(em, axes, what: str = "axes") -> list[int] | None:
    """``axes`` from the attribute (older opsets) or the constant input 1 (newer ones)."""
    if em.has_input(1):
        return [int(a) for a in em.require_const(1, what).reshape(-1)]
    return None if axes is None else [int(a) for a in axes]


@converter("Concat", since=4)
def concat(em, *, axis):
    """Concat(inputs...) -> concat_result   attrs: axis"""
    parts = [em.x(i) for i in range(em.n_inputs()) if em.has_input(i)]
    return f"ops.concat(({', '.join(parts)}{',' if len(parts) == 1 else ''}), axis={int(axis)})"


def reshape_target(in_shape: tuple[int, ...], shape, allowzero: int) -> tuple[int, ...]:
    """ONNX Reshape's output shape: 0 copies the input dimension (unless ``allowzero``), -1 is inferred."""
    out = [int(d) for d in shape]
    for k, d in enumerate(out):
        if d == 0 and not allowzero:
            if k >= len(in_shape):
                raise Unsupported(f"shape[{k}]=0 copies a dimension the input does not have")
            out[k] = in_shape[k]
    if out.count(-1) > 1:
        raise Unsupported("shape has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(in_shape))
        if known == 0 or total % known:
            raise Unsupported(f"shape {tuple(shape)} does not fit an input of shape {tuple(in_shape)}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != int(np.prod(in_shape)):
        raise Unsupported(f"shape {tuple(shape)} does not fit an input of shape {tuple(in_shape)}")
    return tuple(out)


@converter("Reshape", since=5)
def reshape(em, *, allowzero=0):
    """Reshape(data, shape) -> reshaped   attrs: allowzero (shape a constant: 0 copies, -1 infers)"""
    target = reshape_target(em.shape(0), em.require_const(1, "shape").reshape(-1), allowzero)
    return f"ops.reshape({em.x(0)}, {em.shape_code(target)})"


@converter("Flatten", since=1)
def flatten(em, *, axis=1):
    """Flatten(input) -> output   attrs: axis"""
    shape = em.shape(0)
    axis = int(axis) + len(shape) if axis < 0 else int(axis)
    target = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    return f"ops.reshape({em.x(0)}, {em.shape_code(target)})"


@converter("Squeeze", since=1)
def squeeze(em, *, axes=None):
    """Squeeze(data, axes?) -> squeezed   attrs: axes (an input from opset 13; none: every size-1 axis)"""
    shape = em.shape(0)
    axes = _axes_of(em, axes)
    if axes is None:
        drop = {a for a, d in enumerate(shape) if d == 1}
    else:
        drop = {a % len(shape) for a in axes}
        wrong = [a for a in sorted(drop) if shape[a] != 1]
        if wrong:
            raise Unsupported(f"axes {wrong} have size {[shape[a] for a in wrong]}, not 1")
    target = tuple(d for a, d in enumerate(shape) if a not in drop)
    return f"ops.reshape({em.x(0)}, {em.shape_code(target)})"


@converter("Unsqueeze", since=1)
def unsqueeze(em, *, axes=None):
    """Unsqueeze(data, axes) -> expanded   attrs: axes (an input from opset 13)"""
    axes = _axes_of(em, axes)
    if axes is None:
        raise Unsupported("axes missing")
    shape = list(em.shape(0))
    rank = len(shape) + len(axes)
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    return f"ops.reshape({em.x(0)}, {em.shape_code(tuple(shape))})"


@converter("Transpose", since=1)
def transpose(em, *, perm=None):
    """Transpose(data) -> transposed   attrs: perm"""
    perm = tuple(int(p) for p in (perm if perm is not None else reversed(range(em.rank(0)))))
    if perm == tuple(range(len(perm))):
        return em.x(0)
    return f"ops.transpose({em.x(0)}, {perm!r})"


def split_sizes(n: int, n_outputs: int, split, num_outputs) -> list[int]:
    """ONNX Split's part sizes: given, or ``num_outputs`` parts of ceil(n / k) (the last smaller), or equal."""
    if split is not None:
        sizes = [int(s) for s in split]
        if sum(sizes) != n or len(sizes) != n_outputs:
            raise Unsupported(f"split {sizes} does not cut an axis of {n} into {n_outputs} parts")
        return sizes
    k = int(num_outputs) if num_outputs is not None else n_outputs
    if num_outputs is None and n % k:
        raise Unsupported(f"an axis of {n} does not split into {k} equal parts")
    chunk = -(-n // k)
    sizes = [min(chunk, max(n - chunk * j, 0)) for j in range(k)]
    if sum(sizes) != n:
        raise Unsupported(f"num_outputs={k} does not split an axis of {n}")
    return sizes


@converter("Split", since=2)
def split(em, *, axis=0, split=None, num_outputs=None):
    """Split(input, split?) -> outputs...   attrs: axis, split (before opset 13), num_outputs (opset 18)"""
    axis = int(axis) % em.rank(0)
    given = em.require_const(1, "split").reshape(-1) if em.has_input(1) else split
    sizes = split_sizes(em.shape(0)[axis], len(em.node.outputs), given, num_outputs)
    if len(sizes) == 1:
        return em.x(0)  # ops.split would return a 1-tuple
    return f"ops.split({em.x(0)}, {tuple(sizes)!r}, axis={axis})"


@converter("Unstack", domain="torch2ms")
def unstack(em, *, axis=0):
    """torch2ms.Unstack(input) -> outputs...: every position of ``axis``, that axis dropped (the Gathers
    passes/stacking.py merged)"""
    return f"ops.unstack({em.x(0)}, axis={int(axis)})"


@converter("Stack", domain="torch2ms")
def stack(em, *, axis=0):
    """torch2ms.Stack(inputs...) -> output: the inputs along a new ``axis`` (the Unsqueezes and Concat
    passes/stacking.py merged)"""
    parts = ", ".join(em.x(i) for i in range(len(em.node.inputs)))
    return f"ops.stack(({parts}), axis={int(axis)})"


def _index_expr(x: str, per_axis: dict[int, str]) -> str:
    last = max(per_axis)
    items = [per_axis.get(a, ":") for a in range(last + 1)]
    return f"{x}[{', '.join(items)}]"


def slice_text(start: int, end: int, step: int, n: int) -> str | None:
    """Python slice text selecting what ONNX Slice selects on an axis of size ``n`` (None: the whole axis)."""
    if step == 0:
        raise Unsupported("steps contains 0")
    picked = range(*slice(start, end, step).indices(n))
    if len(picked) == n and step == 1:
        return None
    if not picked:
        return "0:0"
    first, last = picked[0], picked[-1]
    if step > 0:
        begin = "" if first == 0 else str(first)
        stop = "" if last + step >= n else str(last + 1)
    else:
        begin = "" if first == n - 1 else str(first)
        stop = "" if last + step < 0 else str(last - 1)  # a written -1 would mean the last element
    return f"{begin}:{stop}" + (f":{step}" if step != 1 else "")


@converter("Slice", since=10)
def slice_(em):
    """Slice(data, starts, ends, axes?, steps?) -> output   (starts/ends/axes/steps constants; clamped like NumPy)"""
    shape = em.shape(0)
    starts = em.require_const(1, "starts").reshape(-1).tolist()
    ends = em.require_const(2, "ends").reshape(-1).tolist()
    axes = em.require_const(3, "axes").reshape(-1).tolist() if em.has_input(3) else list(range(len(starts)))
    steps = em.require_const(4, "steps").reshape(-1).tolist() if em.has_input(4) else [1] * len(starts)
    per_axis = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) % len(shape)
        text = slice_text(int(s), int(e), int(st), shape[a])
        if text is not None:
            per_axis[a] = text
    if not per_axis:
        return em.x(0)
    return _index_expr(em.x(0), per_axis)


@converter("Cast", since=6)
def cast(em, *, to, saturate=1, round_mode="up"):  # noqa: ARG001 - both apply to float8 targets only, refused
    """Cast(input) -> output   attrs: to (every MindSpore dtype; float8, int4, string, complex refused)"""
    name, np_name = _ONNX_TYPES.get(int(to), (str(to), None))
    if np_name is None:
        raise Unsupported(f"to={name} not supported (MindSpore has no such dtype)")
    _require_dtype(em, 0, "input")
    if em.dtype(0).name == np_name:
        return em.x(0)
    return f"ops.cast({em.x(0)}, {MS_DTYPES[np_name]})"


@converter("CastLike", since=15)
def cast_like(em, *, saturate=1, round_mode="up"):  # noqa: ARG001 - both apply to float8 targets only, refused
    """CastLike(input, target_type) -> output   (the dtype of target_type; its values are not read)"""
    target = _require_dtype(em, 1, "target_type")
    _require_dtype(em, 0, "input")
    if em.dtype(0) == em.dtype(1):
        return em.x(0)
    return f"ops.cast({em.x(0)}, {target})"


@converter("Expand", since=8)
def expand(em):
    """Expand(input, shape) -> output   (shape a constant; NumPy broadcasting both ways)"""
    shape = tuple(int(d) for d in em.require_const(1, "shape").reshape(-1))
    try:
        target = np.broadcast_shapes(em.shape(0), shape)
    except ValueError:
        raise Unsupported(f"shape {shape} does not broadcast with the input's {em.shape(0)}") from None
    if tuple(target) == em.shape(0):
        return em.x(0)
    return f"ops.broadcast_to({em.x(0)}, {em.shape_code(target)})"


@converter("Tile", since=6)
def tile(em):
    """Tile(input, repeats) -> output   (repeats a constant)"""
    reps = tuple(int(r) for r in em.require_const(1, "repeats").reshape(-1))
    if all(r == 1 for r in reps):
        return em.x(0)
    return f"ops.tile({em.x(0)}, {reps!r})"


def _pad_expr(x: str, shape: tuple[int, ...], begins: list[int], ends: list[int], mode: str, value) -> str:
    """``x`` padded by ``begins``/``ends`` per axis (negative pads crop first)."""
    rank = len(shape)
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
    if mode == "constant":
        extra = f", value={literal(value)}" if value != 0 else ""
    else:
        extra = f', mode="{"replicate" if mode == "edge" else mode}"'
    return f"ops.pad({x}, {tuple(torch_pads)!r}{extra})"


@converter("Pad", since=11)
def pad(em, *, mode="constant"):
    """Pad(data, pads, constant_value?, axes?) -> output   attrs: mode

    Negative pads crop: they become a slice first (MindSpore's ops.pad gives wrong values for
    negative padding once another pad has run). ``reflect``/``edge`` pad the spatial axes only.
    """
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"mode={mode!r} not supported")
    rank = em.rank(0)
    given = [int(p) for p in em.require_const(1, "pads").reshape(-1)]
    axes = [int(a) % rank for a in em.require_const(3, "axes").reshape(-1)] if em.has_input(3) else list(range(rank))
    begins, ends = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begins[a], ends[a] = given[k], given[len(axes) + k]
    value = em.require_const(2, "constant_value") if em.has_input(2) else None
    value = value.reshape(-1)[0].item() if value is not None and value.size else 0
    if em.dtype(0).kind == "f":
        value = float(value)
    return _pad_expr(em.x(0), em.shape(0), begins, ends, mode, value)


@converter("CenterCropPad", since=18)
def center_crop_pad(em, *, axes=None):
    """CenterCropPad(input_data, shape) -> output   attrs: axes (shape a constant; crops or zero-pads around the center)"""  # noqa: E501 - the signature line is the operator table's
    shape = em.shape(0)
    rank = len(shape)
    sizes = [int(s) for s in em.require_const(1, "shape").reshape(-1)]
    axes = [int(a) % rank for a in (axes if axes is not None else range(rank))]
    if len(sizes) != len(axes):
        raise Unsupported(f"shape has {len(sizes)} values for {len(axes)} axes")
    begins, ends = [0] * rank, [0] * rank
    for a, size in zip(axes, sizes):
        diff = size - shape[a]  # > 0 pads, < 0 crops; the odd element goes after the center
        begins[a] = diff // 2 if diff >= 0 else -((-diff) // 2)
        ends[a] = diff - begins[a]
    value = 0.0 if em.dtype(0).kind == "f" else 0
    return _pad_expr(em.x(0), shape, begins, ends, "constant", value)


def _space_depth_check(em, blocksize: int, mode: str) -> None:
    if em.rank(0) != 4:
        raise Unsupported(f"only 4-D (NCHW) inputs are supported (rank {em.rank(0)})")
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"mode={mode!r} not supported")
    if blocksize < 1:
        raise Unsupported(f"blocksize={blocksize} not supported")


@converter("DepthToSpace", since=1)
def depth_to_space(em, *, blocksize, mode="DCR"):
    """DepthToSpace(input) -> output   attrs: blocksize, mode (DCR: depth-column-row, CRD: column-row-depth)"""
    _space_depth_check(em, blocksize, mode)
    b, c, h, w = em.shape(0)
    bs = int(blocksize)
    if c % (bs * bs):
        raise Unsupported(f"{c} channels do not divide by blocksize**2={bs * bs}")
    if mode == "DCR":
        split, perm = (b, bs, bs, c // bs**2, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (b, c // bs**2, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    out = (b, c // bs**2, h * bs, w * bs)
    return f"ops.reshape(ops.transpose(ops.reshape({em.x(0)}, {split!r}), {perm!r}), {em.shape_code(out)})"


@converter("SpaceToDepth", since=1)
def space_to_depth(em, *, blocksize, mode="DCR"):
    """SpaceToDepth(input) -> output   attrs: blocksize, mode (opset 28: DCR, the default, or CRD)"""
    _space_depth_check(em, blocksize, mode)
    b, c, h, w = em.shape(0)
    bs = int(blocksize)
    if h % bs or w % bs:
        raise Unsupported(f"spatial size {h}x{w} does not divide by blocksize={bs}")
    split = (b, c, h // bs, bs, w // bs, bs)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    out = (b, c * bs * bs, h // bs, w // bs)
    return f"ops.reshape(ops.transpose(ops.reshape({em.x(0)}, {split!r}), {perm!r}), {em.shape_code(out)})"
