"""Binary and n-ary elementwise ops with NumPy broadcasting, written as Python operators where
one exists (``a + b``), so the generated code reads like hand-written MindSpore.

ONNX ``Div`` on integers truncates toward zero, while ``/`` on MindSpore integer tensors is true
division (a float result): integer Div is ``ops.truncate_div``, which is exact up to 32 bits and
for int64 up to 2**53 (``ops.div(..., rounding_mode="trunc")`` goes through float32: wrong past
2**24). ``Pow`` has the base's dtype: an integer base with a float exponent is computed in
float64 (as ONNX's reference does) and cast back, truncating. ``Max``, ``Min``, ``Sum`` and
``Mean`` take one or more inputs.

``Mod``: ``fmod=1`` is C's fmod (the sign of A), ``fmod=0`` Python's % (the sign of B), for floats
only from opset 28. Floats: MindSpore's ``ops.fmod``/``ops.remainder`` differ from ONNX where B is
infinite (ONNX: A, or B when the signs differ under fmod=0; MindSpore: NaN), so a B that is not a
finite constant is guarded; float16 is computed in float32 (in float16 it loses the last bits).
Integers: ``ops.remainder`` is exact (int64: up to 2**53); integer ``ops.fmod`` goes through
float32, so fmod=1 is ``A - truncate_div(A, B) * B``; unsigned fmod=1 equals fmod=0; uint32 goes
through int64 (no GRAPH-mode kernel); uint64 is refused (no GRAPH-mode kernel, and the PyNative
one goes through float64).
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from torch2ms.converters.api import Unsupported, converter, ms_dtype

OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*"}  # Div: below
FUNCTIONS = {
    "Equal": "ops.equal",
    "Greater": "ops.greater",
    "Less": "ops.less",
    "GreaterOrEqual": "ops.greater_equal",
    "LessOrEqual": "ops.less_equal",
    "And": "ops.logical_and",
    "Or": "ops.logical_or",
    "Xor": "ops.logical_xor",
    "BitwiseAnd": "ops.bitwise_and",
    "BitwiseOr": "ops.bitwise_or",
    "BitwiseXor": "ops.bitwise_xor",
}
# The opset each op appeared in where it is not 7.
_SINCE = {"GreaterOrEqual": 12, "LessOrEqual": 12, "BitwiseAnd": 18, "BitwiseOr": 18, "BitwiseXor": 18}
VARIADIC = {"Max": "ops.maximum", "Min": "ops.minimum"}


def _operator(op: str, sym: str):
    def convert(em):
        return f"{em.operand(0)} {sym} {em.operand(1)}"

    convert.__name__ = op
    convert.__doc__ = f"{op}(A, B) -> C   as A {sym} B"
    return convert


def _function(op: str, fn: str):
    def convert(em):
        first = em.operand(0)
        if em.value(0).is_const and not first.startswith("self."):
            # a constant written as a Python scalar: MindSpore's functions take a tensor first
            first = f"ms.Tensor({first}, {ms_dtype(em.dtype(0))})"
        return f"{fn}({first}, {em.operand(1)})"

    convert.__name__ = op
    convert.__doc__ = f"{op}(A, B) -> C   as {fn}(A, B)"
    return convert


def _variadic(op: str, fn: str):
    def convert(em):
        return reduce(lambda acc, i: f"{fn}({acc}, {em.operand(i)})", range(1, em.n_inputs()), em.x(0))

    convert.__name__ = op
    convert.__doc__ = f"{op}(data_0, ...) -> result   as nested {fn}"
    return convert


for _op, _sym in OPERATORS.items():
    converter(_op, since=7)(_operator(_op, _sym))
for _op, _fn in FUNCTIONS.items():
    converter(_op, since=_SINCE.get(_op, 7))(_function(_op, _fn))
for _op, _fn in VARIADIC.items():
    converter(_op, since=8)(_variadic(_op, _fn))


@converter("Div", since=7)
def div(em):
    """Div(A, B) -> C   as A / B; integer division truncates toward zero"""
    if em.value(0).dtype is not None and em.value(0).dtype.kind in "iu":
        return f"ops.truncate_div({em.operand(0)}, {em.operand(1)})"
    return f"{em.operand(0)} / {em.operand(1)}"


def _mod(em, fmod: int) -> str:
    a, b = em.x(0), em.operand(1)
    dtype = em.dtype(0)
    if dtype.kind == "f" and not fmod and em.graph.opset < 28:
        raise Unsupported("fmod=0 on float inputs is defined from opset 28 on (set fmod=1)")
    if dtype == np.uint64:
        raise Unsupported("Mod on uint64 not supported (MindSpore has no exact CPU kernel for it)")
    if dtype.kind == "u":  # fmod=1 is fmod=0 on unsigned integers
        if dtype == np.uint32:
            return f"ops.cast(ops.remainder(ops.cast({a}, ms.int64), ops.cast({b}, ms.int64)), ms.uint32)"
        return f"ops.remainder({a}, {b})"
    if dtype.kind == "i":
        return f"{a} - ops.truncate_div({a}, {b}) * {b}" if fmod else f"ops.remainder({a}, {b})"
    fn = "ops.fmod" if fmod else "ops.remainder"
    if dtype == np.float16:
        core = f"ops.cast({fn}(ops.cast({a}, ms.float32), ops.cast({b}, ms.float32)), ms.float16)"
    else:
        core = f"{fn}({a}, {b})"
    divisor = em.const(1)
    if divisor is not None and np.isfinite(divisor).all():
        return core
    finite_by_inf = f"ops.isinf({b}) & ops.isfinite({a})"
    inf_result = a if fmod else f"ops.where({a} * {b} < 0, {b}, {a})"
    return f"ops.where({finite_by_inf}, {inf_result}, {core})"


@converter("Mod", since=10)
def mod(em, *, fmod=0):
    """Mod(A, B) -> C   attrs: fmod (0: the result has B's sign, like Python's %; 1: A's, like C's fmod)"""
    return _mod(em, fmod)


@converter("Mod", since=28)
def mod_v28(em, *, fmod=0):
    """Mod(A, B) -> C   attrs: fmod (opset 28: fmod=0 on floats too, infinities and zeros spelled out)"""
    return _mod(em, fmod)


@converter("Pow", since=7)
def pow_(em):
    """Pow(X, Y) -> Z   as ops.pow(X, Y); Z has X's dtype (an integer X by a float Y: in float64, then cast)"""
    first = em.operand(0)
    if em.value(0).is_const and not first.startswith("self."):
        first = f"ms.Tensor({first}, {ms_dtype(em.dtype(0))})"  # ops.pow takes a tensor first
    base, exponent = em.dtype(0), em.dtype(1)
    if base.kind in "iu" and exponent.kind == "f":
        wide = f"ops.pow(ops.cast({first}, ms.float64), ops.cast({em.x(1)}, ms.float64))"
        return f"ops.cast({wide}, {ms_dtype(base)})"
    return f"ops.pow({first}, {em.operand(1)})"


@converter("Mean", since=8)
def mean(em):
    """Mean(data_0, ...) -> mean   as the sum over the count"""
    n = em.n_inputs()
    if n == 1:
        return em.x(0)
    return "(" + " + ".join([em.x(0)] + [em.operand(i) for i in range(1, n)]) + f") / {n}"


@converter("Sum", since=8)
def sum_(em):
    """Sum(data_0, ...) -> sum"""
    return " + ".join([em.x(0)] + [em.operand(i) for i in range(1, em.n_inputs())])


@converter("Where", since=9)
def where(em):
    """Where(condition, X, Y) -> output"""
    return f"ops.where({em.x(0)}, {em.x(1)}, {em.x(2)})"


@converter("Not", since=1)
def not_(em):
    """Not(X) -> Y"""
    return f"ops.logical_not({em.x(0)})"
