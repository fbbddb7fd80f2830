"""Binary and n-ary elementwise ops with NumPy broadcasting (converters/elementwise.py)."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, convert_and_run, load, make_model, rand, run_ort, x

from torch2ms.converters.elementwise import FUNCTIONS, OPERATORS, VARIADIC
from torch2ms.converters.registry import analyse

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


def check_nonfinite(op, inputs, attrs, tmp_path, *, opset):
    """check_op for outputs with infinities and NaNs, which must sit where onnxruntime has them."""
    model, feeds = make_model(op, inputs, attrs, opset=opset)
    expected = run_ort(model, feeds)
    graph, _ = load(model, feeds)
    assert [n.op_type for n in graph.nodes] == [op]
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        for a, r in zip(actual, expected):
            assert a.dtype == r.dtype and a.shape == r.shape, f"{mode}: {a.dtype}{a.shape} != {r.dtype}{r.shape}"
            np.testing.assert_allclose(a, r, rtol=1e-3, equal_nan=True, err_msg=f"{op} {attrs} ({mode} mode)")


# ONNX's float Mod edge cases (opset 28): signed zeros, infinite and zero divisors, NaN; then mixed
# signs, whose float16 results lose bits unless computed wider.
_INF = np.inf
MOD_A = [0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, _INF, -_INF, 1.0, 1.0, np.nan, 1.0, -4.3, 7.2, 5.0, 4.3, -7.2]
MOD_B = [-2.0, 2.0, 2.0, -2.0, _INF, _INF, -_INF, -_INF, 2.0, 2.0, 0.0, -0.0, 2.0, np.nan, 2.1, -3.4, 8.0, -2.1, 3.4]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_mod_float_edge_cases(dtype, fmod, tmp_path):
    a, b = np.array(MOD_A, dtype), np.array(MOD_B, dtype)
    check_nonfinite("Mod", [x(data=a), x(data=b)], {"fmod": fmod}, tmp_path, opset=28)


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_float16_mixed_signs(fmod, tmp_path):
    """Exact in float32, off by a float16 ulp when computed in float16."""
    a = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0, 100.7, -33.3], np.float16)
    b = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0, -0.3, 0.7], np.float16)
    check_op("Mod", [x(data=a), x(data=b)], {"fmod": fmod}, tmp_path, opset=28, rel_tol=0)


def test_mod_infinite_constant_divisor(tmp_path):
    """A constant divisor with infinities is guarded too; a finite one is not."""
    a = np.array([[-3.0, 3.0, 0.5, -0.5]], np.float32)
    b = np.array([_INF, -_INF, 2.0, 2.0], np.float32)
    check_nonfinite("Mod", [x(data=a), const(b)], {"fmod": 0}, tmp_path / "inf", opset=28)
    source = check_op("Mod", [x(data=a), const(np.float32(2.0))], {"fmod": 0}, tmp_path / "finite", opset=28)
    assert "ops.where" not in source


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8", "uint16", "uint32"])
def test_mod_int_dtypes(dtype, fmod, tmp_path):
    a = np.array([-4, 7, 5, 4, -7, 8, 0, 100], np.int64)
    b = np.array([2, -3, 8, -2, 3, 5, 7, -9], np.int64)
    if dtype.startswith("u"):
        a, b = np.abs(a), np.abs(b)
    check_op("Mod", [x(data=a.astype(dtype)), x(data=b.astype(dtype))], {"fmod": fmod}, tmp_path, opset=13)


# Magnitudes where float32 (2**24) would round: int32 near its limits, int64 up to 2**52.
LARGE = {
    "int32": ([2**31 - 1, -(2**31 - 5), 16777217, -7, 2**31 - 1, 123456789], [7, 7, 3, 3, -2, -10]),
    "int64": ([2**30 + 3, -(2**30 + 3), 2**40 + 5, -(2**45 + 9), 2**52 + 7, 123456789012], [7, 7, 3, 10, -6, -10]),
    "uint32": ([2**32 - 1, 2**31 + 7, 16777219, 5, 4000000000, 3], [7, 3, 2, 2, 999, 5]),
}


@pytest.mark.parametrize("dtype", list(LARGE))
@pytest.mark.parametrize("op, attrs", [("Mod", {"fmod": 0}), ("Mod", {"fmod": 1}), ("Div", {})])
def test_integer_division_large_values(op, attrs, dtype, tmp_path):
    """MindSpore's integer fmod and rounding_mode="trunc" division go through float32: not used."""
    a, b = (np.array(v, dtype) for v in LARGE[dtype])
    check_op(op, [x(data=a), x(data=b)], attrs, tmp_path, opset=13)


