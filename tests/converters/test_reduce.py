"""Reductions, ArgMax/ArgMin, TopK, CumSum/CumProd (converters/reduce.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import (
    check_op,
    check_unsupported,
    const,
    convert_and_run,
    i64,
    load,
    make_model,
    rand,
    run_ort,
    x,
)

from torch2ms.converters.reduce import REDUCTIONS
from torch2ms.converters.registry import analyse

AXES = {"spatial": [2, 3], "channel": [1], "negative": [-1], "all": None, "mixed": [0, -1]}
# The dtypes onnxruntime's CPU kernels take besides float32 (measured), per op.
_COMMON = ["float16", "float64", "int32", "int64"]
DTYPES = {op: _COMMON for op in REDUCTIONS} | {
    "ReduceMax": _COMMON + ["int8", "uint8"],
    "ReduceMin": _COMMON + ["int8", "uint8"],
    "ReduceLogSum": ["float16", "float64"],
    "ReduceLogSumExp": ["float16", "float64"],
}


def _positive(*shape):
    """Data every reduction is defined on (ReduceLogSum needs a positive sum)."""
    return x(*shape, data=rand(*shape, low=0.5, high=1.5))


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", list(AXES))
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
def test_reduce(op, axes, keepdims, tmp_path):
    """Axes as the attribute (opset 11/13) and as the input (from the opset the op changed)."""
    data = _positive(2, 3, 4, 5)
    since_input = REDUCTIONS[op].axes_input_since
    ax = AXES[axes]
    attr_opset = 11 if since_input > 11 else None
    if attr_opset:
        attrs = {"keepdims": keepdims} | ({"axes": ax} if ax is not None else {})
        check_op(op, [data], attrs, tmp_path / "attr", opset=attr_opset)
    inputs = [data] + ([i64(*ax)] if ax is not None else [])
    check_op(op, inputs, {"keepdims": keepdims}, tmp_path / "input", opset=max(since_input, 13))


@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
def test_reduce_empty_axes(op, noop, tmp_path):
    """Empty axes reduce everything, or (noop_with_empty_axes=1) only the elementwise part applies."""
    data = _positive(2, 3, 4)
    check_op(op, [data, const(np.zeros(0, np.int64))], {"noop_with_empty_axes": noop}, tmp_path, opset=18)


def test_reduce_default_keepdims_no_axes(tmp_path):
    check_op("ReduceL2", [x(3, 5)], {}, tmp_path, opset=18)


@pytest.mark.parametrize(
    "op, dtype", [(op, dt) for op in sorted(REDUCTIONS) for dt in DTYPES[op]], ids=lambda v: str(v)
)
def test_reduce_dtypes(op, dtype, tmp_path):
    """Integer reductions stay in the input dtype (MindSpore would widen sums and products to int64)."""
    if dtype.startswith(("int", "uint")):
        low = 0 if dtype.startswith("u") or "Log" in op else -4
        data = np.random.default_rng(3).integers(low, 5, (3, 4, 5)).astype(dtype)
    else:
        data = rand(3, 4, 5, low=0.5, high=1.5).astype(dtype)
    tol = 2e-3 if dtype == "float16" else 1e-5
    for keepdims in (0, 1):
        check_op(op, [x(data=data), i64(0, 2)], {"keepdims": keepdims}, tmp_path / str(keepdims), opset=18, rel_tol=tol)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op, keepdims, tmp_path):
    """Opset 20: boolean max/min are any/all."""
    data = np.array([[[True, False, True], [False, False, False]], [[True, True, True], [False, True, False]]])
    for k, axes in enumerate([[1], [0, 2], None]):
        inputs = [x(data=data)] + ([i64(*axes)] if axes else [])
        check_op(op, inputs, {"keepdims": keepdims}, tmp_path / str(k), opset=20)


def test_reduce_l2_int_noop(tmp_path):
    check_op(
        "ReduceL2",
        [x(data=np.array([[3, -4, 0]], np.int32)), const(np.zeros(0, np.int64))],
        {"noop_with_empty_axes": 1},
        tmp_path,
        opset=18,
    )


@pytest.mark.parametrize("op", ["ReduceLogSum", "ReduceLogSumExp"])
def test_reduce_log_of_integers_refused(op):
    check_unsupported(op, [x(data=np.ones((2, 3), np.int32)), i64(1)], {}, "int32", opset=18)


def test_reduce_runtime_axes_refused():
    check_unsupported("ReduceL1", [x(2, 3), x(data=np.array([1], np.int64))], {}, "axes", opset=18)


# --- ArgMax / ArgMin ---


def _given(**attrs):
    """The attributes that are not None (None: left to the spec's default)."""
    return {k: v for k, v in attrs.items() if v is not None}


TIES = np.array(
    [[[1, 3, 3, 0, 3], [2, 2, 1, 2, 0], [5, 5, 5, 5, 5]], [[0, 0, 1, 1, 0], [4, 1, 4, 1, 4], [2, 3, 4, 5, 6]]]
)


@pytest.mark.parametrize("select_last_index", [None, 0, 1])
@pytest.mark.parametrize("keepdims", [None, 0])
@pytest.mark.parametrize("axis", [None, 1, -1, 2])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg(op, axis, keepdims, select_last_index, tmp_path):
    """Ties (many in the data) go to the first index, or to the last with select_last_index=1."""
    attrs = {
        k: v
        for k, v in (("axis", axis), ("keepdims", keepdims), ("select_last_index", select_last_index))
        if v is not None
    }
    opset = 11 if select_last_index is None else 13
    check_op(op, [x(data=TIES.astype(np.float32))], attrs, tmp_path, opset=opset)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int32", "int64", "uint8"])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_dtypes(op, dtype, tmp_path):
    for last in (0, 1):
        check_op(
            op, [x(data=TIES.astype(dtype))], {"axis": 2, "select_last_index": last}, tmp_path / str(last), opset=13
        )


# --- TopK ---


@pytest.mark.parametrize("largest", [None, 0])
@pytest.mark.parametrize(
    "k, axis", [(2, None), (1, -1), (5, -1), (2, 0), (3, 1)], ids=["k2", "k1", "all", "axis0", "axis1"]
)
@pytest.mark.parametrize("opset", [11, 24])
def test_top_k(k, axis, largest, opset, tmp_path):
    """Both outputs; the tie-heavy data checks that equal values come in index order."""
    attrs = _given(axis=axis, largest=largest)
    check_op("TopK", [x(data=TIES.astype(np.float32)), i64(k)], attrs, tmp_path, opset=opset, n_outputs=2)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int16", "int32", "int64", "uint8"])
def test_top_k_dtypes(dtype, tmp_path):
    for largest in (0, 1):
        check_op(
            "TopK",
            [x(data=TIES.astype(dtype)), i64(3)],
            {"largest": largest},
            tmp_path / str(largest),
            n_outputs=2,
        )


def test_top_k_long_axis_ties(tmp_path):
    """Hundreds of equal values along the axis: the index order of ties still matches."""
    data = np.random.default_rng(5).integers(0, 4, (2, 300)).astype(np.float32)
    check_op("TopK", [x(data=data), i64(100)], {}, tmp_path, n_outputs=2)


def test_top_k_unsorted(tmp_path):
    """sorted=0: any order is right, so both sides are compared after sorting by value."""
    data = rand(3, 16, seed=11)
    model, feeds = make_model("TopK", [x(data=data), i64(5)], {"sorted": 0}, n_outputs=2)
    ref_v, ref_i = run_ort(model, feeds)
    graph, _ = load(model, feeds)
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for values, indices in results.values():
        assert indices.dtype == np.int64
        np.testing.assert_array_equal(np.sort(indices, 1), np.sort(ref_i, 1))
        np.testing.assert_allclose(np.sort(values, 1), np.sort(ref_v, 1), rtol=1e-6)


def test_top_k_runtime_k_refused():
    check_unsupported("TopK", [x(2, 5), x(data=np.array([2], np.int64))], {}, "K", n_outputs=2)


def test_top_k_uint32_refused():
    """onnxruntime has no uint32 TopK (the loader could not infer shapes), so the dtype is set after loading."""
    model, feeds = make_model("TopK", [x(2, 5), i64(2)], {}, n_outputs=2)
    graph, _ = load(model, feeds)
    graph.values["in0"].dtype = np.dtype(np.uint32)
    assert [p.reason for p in analyse(graph)] == [
        "TopK on uint32 input not supported (MindSpore has no CPU sort for it)"
    ]


# --- CumSum / CumProd ---


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op, opset", [("CumSum", 11), ("CumSum", 14), ("CumProd", 26)])
def test_cumulative(op, opset, axis, exclusive, reverse, tmp_path):
    data = rand(3, 4, 5, low=0.5, high=1.5)
    check_op(op, [x(data=data), i64(axis)], {"exclusive": exclusive, "reverse": reverse}, tmp_path, opset=opset)


@pytest.mark.parametrize(
    "op, dtype",
    [("CumSum", d) for d in ["float16", "float64", "int32", "int64"]]
    + [("CumProd", d) for d in ["float16", "float64", "int32", "int64", "uint32", "uint64"]],
)
def test_cumulative_dtypes(op, dtype, tmp_path):
    data = np.random.default_rng(2).integers(1, 4, (3, 6)).astype(dtype)
    opset = 26 if op == "CumProd" else 14
    tol = 2e-3 if dtype == "float16" else 1e-5
    for reverse in (0, 1):
        attrs = {"reverse": reverse}
        check_op(op, [x(data=data), i64(1)], attrs, tmp_path / str(reverse), opset=opset, rel_tol=tol)


def test_cumsum_axis_int32_scalar(tmp_path):
    check_op("CumSum", [x(3, 4), const(np.int32(-1))], {"exclusive": 1}, tmp_path, opset=14)


def test_cumsum_runtime_axis_refused():
    check_unsupported("CumSum", [x(3, 4), x(data=np.array(1, np.int64))], {}, "axis", opset=14)
