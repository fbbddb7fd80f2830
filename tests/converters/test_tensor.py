"""Data movement (converters/tensor.py) against onnxruntime. The data input is always a graph
input, so the node is not constant-folded and its converter really runs."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, i64, rand, x

INT64_MAX = np.iinfo(np.int64).max


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_concat(n, axis, tmp_path):
    shapes = [(2, 3, 4)] * n
    shapes = [tuple(d + k if a == axis % 3 else d for a, d in enumerate(s)) for k, s in enumerate(shapes)]
    src = check_op("Concat", [x(*s, seed=k) for k, s in enumerate(shapes)], {"axis": axis}, tmp_path)
    assert ",)" not in src.split("def construct")[1] or n == 1  # no trailing comma in a tuple of 2+


def test_concat_with_constant(tmp_path):
    check_op("Concat", [x(2, 3), const(rand(2, 2, seed=3))], {"axis": 1}, tmp_path)


@pytest.mark.parametrize(
    "shape, attrs, split, n, opset",
    [
        ((6, 4), {"axis": 0}, None, 3, 13),
        ((2, 9), {"axis": 1}, [2, 3, 4], 3, 13),
        ((2, 9), {"axis": -1}, [2, 7], 2, 13),
        ((2, 9), {"axis": 1, "split": [5, 4]}, None, 2, 11),
        ((2, 7, 3), {"axis": 1, "num_outputs": 3}, None, 3, 18),
        ((2, 6), {"axis": 1, "num_outputs": 2}, None, 2, 18),
        ((2, 6), {"axis": 1}, [6], 1, 13),
    ],
    ids=[
        "equal",
        "input_sizes",
        "input_sizes_negative_axis",
        "attribute_sizes",
        "num_outputs_uneven",
        "num_outputs",
        "one_output",
    ],
)
def test_split(shape, attrs, split, n, opset, tmp_path):
    inputs = [x(*shape)] + ([i64(*split)] if split is not None else [])
    check_op("Split", inputs, attrs, tmp_path, opset=opset, n_outputs=n)


SLICES = {
    "basic": ([1], [3], None, None),
    "negative": ([-3], [-1], [1], None),
    "to_end": ([2], [INT64_MAX], [2], None),
    "steps": ([0, 1], [5, 4], [1, 2], [2, 2]),
    "negative_axis": ([1], [3], [-1], None),
    "negative_step": ([-1], [-INT64_MAX], [2], [-1]),
    "negative_step_2": ([4, 3], [0, 0], [1, 3], [-2, -1]),
    "clamped": ([-100], [100], [0], None),
    "whole_axis": ([0], [INT64_MAX], [1], None),
}


@pytest.mark.parametrize("name", list(SLICES))
def test_slice(name, tmp_path):
    starts, ends, axes, steps = SLICES[name]
    inputs = [x(2, 5, 6, 7), i64(*starts), i64(*ends)]
    if axes is not None or steps is not None:
        inputs.append(i64(*(axes if axes is not None else range(len(starts)))))
    if steps is not None:
        inputs.append(i64(*steps))
    check_op("Slice", inputs, {}, tmp_path)


def test_slice_runtime_bounds_refused():
    check_unsupported("Slice", [x(2, 5), x(data=np.array([1], np.int64)), i64(3)], {}, "starts")


@pytest.mark.parametrize(
    "indices, axis",
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
def test_gather(indices, axis, tmp_path):
    check_op("Gather", [x(3, 4, 5), const(indices)], {} if axis is None else {"axis": axis}, tmp_path)


def test_gather_int_data(tmp_path):
    check_op(
        "Gather",
        [x(data=np.arange(12, dtype=np.int64).reshape(3, 4)), const(np.array([2, 0], np.int64))],
        {"axis": 1},
        tmp_path,
    )


def test_gather_runtime_indices_refused():
    check_unsupported("Gather", [x(3, 4), x(data=np.array([0, 1], np.int64))], {}, "indices")


@pytest.mark.parametrize(
    "shape",
    [(0, -1), (-1,), (2, 0, 2, -1), (6, 4), (0, 3, 2, 2)],
    ids=["zero_and_minus1", "flat", "zero_mid", "explicit", "split_axis"],
)
def test_reshape(shape, tmp_path):
    check_op("Reshape", [x(2, 3, 4), i64(*shape)], {}, tmp_path)


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, 4])
def test_flatten(axis, tmp_path):
    check_op("Flatten", [x(2, 3, 4, 5)], {} if axis is None else {"axis": axis}, tmp_path)


@pytest.mark.parametrize(
    "perm",
    [None, [0, 2, 3, 1], [1, 0], [0, 2, 1, 3, 4], [0, 1, 3, 2, 4, 5], [0, 1, 3, 5, 2, 4]],
    ids=["reverse", "nchw_nhwc", "rank2", "rank5_shuffle", "rank6_window", "rank6"],
)
def test_transpose(perm, tmp_path):
    rank = 4 if perm is None else len(perm)
    shape = (2, 3, 2, 2, 3, 2)[:rank]
    check_op("Transpose", [x(*shape)], {} if perm is None else {"perm": perm}, tmp_path)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[2], [0, 2], [-1], None])
def test_squeeze(axes, opset, tmp_path):
    """Axes as an attribute (opset 11) or an input (opset 13)."""
    shape = (1, 3, 1, 4, 1)
    if opset < 13:
        check_op("Squeeze", [x(*shape)], {} if axes is None else {"axes": axes}, tmp_path, opset=opset)
    else:
        check_op("Squeeze", [x(*shape)] + ([i64(*axes)] if axes is not None else []), {}, tmp_path, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [0, -1]])
def test_unsqueeze(axes, opset, tmp_path):
    if opset < 13:
        check_op("Unsqueeze", [x(3, 4)], {"axes": axes}, tmp_path, opset=opset)
    else:
        check_op("Unsqueeze", [x(3, 4), i64(*axes)], {}, tmp_path, opset=opset)


CASTS = {
    "float_to_int64": (rand(3, 4, low=-5, high=5), 7),
    "float_to_int32": (rand(3, 4, low=-5, high=5), 6),
    "float_to_bool": (np.array([[0.0, 1.5, -2.0, 0.0]], np.float32), 9),
    "int64_to_float": (np.array([[1, -2, 3]], np.int64), 1),
    "bool_to_float": (np.array([[True, False]]), 1),
    "float_to_float16": (rand(3, 4), 10),
    "float_to_uint8": (rand(3, 4, low=0, high=200), 2),
    "int64_to_int32": (np.array([5, -3], np.int64), 6),
}


@pytest.mark.parametrize("name", list(CASTS))
def test_cast(name, tmp_path):
    data, to = CASTS[name]
    check_op("Cast", [x(data=data)], {"to": to}, tmp_path, rel_tol=1e-3 if to == 10 else 1e-5)


def test_cast_unsupported_type_refused():
    check_unsupported("Cast", [x(2, 3)], {"to": 8}, "to")  # to string


@pytest.mark.parametrize(
    "shape, target",
    [((3, 1), (3, 4)), ((1, 4), (2, 3, 4)), ((3, 4), (1, 1)), ((2, 1, 4), (2, 3, 1))],
    ids=["widen", "new_axes", "shape_smaller", "both_ways"],
)
def test_expand(shape, target, tmp_path):
    check_op("Expand", [x(*shape), i64(*target)], {}, tmp_path)


@pytest.mark.parametrize("repeats", [(1, 2), (3, 1), (2, 2)])
def test_tile(repeats, tmp_path):
    check_op("Tile", [x(2, 3), i64(*repeats)], {}, tmp_path)


PADS = {
    "spatial": [0, 0, 1, 2, 0, 0, 3, 0],
    "all_axes": [1, 0, 1, 1, 0, 1, 0, 2],
    "last_only": [0, 0, 0, 2, 0, 0, 0, 1],
    "negative_crop": [0, 0, -1, 1, 0, 0, 1, -2],
}


@pytest.mark.parametrize("value", [None, "empty", 0.0, 1.5])
@pytest.mark.parametrize("pads", list(PADS))
def test_pad_constant(pads, value, tmp_path):
    inputs = [x(1, 2, 4, 5), i64(*PADS[pads])]
    if value == "empty":
        inputs.append(None)
    elif value is not None:
        inputs.append(const(np.float32(value)))
    check_op("Pad", inputs, {"mode": "constant"}, tmp_path)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
@pytest.mark.parametrize("pads", ["spatial", "last_only"])
def test_pad_reflect_edge(mode, pads, tmp_path):
    check_op("Pad", [x(1, 2, 4, 5), i64(*PADS[pads])], {"mode": mode}, tmp_path)


@pytest.mark.parametrize("axes", [[2, 3], [-1], [1, 3]])
def test_pad_axes_input(axes, tmp_path):
    """Opset 18: pads only for the listed axes."""
    pads = [1] * len(axes) + [2] * len(axes)
    check_op(
        "Pad", [x(1, 2, 4, 5), i64(*pads), const(np.float32(0.5)), i64(*axes)], {"mode": "constant"}, tmp_path, opset=18
    )


def test_pad_wrap_refused():
    check_unsupported("Pad", [x(1, 2, 4, 5), i64(0, 0, 1, 1, 0, 0, 1, 1)], {"mode": "wrap"}, "mode", opset=19)