def test_mod_uint64_refused():
    ones = np.ones(3, np.uint64)
    check_unsupported("Mod", [x(data=ones), x(data=ones)], {}, "uint64", opset=13)


def test_mod_float_floor_before_opset28_refused():
    """onnxruntime fails on this model before opset 28, so the opset is lowered after loading."""
    model, feeds = make_model("Mod", [x(3), x(3)], {"fmod": 0}, opset=28)
    graph, _ = load(model, feeds)
    graph.opset = 13
    assert [p.reason for p in analyse(graph)] == ["fmod=0 on float inputs is defined from opset 28 on (set fmod=1)"]


def test_int_div_by_constant(tmp_path):
    check_op("Div", [x(data=np.array([7, -7, 9, -9, 0], np.int64)), const(np.int64(2))], {}, tmp_path)


COMPARISONS = ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"]


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.int32, np.uint8])
def test_comparison(op, dtype, tmp_path):
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype)
    b = np.array([3, 2, 1], dtype)
    check_op(op, [x(data=a), x(data=b)], {}, tmp_path)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op, tmp_path):
    a = np.array([[True, False], [True, True]])
    b = np.array([False, True])
    check_op(op, [x(data=a), x(data=b)], {}, tmp_path)


def test_not(tmp_path):
    check_op("Not", [x(data=np.array([[True, False, True]]))], {}, tmp_path)


INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _ints(dtype, *shape, seed=0):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(op, dtype, tmp_path):
    check_op(op, [x(data=_ints(dtype, 3, 4, 5)), x(data=_ints(dtype, 5, seed=1))], {}, tmp_path, opset=18)


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_not(dtype, tmp_path):
    check_op("BitwiseNot", [x(data=_ints(dtype, 3, 4))], {}, tmp_path, opset=18)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_variadic(op, n, tmp_path):
    """Sum/Max/Min take any number of inputs, broadcasting together."""
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 3, 4)][:n]
    check_op(op, [x(*s) for s in shapes], {}, tmp_path)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_mean(n, tmp_path):
    """Mean takes any number of inputs, broadcasting together (onnxruntime: float32 only)."""
    shapes = [(2, 3, 4), (3, 1), (4,), (1, 3, 4)][:n]
    check_op("Mean", [x(*s) for s in shapes], {}, tmp_path)


def test_mean_with_constant(tmp_path):
    check_op("Mean", [x(2, 3), const(np.float32(1.5)), x(3)], {}, tmp_path)


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
    bitwise = {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}
    assert set(FUNCTIONS) <= set(ARITH) | set(COMPARISONS) | {"And", "Or", "Xor"} | bitwise


@pytest.mark.parametrize("exponent_const", [False, True], ids=["var", "const"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_pow_integer_base_float_exponent_keeps_the_base_dtype(dtype, exponent_const, tmp_path):
    """ONNX: Z has X's type; onnxruntime computes in floating point and truncates."""
    base = np.array([[1, 2, 3, -4], [5, 0, 7, 9]], dtype)
    exponent = np.array([0.5, 2.0, 1.5, 3.0], np.float32)
    check_op("Pow", [x(data=base), const(exponent) if exponent_const else x(data=exponent)], {}, tmp_path)


def test_pow_integer_base_scalar_float_exponent(tmp_path):
    check_op("Pow", [x(data=np.array([1, 2, 3, 10], np.int64)), const(np.float32(1.5))], {}, tmp_path)
