"""Gather / scatter family, OneHot, Compress, ReverseSequence (converters/indexing.py) against
onnxruntime. Indices are tried both as constants (wrapped and stored at conversion) and as graph
inputs (wrapped in the generated code); data of every dtype these ops move."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, i64, rand, x

DTYPES = {
    "float32": np.float32,
    "int64": np.int64,
    "int32": np.int32,
    "bool": np.bool_,
    "float16": np.float16,
    "uint8": np.uint8,
}


def data(shape, dtype=np.float32, seed=0):
    """Seeded data of ``dtype`` (values distinct enough that a wrong pick shows)."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


def indices(values, runtime: bool, dtype=np.int64):
    """An index input: a constant or a graph input."""
    a = np.asarray(values, dtype)
    return x(data=a) if runtime else const(a)


# --- Gather ---


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize(
    "idx, axis",
    [
        (np.int64(2), 0),
        (np.int64(-1), 1),
        (np.array([0, 2], np.int64), 1),
        (np.array([3, -1, 0], np.int64), 2),
        (np.array([[0, 1], [2, 0]], np.int64), 0),
        (np.int64(1), None),
    ],
    ids=["scalar_axis0", "scalar_negative", "vector", "vector_negative", "matrix", "default_axis"],
)
def test_gather(idx, axis, runtime, tmp_path):
    check_op("Gather", [x(3, 4, 5), indices(idx, runtime)], {} if axis is None else {"axis": axis}, tmp_path)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gather_dtypes(dtype, tmp_path):
    check_op("Gather", [x(data=data((3, 4), DTYPES[dtype])), i64(2, 0, -1)], {"axis": 1}, tmp_path)


def test_gather_int32_runtime_indices(tmp_path):
    check_op("Gather", [x(5, 3), x(data=np.array([[4, -5], [0, 1]], np.int32))], {}, tmp_path)


def test_gather_embedding(tmp_path):
    """A constant table and run-time ids: how an exported nn.Embedding looks."""
    check_op("Gather", [const(rand(10, 4, seed=1)), x(data=np.array([[1, 9, 0]], np.int64))], {}, tmp_path)


# --- GatherElements ---


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis, runtime, tmp_path):
    shape = (3, 4, 5)
    n = shape[axis]
    idx = np.random.default_rng(3).integers(-n, n, (2, 4, 3))
    check_op("GatherElements", [x(*shape), indices(idx, runtime)], {"axis": axis}, tmp_path)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gather_elements_dtypes(dtype, tmp_path):
    idx = np.array([[0, 2, -1], [1, 0, 2]], np.int64)
    check_op("GatherElements", [x(data=data((2, 3), DTYPES[dtype])), x(data=idx)], {"axis": 1}, tmp_path)


# --- GatherND ---


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize(
    "shape, idx, batch_dims",
    [
        ((2, 3, 4), [[0, 1], [1, -1]], 0),
        ((2, 3, 4), [[[1]], [[0]]], 0),
        ((2, 3, 4), [[0, 1, 3], [1, 2, -4]], 0),
        ((2, 3, 4), [[1], [-1]], 1),
        ((2, 3, 4), [[[1, 0], [2, 3]], [[0, 3], [-1, -1]]], 1),
        ((2, 3, 4, 5), (np.arange(12).reshape(2, 3, 2, 1) % 8 - 4).tolist(), 2),
    ],
    ids=["pairs", "single_axis", "full", "batch1", "batch1_pairs", "batch2"],
)
def test_gather_nd(shape, idx, batch_dims, runtime, tmp_path):
    attrs = {"batch_dims": batch_dims} if batch_dims else {}
    check_op("GatherND", [x(*shape), indices(idx, runtime)], attrs, tmp_path)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gather_nd_dtypes(dtype, tmp_path):
    idx = np.array([[0, 1], [1, 0]], np.int64)
    check_op("GatherND", [x(data=data((2, 3, 2), DTYPES[dtype])), x(data=idx)], {}, tmp_path)


# --- ScatterND ---

