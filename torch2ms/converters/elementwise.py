"""Binary elementwise ops with NumPy broadcasting, written as Python operators where one
exists (``a + b``), so the generated code reads like hand-written MindSpore."""

from __future__ import annotations

from torch2ms.converters.registry import converter

OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}
FUNCTIONS = {"Pow": "ops.pow", "Max": "ops.maximum", "Min": "ops.minimum", "Equal": "ops.equal", "Greater": "ops.greater", "Less": "ops.less", "And": "ops.logical_and", "Or": "ops.logical_or"}


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


for _op, _sym in OPERATORS.items():
    converter(_op, since=7)(_operator(_op, _sym))
for _op, _fn in FUNCTIONS.items():
    converter(_op, since=7)(_function(_op, _fn))


@converter("Sum", since=8)
def sum_(em):
    """Sum(data_0, ...) -> sum"""
    return " + ".join(em.operand(i) for i in range(em.n_inputs()))


@converter("Where", since=9)
def where(em):
    """Where(condition, X, Y) -> output"""
    return f"ops.where({em.x(0)}, {em.x(1)}, {em.x(2)})"


@converter("Not", since=1)
def not_(em):
    """Not(X) -> Y"""
    return f"ops.logical_not({em.x(0)})"
