"""Reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd.

``axes`` is an attribute up to opset 17 (ReduceSum: up to 12) and an optional constant input
after; no axes means all axes, unless ``noop_with_empty_axes=1`` (then the op is the identity).
"""

from __future__ import annotations

from torch2ms.converters.api import converter

# op -> (function, its axis keyword, its keep-dims keyword, opset where axes became an input)
REDUCTIONS = {
    "ReduceMean": ("ops.mean", "axis", "keep_dims", 18),
    "ReduceSum": ("ops.sum", "dim", "keepdim", 13),
    "ReduceMax": ("ops.amax", "axis", "keepdims", 18),
    "ReduceMin": ("ops.amin", "axis", "keepdims", 18),
    "ReduceProd": ("ops.prod", "axis", "keep_dims", 18),
}


def _reduce(op: str, fn: str, axis_kw: str, keep_kw: str):
    def convert(em, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        if axes is None and em.has_input(1):
            axes = em.require_const(1, "axes").tolist()
        rank = em.rank(0)
        if not axes:
            if noop_with_empty_axes:
                return em.x(0)
            axes = range(rank)
        dims = tuple(sorted(int(a) % rank for a in axes))
        return f"{fn}({em.x(0)}, {axis_kw}={dims!r}, {keep_kw}={bool(keepdims)})"

    convert.__name__ = op
    convert.__doc__ = (
        f"{op}(data, axes?) -> reduced   attrs: axes (before the axes input), keepdims, noop_with_empty_axes; as {fn}"
    )
    return convert


for _op, (_fn, _axis_kw, _keep_kw, _) in REDUCTIONS.items():
    converter(_op, since=1)(_reduce(_op, _fn, _axis_kw, _keep_kw))
