"""Binary and n-ary elementwise ops with NumPy broadcasting, written as Python operators where
one exists (``a + b``), so the generated code reads like hand-written MindSpore.

ONNX ``Div`` on integers truncates toward zero, while ``/`` on MindSpore integer tensors is true
division (a float result): integer Div is ``ops.div(..., rounding_mode="trunc")``. ``Max``,
``Min`` and ``Sum`` take one or more inputs. ONNX ``Mod`` on floats needs ``fmod=1``.
"""

from __future__ import annotations

from functools import reduce

from torch2ms.converters.api import converter

OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*"}  # Div: below
FUNCTIONS = {
    "Pow": "ops.pow",
    "Equal": "ops.equal",
    "Greater": "ops.greater",
    "Less": "ops.less",
    "And": "ops.logical_and",
    "Or": "ops.logical_or",
}
VARIADIC = {"Max": "ops.maximum", "Min": "ops.minimum"}


def _operator(op: str, sym: str):
    def convert(em):
        return f"{em.operand(0)} {sym} {em.operand(1)}"

    convert.__name__ = op
    convert.__doc__ = f"{op}(A, B) -> C   as A {sym} B"
    return convert


def _function(op: str, fn: str):
    def convert(em):
        return f"{fn}({em.operand(0)}, {em.operand(1)})"

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
    converter(_op, since=7)(_function(_op, _fn))
for _op, _fn in VARIADIC.items():
    converter(_op, since=8)(_variadic(_op, _fn))


@converter("Div", since=7)
def div(em):
    """Div(A, B) -> C   as A / B; integer division truncates toward zero"""
    if em.value(0).dtype is not None and em.value(0).dtype.kind in "iu":
        return f'ops.div({em.operand(0)}, {em.operand(1)}, rounding_mode="trunc")'
    return f"{em.operand(0)} / {em.operand(1)}"


@converter("Mod", since=10)
def mod(em, *, fmod=0):
    """Mod(A, B) -> C   attrs: fmod (0: the result has B's sign, like Python's %; 1: A's, like C's fmod)"""
    fn = "ops.fmod" if fmod else "ops.remainder"
    return f"{fn}({em.x(0)}, {em.operand(1)})"


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
