"""Sign, IsInf, BitShift, Trilu, EyeLike, Det and Einsum (converters/math.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, i64, load, make_model, rand, x

from torch2ms.converters.registry import analyse

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


# --- Sign ---


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"] + INTS)
def test_sign(dtype, tmp_path):
    """ops.sign lacks int8/int16 and unsigned kernels: they go through int32 or x != 0."""
    values = np.array([[-3, -1, 0, 1, 2, 7], [0, 5, -8, 0, -1, 9]])
    if dtype.startswith("u"):
        values = np.abs(values)
    check_op("Sign", [x(data=values.astype(dtype))], {}, tmp_path, opset=13)


# --- IsInf / IsNaN ---

SPECIAL = np.array([[1.0, -np.inf, np.inf, np.nan, 0.0, -2.5]], np.float32)


@pytest.mark.parametrize("detect_negative, detect_positive", [(None, None), (0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_is_inf(dtype, detect_negative, detect_positive, tmp_path):
    attrs = {
        k: v for k, v in (("detect_negative", detect_negative), ("detect_positive", detect_positive)) if v is not None
    }
    check_op("IsInf", [x(data=SPECIAL.astype(dtype))], attrs, tmp_path, opset=20)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_is_nan(dtype, tmp_path):
    check_op("IsNaN", [x(data=SPECIAL.astype(dtype))], {}, tmp_path, opset=20)


# --- BitShift ---


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_bit_shift(dtype, direction, tmp_path):
    """Shift amounts 0 .. width + 2: past the width the result is 0 (opset 11 unsigned types)."""
    bits = np.dtype(dtype).itemsize * 8
    info = np.iinfo(dtype)
    values = np.array([1, 5, info.max, info.max // 3, 200, 7, 1, 3], dtype)
    shifts = np.array([0, 1, 3, bits - 1, bits, bits + 2, 2, 1], dtype)
    check_op("BitShift", [x(data=values), x(data=shifts)], {"direction": direction}, tmp_path, opset=11)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_bit_shift_signed(dtype, direction, tmp_path):
    """Opset 28: signed types; right shifts fill with the sign bit, out-of-range amounts give 0 or -1."""
    bits = np.dtype(dtype).itemsize * 8
    info = np.iinfo(dtype)
    values = np.array([-8, 4, -1, info.min, info.max, 100, -100, 1, -3, 7], dtype)
    shifts = np.array([1, 2, 0, 1, 3, bits - 1, bits, bits + 1, -1, -bits], dtype)
    check_op("BitShift", [x(data=values), x(data=shifts)], {"direction": direction}, tmp_path, opset=28)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_constant_in_range(direction, tmp_path):
    """A constant amount known to be in range is a plain shift, broadcast."""
    source = check_op(
        "BitShift",
        [x(data=np.arange(12, dtype=np.uint8).reshape(3, 4) * 9), const(np.array([1, 2, 3, 7], np.uint8))],
        {"direction": direction},
        tmp_path,
        opset=11,
    )
    assert "ops.where" not in source


def test_bit_shift_bad_direction_refused():
    """onnxruntime rejects the model itself, so the direction is changed after loading."""
    model, feeds = make_model(
        "BitShift", [x(data=np.ones(3, np.uint8)), x(data=np.ones(3, np.uint8))], {"direction": "LEFT"}
    )
    graph, _ = load(model, feeds)
    graph.nodes[0].attrs["direction"] = "UP"
    assert [p.reason for p in analyse(graph)] == ["direction='UP' not supported (LEFT or RIGHT)"]


# --- Trilu ---


@pytest.mark.parametrize("k", [None, 0, 1, -1, 3, -4])
@pytest.mark.parametrize("upper", [None, 0])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5, 4)], ids=["2d", "batched"])
def test_trilu(shape, upper, k, tmp_path):
    inputs = [x(*shape)] + ([i64(k)] if k is not None else [])
    check_op("Trilu", inputs, {} if upper is None else {"upper": upper}, tmp_path, opset=14)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "float16", "float64"])
def test_trilu_dtypes(dtype, tmp_path):
    data = np.random.default_rng(0).integers(0, 5, (3, 4)).astype(dtype)
    for upper in (0, 1):
        check_op("Trilu", [x(data=data), i64(1)], {"upper": upper}, tmp_path / str(upper), opset=14)


def test_trilu_runtime_k_refused():
    check_unsupported("Trilu", [x(3, 3), x(data=np.array(1, np.int64))], {}, "k", opset=14)


# --- EyeLike ---


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((4, 4), {}),
        ((3, 5), {"k": 1}),
        ((5, 3), {"k": -2}),
        ((3, 4), {"dtype": 11}),
        ((4, 5), {"dtype": 1, "k": 1}),
        ((3, 3), {"dtype": 7}),
        ((2, 6), {"k": 9}),
    ],
    ids=["square", "k1", "k-2", "double", "float_k1", "int64", "k_past_the_end"],
)
def test_eye_like(shape, attrs, tmp_path):
    check_op("EyeLike", [x(data=np.zeros(shape, np.int32))], attrs, tmp_path, opset=22)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint64"])
def test_eye_like_input_dtypes(dtype, tmp_path):
    check_op("EyeLike", [x(data=np.zeros((3, 4), dtype))], {}, tmp_path, opset=22)


# --- Det ---


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 3, 2, 2), (1, 1), (3, 1, 1)])
def test_det(shape, tmp_path):
    """float32 (onnxruntime's only Det kernel); 1x1 matrices, which ops.det refuses, are their element."""
    check_op("Det", [x(*shape, seed=4)], {}, tmp_path, opset=22)


# --- Einsum ---

EQUATIONS = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 5)]),
    "batch_matmul": ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    "attention_scores": ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    "attention_values": ("bhqk,bhkd->bqhd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    "transpose": ("ij->ji", [(3, 4)]),
    "sum_rows": ("ij->i", [(3, 4)]),
    "sum_all": ("ij->", [(3, 4)]),
    "inner": ("i,i", [(5,), (5,)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "hadamard": ("ij,ij->ij", [(3, 4), (3, 4)]),
    "implicit": ("ij,jk", [(3, 4), (4, 5)]),
    "implicit_order": ("ba,cb", [(4, 3), (5, 4)]),
    "diagonal": ("ii->i", [(4, 4)]),
    "trace": ("ii", [(4, 4)]),
    "batch_diagonal": ("...ii ->...i", [(3, 5, 5)]),
    "ellipsis_matmul": ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    "ellipsis_broadcast": ("...ij,...jk", [(2, 1, 4, 5), (1, 3, 5, 6)]),
    "ellipsis_middle": ("b...d,b...d->b...", [(2, 3, 4, 5), (2, 3, 4, 5)]),
    "bilinear": ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    "three_chain": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    "free_summed": ("ijk,jl->il", [(2, 3, 4), (3, 5)]),
    "sum_then_outer": ("ij,kl->ik", [(2, 3), (4, 5)]),
    "scalar": ("->", [()]),
    "batch_outer": ("bi,bj->bij", [(2, 3), (2, 4)]),
    "uppercase": ("Ab,bC->AC", [(3, 4), (4, 2)]),
}


@pytest.mark.parametrize("name", list(EQUATIONS))
def test_einsum(name, tmp_path):
    equation, shapes = EQUATIONS[name]
    inputs = [x(*s, data=rand(*s, seed=k)) for k, s in enumerate(shapes)]
    check_op("Einsum", inputs, {"equation": equation}, tmp_path, opset=12)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "int64"])
def test_einsum_dtypes(dtype, tmp_path):
    rng = np.random.default_rng(1)
    a, b = rng.integers(-3, 4, (2, 3, 4)).astype(dtype), rng.integers(-3, 4, (2, 4, 5)).astype(dtype)
    tol = 2e-3 if dtype == "float16" else 1e-5
    check_op("Einsum", [x(data=a), x(data=b)], {"equation": "bij,bjk->bik"}, tmp_path / "mm", opset=12, rel_tol=tol)
    check_op("Einsum", [x(data=a)], {"equation": "bij->j"}, tmp_path / "sum", opset=12, rel_tol=tol)


@pytest.mark.parametrize("shape", [(3, 0, 5), (0, 4), (2, 3, 0)])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_of_an_empty_matrix(shape, upper, tmp_path):
    """MindSpore's CPU tril kernel refuses a width of 0: the (empty) input is the result."""
    check_op("Trilu", [x(data=np.zeros(shape, np.float32)), i64(1)], {"upper": upper}, tmp_path, opset=14)