REDUCTIONS = ["none", "add", "mul", "max", "min"]


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd(reduction, runtime, tmp_path):
    idx = [[0, 1], [1, -1], [0, 0]]  # distinct targets: the order of writes to one place is unspecified
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check_op("ScatterND", [x(2, 3, 4), indices(idx, runtime), x(3, 4, seed=7)], attrs, tmp_path, opset=18)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_nd_duplicate_indices_reduce(reduction, tmp_path):
    idx = np.array([[1], [1], [0], [1]], np.int64)
    check_op("ScatterND", [x(3, 4), x(data=idx), x(4, 4, seed=5)], {"reduction": reduction}, tmp_path, opset=18)


def test_scatter_nd_whole_rows_and_constant_data(tmp_path):
    """Zeros as a constant, updates computed: the generated code stores the base tensor."""
    check_op("ScatterND", [const(np.zeros((4, 3), np.float32)), i64([3], [0]), x(2, 3)], {}, tmp_path, opset=11)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_scatter_nd_dtypes(dtype, tmp_path):
    upd = data((2,), DTYPES[dtype], seed=2)
    check_op("ScatterND", [x(data=data((2, 3), DTYPES[dtype])), i64([0, 2], [1, 0]), x(data=upd)], {}, tmp_path)


def test_scatter_nd_bool_reduction_refused():
    inputs = [x(data=np.zeros((2, 3), bool)), i64([0, 2]), x(data=np.ones(1, bool))]
    check_unsupported("ScatterND", inputs, {"reduction": "add"}, "reduction='add' on bool", opset=18)


# --- ScatterElements / Scatter ---


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(axis, reduction, runtime, tmp_path):
    shape = (3, 4, 5)
    n = shape[axis]
    # a permutation along `axis` at every position (distinct targets), odd ones written negative
    idx = np.argsort(np.random.default_rng(4).random(shape), axis=axis)
    idx = np.where(idx % 2 == 1, idx - n, idx)
    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    check_op("ScatterElements", [x(*shape), indices(idx, runtime), x(*shape, seed=9)], attrs, tmp_path, opset=18)


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_duplicates_and_fewer_updates(reduction, runtime, tmp_path):
    """Several updates to one element reduce; indices smaller than the data."""
    idx = np.array([[1, 1, 0], [2, 2, 2]], np.int64)
    inputs = [x(3, 4), indices(idx, runtime), x(2, 3, seed=3)]
    check_op("ScatterElements", inputs, {"axis": 1, "reduction": reduction}, tmp_path, opset=18)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_scatter_elements_dtypes(dtype, tmp_path):
    upd = data((2, 2), DTYPES[dtype], seed=2)
    idx = np.array([[2, 0], [1, -1]], np.int64)
    check_op("ScatterElements", [x(data=data((2, 3), DTYPES[dtype])), x(data=idx), x(data=upd)], {"axis": 1}, tmp_path)


def test_scatter_elements_opset11(tmp_path):
    check_op("ScatterElements", [x(3, 3), const(np.array([[1, 0, 2]], np.int64)), x(1, 3)], {}, tmp_path, opset=11)


@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_deprecated(axis, tmp_path):
    """Scatter (opset 9/10) is ScatterElements without a reduction."""
    check_op(
        "Scatter",
        [x(3, 3), const(np.array([[1, 0, 2], [0, 2, 1]], np.int64)), x(2, 3)],
        {"axis": axis},
        tmp_path,
        opset=10,
    )


# --- OneHot ---


@pytest.mark.parametrize("runtime", ["indices", "values"])
@pytest.mark.parametrize("axis", [None, 0, 1, -2])
def test_one_hot(axis, runtime, tmp_path):
    """Indices in range, negative (counted from the end) and beyond either end (all off)."""
    idx = np.array([[0, 3, -1], [4, -5, 9], [-7, 2, 1]], np.int64)
    values = np.array([-1.5, 3.0], np.float32)
    if runtime == "indices":
        inputs = [x(data=idx), i64(5), const(values)]
    else:
        inputs = [const(idx), i64(5), x(data=values)]
    check_op("OneHot", inputs, {} if axis is None else {"axis": axis}, tmp_path, opset=11)


