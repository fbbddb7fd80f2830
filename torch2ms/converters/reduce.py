"""Reductions (ReduceSum ... ReduceLogSumExp), ArgMax/ArgMin, TopK and the cumulative ops.

``axes`` is an attribute up to opset 17 (ReduceSum: up to 12) and an optional constant input
after; no axes means all axes, unless ``noop_with_empty_axes=1``: then nothing is reduced but the
elementwise part still applies, as in onnxruntime (ReduceL1 -> |x|, ReduceLogSum -> log x). The
composed reductions are that elementwise part around one MindSpore reduction:

    ReduceL1 = sum|x|   ReduceL2 = sqrt(sum x²)   ReduceSumSquare = sum x²   ReduceLogSum = log(sum x)

Dtypes: MindSpore's ``ops.sum``, ``ops.prod`` and ``ops.cumprod`` widen integers to int64 and
``ops.argmin`` answers int32, so the converters ask for ONNX's dtype explicitly. ``ops.prod`` has
no float16 CPU kernel (float16 products are taken in float32), ``ops.amax``/``ops.amin`` no bool
one (boolean ReduceMax/ReduceMin, opset 20, are ``ops.any``/``ops.all``). Integer ReduceL2 is
taken in float64 and truncated, like onnxruntime.

TopK breaks ties by the lower index (ONNX); MindSpore's ``ops.topk`` does not (and its smallest-k
is wrong on uint8), but ``ops.sort`` is stable: TopK is the first k of a sort. ``sorted=0``
leaves the order to the implementation; it is converted sorted. ArgMax/ArgMin
``select_last_index=1`` is the arg of the flipped axis, counted from the end.

A reduction over an axis of length 0 is the reduction's identity (0 for the sums, 1 for the
product, -inf/+inf for max/min, -inf for the log-sums, NaN for the mean), a constant of the output
shape: MindSpore's kernels return uninitialised memory there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from torch2ms.converters.api import Unsupported, converter, ms_dtype


class Reduction(NamedTuple):
    fn: str  # MindSpore reduction
    axis_kw: str  # its axis keyword
    keep_kw: str  # its keep-dims keyword
    axes_input_since: int  # opset where ONNX's axes became an input
    before: str | None = None  # elementwise op applied before reducing
    after: str | None = None  # ... and after


REDUCTIONS = {
    "ReduceMean": Reduction("ops.mean", "axis", "keep_dims", 18),
    "ReduceSum": Reduction("ops.sum", "dim", "keepdim", 13),
    "ReduceMax": Reduction("ops.amax", "axis", "keepdims", 18),
    "ReduceMin": Reduction("ops.amin", "axis", "keepdims", 18),
    "ReduceProd": Reduction("ops.prod", "axis", "keep_dims", 18),
    "ReduceL1": Reduction("ops.sum", "dim", "keepdim", 18, before="ops.abs"),
    "ReduceL2": Reduction("ops.sum", "dim", "keepdim", 18, before="ops.square", after="ops.sqrt"),
    "ReduceSumSquare": Reduction("ops.sum", "dim", "keepdim", 18, before="ops.square"),
    "ReduceLogSum": Reduction("ops.sum", "dim", "keepdim", 18, after="ops.log"),
    "ReduceLogSumExp": Reduction("ops.logsumexp", "dim", "keepdim", 18),
}
# Boolean ReduceMax/ReduceMin (opset 20): MindSpore's amax/amin have no bool kernel.
_BOOL = {"ReduceMax": "ops.any", "ReduceMin": "ops.all"}
# What a reduction over nothing gives (ONNX: the identity of the reduction).
_EMPTY = {"ReduceMean": np.nan, "ReduceProd": 1, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf}
_EMPTY["ReduceLogSumExp"] = -np.inf


def _identity(op: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    value = _EMPTY.get(op, 0)
    if dtype.kind in "iu" and not np.isfinite(value):
        value = np.iinfo(dtype).min if value < 0 else np.iinfo(dtype).max
    if dtype == np.bool_:
        value = op == "ReduceMin"
    return np.full(shape, value, dtype=dtype)


# Float-only by definition (log/exp); ONNX dropped their integer forms at opset 28.
_FLOAT_ONLY = {"ReduceLogSum", "ReduceLogSumExp"}


def _wrap(fn: str | None, expr: str) -> str:
    return f"{fn}({expr})" if fn else expr


def _reduce(op: str, r: Reduction):
    def convert(em, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        dtype = em.dtype(0)
        if op in _FLOAT_ONLY and dtype.kind != "f":
            raise Unsupported(f"{op} on {dtype} input not supported (log/exp of an integer tensor)")
        if axes is None and em.has_input(1):
            axes = em.require_const(1, "axes").tolist()
        rank = em.rank(0)
        x = em.x(0)
        int_l2 = op == "ReduceL2" and dtype.kind in "iu"
        if not axes and noop_with_empty_axes:
            if int_l2:
                return f"ops.abs({x})"
            return _wrap(r.after, _wrap(r.before, x))
        dims = tuple(sorted(int(a) % rank for a in axes)) if axes else tuple(range(rank))
        if any(em.shape(0)[d] == 0 for d in dims):
            return em.tensor(_identity(op, em.out_dtype(0), em.out_shape(0)), "empty_reduction")
        if dtype == np.bool_ and op in _BOOL:
            return f"{_BOOL[op]}({x}, {dims!r}, {bool(keepdims)})"
        args = f"{_wrap(r.before, x)}, {r.axis_kw}={dims!r}, {r.keep_kw}={bool(keepdims)}"
        if r.fn in ("ops.sum", "ops.prod") and dtype.kind in "iub" and dtype != np.int64:
            args += f", dtype={ms_dtype(dtype)}"  # they widen to int64 otherwise
        if r.fn == "ops.prod" and dtype == np.float16:
            return f"ops.cast({r.fn}({args}, dtype=ms.float32), ms.float16)"  # no float16 CPU kernel
        call = f"{r.fn}({args})"
        if int_l2:
            return f"ops.cast(ops.sqrt(ops.cast({call}, ms.float64)), {ms_dtype(dtype)})"
        return _wrap(r.after, call)

    convert.__name__ = op
    what = _wrap(r.after, f"{r.fn}({_wrap(r.before, 'data')})")
    convert.__doc__ = (
        f"{op}(data, axes?) -> reduced   attrs: axes (before the axes input), keepdims, noop_with_empty_axes; as {what}"
    )
    return convert


for _op, _r in REDUCTIONS.items():
    converter(_op, since=1)(_reduce(_op, _r))


def _arg(op: str, fn: str):
    def convert(em, *, axis=0, keepdims=1, select_last_index=0):
        rank = em.rank(0)
        axis = int(axis) % rank
        x = em.x(0)
        if select_last_index:
            x = f"ops.flip({x}, ({axis},))"
        call = f"{fn}({x}, {axis}, {bool(keepdims)})"
        if fn == "ops.argmin":
            call = f"ops.cast({call}, ms.int64)"  # ops.argmin answers int32
        if select_last_index:
            return f"{em.shape(0)[axis] - 1} - {call}"
        return call

    convert.__name__ = op
    convert.__doc__ = f"{op}(data) -> reduced   attrs: axis, keepdims, select_last_index; as {fn} (int64)"
    return convert


converter("ArgMax", since=1)(_arg("ArgMax", "ops.argmax"))
converter("ArgMin", since=1)(_arg("ArgMin", "ops.argmin"))

# ops.sort has no CPU kernel for these
_NO_ARGSORT = {np.dtype(t) for t in ("uint16", "uint32", "uint64")}


@converter("TopK", since=10)
def top_k(em, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - ONNX name
    """TopK(X, K) -> Values, Indices   attrs: axis, largest, sorted (K constant; ties: the lower index first)"""
    k = int(em.require_const(1, "K").reshape(-1)[0])
    if em.dtype(0) in _NO_ARGSORT:
        raise Unsupported(f"TopK on {em.dtype(0)} input not supported (MindSpore has no CPU sort for it)")
    rank = em.rank(0)
    axis = int(axis) % rank
    x = em.x(0)
    index = "..., " if axis == rank - 1 and rank > 1 else ":, " * axis
    top = f"ops.sort({x}, axis={axis}, descending={bool(largest)})"
    values, indices = f"{top}[0][{index}:{k}]", f"{top}[1][{index}:{k}]"
    return f"{values}, ops.cast({indices}, ms.int64)"


def _cumulative(op: str, fn: str, prim: str):
    def convert(em, *, exclusive=0, reverse=0):
        axis = int(em.require_const(1, "axis").reshape(-1)[0]) % em.rank(0)
        if not exclusive and not reverse:
            dtype = em.dtype(0)
            widened = fn == "ops.cumprod" and dtype.kind in "iu" and dtype != np.int64
            return f"{fn}({em.x(0)}, {axis}" + (f", dtype={ms_dtype(dtype)})" if widened else ")")
        kwargs = {k: True for k, v in (("exclusive", exclusive), ("reverse", reverse)) if v}
        layer = em.layer(prim, **kwargs)
        return f"{layer}({em.x(0)}, {axis})"

    convert.__name__ = op
    convert.__doc__ = f"{op}(x, axis) -> y   attrs: exclusive, reverse (axis constant); as {fn} or {prim}"
    return convert


converter("CumSum", since=11)(_cumulative("CumSum", "ops.cumsum", "ops.CumSum"))
converter("CumProd", since=26)(_cumulative("CumProd", "ops.cumprod", "ops.CumProd"))
