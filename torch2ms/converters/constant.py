"""Values that need no data: Constant, Shape, Size, ConstantOfShape, Range.

The loader folds every node whose inputs are all constants (and every Shape, since shapes are
static), so these converters run only for a node that was left in the graph. What decides an
output's shape (ConstantOfShape's shape, Range's bounds) must be a constant: a run-time value
would make the shape data-dependent. Small values are written into the code as
``ms.Tensor(<literal>, <dtype>)``; larger ones are stored in the checkpoint.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import MS_DTYPES, Unsupported, converter, literal, ms_dtype

_INLINE = 16  # values up to this many elements are written as literals


def tensor_code(em, array: np.ndarray, hint: str) -> str:
    """Source for a constant tensor: a literal when small and exactly representable, else a stored tensor."""
    array = np.asarray(array)
    dtype = ms_dtype(array.dtype)
    if array.size == 0:
        return f"ops.zeros({em.shape_code(array.shape)}, {dtype})"
    exact = array.dtype.kind in "iub" or array.dtype == np.float32
    if 0 < array.size <= _INLINE and exact:
        return f"ms.Tensor({literal(array.tolist())}, {dtype})"
    return em.tensor(array, hint)


@converter("Constant", since=1)
def constant(
    em,
    *,
    value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
    sparse_value=None,
):
    """Constant() -> output   attrs: value, value_float(s), value_int(s) (strings and sparse_value refused)"""
    if sparse_value is not None:
        raise Unsupported("sparse_value not supported")
    if value_string is not None or value_strings is not None:
        raise Unsupported("value_string(s): MindSpore has no string tensors")
    if value is not None:
        array = np.asarray(value)
    elif value_float is not None:
        array = np.array(value_float, np.float32)
    elif value_floats is not None:
        array = np.array(value_floats, np.float32)
    elif value_int is not None:
        array = np.array(value_int, np.int64)
    elif value_ints is not None:
        array = np.array(value_ints, np.int64)
    else:
        raise Unsupported("no value attribute")
    return tensor_code(em, array, em.name_hint("constant"))


@converter("Shape", since=1)
def shape(em, *, start=0, end=None):
    """Shape(data) -> shape   attrs: start, end (opset 15; clamped like a Python slice)"""
    dims = em.shape(0)[int(start) : None if end is None else int(end)]
    return tensor_code(em, np.array(dims, np.int64), "shape")


@converter("Size", since=1)
def size(em):
    """Size(data) -> size   (the static element count)"""
    return f"ms.Tensor({int(np.prod(em.shape(0)))}, ms.int64)"


@converter("ConstantOfShape", since=9)
def constant_of_shape(em, *, value=None):
    """ConstantOfShape(input) -> output   attrs: value (input a constant; default float32 0)"""
    dims = tuple(int(d) for d in em.require_const(0, "input").reshape(-1))
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dtype = ms_dtype(fill.dtype)
    return f"ops.full({em.shape_code(dims)}, {literal(fill[0].item())}, dtype={dtype})"


@converter("Range", since=11)
def range_(em, *, stash_type=1):
    """Range(start, limit, delta) -> output   attrs: stash_type (opset 27; all three inputs constants)"""
    start, limit, delta = (em.require_const(i, name).reshape(()) for i, name in enumerate(("start", "limit", "delta")))
    dtype = MS_DTYPES.get(em.dtype(0).name)
    if dtype is None:
        raise Unsupported(f"dtype {em.dtype(0)} not supported")
    if np.ceil((limit - start) / delta) <= 0:
        return f"ops.zeros((0,), {dtype})"  # ops.arange refuses bounds in the wrong order
    args = ", ".join(literal(v.item()) for v in (start, limit, delta))
    if stash_type == 1 and em.dtype(0).name in ("float16", "bfloat16"):
        return f"ops.cast(ops.arange({args}, dtype=ms.float32), {dtype})"  # computed in float32, then rounded
    return f"ops.arange({args}, dtype={dtype})"