@pytest.mark.parametrize(
    "idx, depth, values",
    [
        (np.array([1, 0, 3, -2], np.int32), np.int32(4), np.array([0, 1], np.float32)),
        (np.array([1.0, 2.7, -1.5, 5.0], np.float32), np.int64(4), np.array([0, 7], np.int64)),
        (np.array([1, 0, 3, -2], np.int64), np.float32(4), np.array([2, 7], np.int32)),
        (np.array([1, 0, 3, -2], np.int64), np.int64(4), np.array([0.25, -1], np.float16)),
        (np.array([1, 0, 3, -2], np.float16), np.float16(4), np.array([0, 1], np.float16)),
    ],
    ids=["int32_indices", "float_indices_int64_values", "int32_values", "float16_values", "float16_everything"],
)
def test_one_hot_dtypes(idx, depth, values, tmp_path):
    """The dtype combinations onnxruntime implements; float indices are truncated to int64."""
    check_op("OneHot", [x(data=idx), const(depth), const(values)], {}, tmp_path, opset=11)


def test_one_hot_runtime_values(tmp_path):
    inputs = [x(data=np.array([2, 0, 1], np.int64)), i64(3), x(data=np.array([0.5, 2.0], np.float32))]
    check_op("OneHot", inputs, {"axis": 0}, tmp_path, opset=11)


def test_one_hot_runtime_depth_refused():
    inputs = [x(data=np.array([2, 0], np.int64)), x(data=np.array([3], np.int64)), const(np.float32([0, 1]))]
    check_unsupported("OneHot", inputs, {}, "depth (input 1) must be a constant", opset=11)


# --- Compress ---


@pytest.mark.parametrize(
    "cond, axis",
    [
        ([0, 1, 1], 0),
        ([1, 0, 1, 1], 1),
        ([True, False, True], -1),
        ([0, 1, 0, 0, 1, 1, 0, 1], None),
        ([0, 1], 1),
        ([1, 1, 1], 0),
        ([0, 0, 0], 0),
    ],
    ids=["axis0", "axis1", "negative_axis", "flattened", "shorter_condition", "all", "none"],
)
def test_compress(cond, axis, tmp_path):
    inputs = [x(3, 4, 3), const(np.array(cond, bool))]
    check_op("Compress", inputs, {} if axis is None else {"axis": axis}, tmp_path, opset=11)


def test_compress_int_data(tmp_path):
    check_op("Compress", [x(data=data((3, 2), np.int64)), const(np.array([1, 0, 1], bool))], {"axis": 0}, tmp_path)


def test_compress_runtime_condition_refused():
    inputs = [x(3, 2), x(data=np.array([True, False, True]))]
    check_unsupported("Compress", inputs, {"axis": 0}, "condition (input 1) must be a constant", opset=11)


# --- ReverseSequence ---


@pytest.mark.parametrize("runtime", [False, True], ids=["const", "runtime"])
@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis, runtime, tmp_path):
    shape = (4, 3, 2) if time_axis == 0 else (3, 4, 2)
    lens = indices([4, 1, 3], runtime)
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    check_op("ReverseSequence", [x(*shape), lens], attrs, tmp_path, opset=10)


@pytest.mark.parametrize("dtype", ["int64", "bool", "float16"])
def test_reverse_sequence_dtypes(dtype, tmp_path):
    inputs = [x(data=data((3, 2), DTYPES[dtype])), i64(2, 3)]
    check_op("ReverseSequence", inputs, {"batch_axis": 1, "time_axis": 0}, tmp_path, opset=10)


# --- refused ops ---


@pytest.mark.parametrize("op, n_outputs", [("NonZero", 1), ("Unique", 4)])
def test_data_dependent_shapes_refused(op, n_outputs):
    check_unsupported(
        op, [x(data=np.array([1, 0, 2, 2], np.int64))], {}, "depends on the data", opset=11, n_outputs=n_outputs
    )
