"""Binary and n-ary elementwise ops with NumPy broadcasting (converters/elementwise.py)."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, const, rand, x

from torch2ms.converters.elementwise import FUNCTIONS, OPERATORS, VARIADIC

# (A, B) shape pairs: same shape, trailing-axis, per-channel, both sides broadcasting, rank 0
BROADCASTS = {
    "same": ((2, 3, 4), (2, 3, 4)),
    "trailing": ((2, 3, 4, 5), (5,)),
    "per_channel": ((2, 3, 4, 5), (1, 3, 1, 1)),
    "both": ((2, 1, 4), (3, 1)),
    "scalar_rhs": ((2, 3), ()),
    "lower_rank_lhs": ((4,), (2, 3, 4)),
}
ARITH = sorted(OPERATORS) + ["Div", "Pow"] + sorted(VARIADIC)


def _operands(op: str, a_shape, b_shape, const_b: bool, seed: int = 0):
    a = rand(*a_shape, seed=seed)
    b = rand(*b_shape, seed=seed + 1)
    if op == "Div":
        b = np.where(np.abs(b) < 0.5, 1.0, b).astype(np.float32)
    if op == "Pow":
        a = np.abs(a) + 0.5
    return x(data=a), (const(b) if const_b else x(data=b))


@pytest.mark.parametrize("const_b", [False, True], ids=["var", "const"])
@pytest.mark.parametrize("shapes", list(BROADCASTS))
@pytest.mark.parametrize("op", ARITH)
def test_binary_float(op, shapes, const_b, tmp_path):
    a, b = _operands(op, *BROADCASTS[shapes], const_b)
    check_op(op, [a, b], {}, tmp_path, opset=13 if op in ("Max", "Min") else 17)


@pytest.mark.parametrize("op", sorted(OPERATORS) + ["Div"])
def test_constant_on_the_left(op, tmp_path):
    """``2.5 - x``: the scalar constant is the first operand."""
    data = rand(2, 3, low=0.5, high=2.0)
    check_op(op, [const(np.float32(2.5)), x(data=data)], {}, tmp_path)


@pytest.mark.parametrize("exponent", [2.0, 0.5, 3.0, -1.0])
def test_pow_constant_exponent(exponent, tmp_path):
    check_op("Pow", [x(2, 3, 4, data=rand(2, 3, 4, low=0.5, high=2.0)), const(np.float32(exponent))], {}, tmp_path)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_int64(op, tmp_path):
    """Integer arithmetic stays integer; ONNX integer Div truncates toward zero."""
    a = np.array([[7, -7, 9, -9], [5, 0, -1, 12]], np.int64)
    b = np.array([2, 2, -4, 4], np.int64)
    check_op(op, [x(data=a), x(data=b)], {}, tmp_path)


@pytest.mark.parametrize("dtype, fmod", [(np.int64, 0), (np.int64, 1), (np.float32, 1)])  # float Mod needs fmod=1
def test_mod(dtype, fmod, tmp_path):
    a = np.array([[7, -7, 9, -9, 0, 5]], dtype) + (0.5 if dtype == np.float32 else 0)
    b = np.array([3, 3, -4, -4, 3, -2], dtype)
    check_op("Mod", [x(data=a.astype(dtype)), x(data=b)], {"fmod": fmod}, tmp_path / "var")
    check_op("Mod", [x(data=a.astype(dtype)), const(dtype(3))], {"fmod": fmod}, tmp_path / "const")


def test_int_div_by_constant(tmp_path):
    check_op("Div", [x(data=np.array([7, -7, 9, -9, 0], np.int64)), const(np.int64(2))], {}, tmp_path)


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparison(op, dtype, tmp_path):
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype)
    b = np.array([3, 2, 1], dtype)
    check_op(op, [x(data=a), x(data=b)], {}, tmp_path)


@pytest.mark.parametrize("op", ["And", "Or"])
def test_logical(op, tmp_path):
    a = np.array([[True, False], [True, True]])
    b = np.array([False, True])
    check_op(op, [x(data=a), x(data=b)], {}, tmp_path)


def test_not(tmp_path):
    check_op("Not", [x(data=np.array([[True, False, True]]))], {}, tmp_path)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_variadic(op, n, tmp_path):
    """Sum/Max/Min take any number of inputs, broadcasting together."""
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 3, 4)][:n]
    check_op(op, [x(*s) for s in shapes], {}, tmp_path)


@pytest.mark.parametrize(
    "cond_shape, x_shape, y_shape, const_xy",
    [
        ((2, 3), (2, 3), (2, 3), False),
        ((3,), (2, 3), (1,), False),
        ((2, 1), (2, 3), (), True),
        ((2, 3), (), (2, 3), True),
    ],
    ids=["same", "broadcast", "const_scalar_y", "const_scalar_x"],
)
def test_where(cond_shape, x_shape, y_shape, const_xy, tmp_path):
    cond = rand(*cond_shape, seed=7) > 0
    xs, ys = rand(*x_shape, seed=8), rand(*y_shape, seed=9)
    wrap_x = const if const_xy and xs.ndim == 0 else lambda d: x(data=d)
    wrap_y = const if const_xy and ys.ndim == 0 else lambda d: x(data=d)
    check_op("Where", [x(data=cond), wrap_x(xs), wrap_y(ys)], {}, tmp_path)


def test_function_table_is_tested():
    assert set(FUNCTIONS) <= set(ARITH) | {"Equal", "Greater", "Less", "And", "Or"}
