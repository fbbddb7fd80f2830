"""Data movement (converters/tensor.py) against onnxruntime. The data input is always a graph
input, so the node is not constant-folded and its converter really runs."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_model, check_op, check_unsupported, const, i64, rand, x
from onnx import TensorProto, helper

INT64_MAX = np.iinfo(np.int64).max


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_concat(n, axis, tmp_path):
    shapes = [(2, 3, 4)] * n
    shapes = [tuple(d + k if a == axis % 3 else d for a, d in enumerate(s)) for k, s in enumerate(shapes)]
    src = check_op("Concat", [x(*s, seed=k) for k, s in enumerate(shapes)], {"axis": axis}, tmp_path)
    assert ",)" not in src.split("def construct")[1] or n == 1  # no trailing comma in a tuple of 2+


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.uint8])
def test_concat_split_tile_dtypes(dtype, tmp_path):
    values = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    check_op("Concat", [x(data=values), x(data=values[:1])], {"axis": 0}, tmp_path / "concat")
    check_op("Split", [x(data=values), i64(1, 3)], {"axis": 1}, tmp_path / "split", n_outputs=2)
    check_op("Tile", [x(data=values), i64(2, 1)], {}, tmp_path / "tile")


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
        ((7,), {"num_outputs": 4}, None, 4, 18),
        ((2, 5), {"axis": 1}, [0, 5, 0], 3, 13),
        ((3, 4), {"axis": -2, "split": [1, 2]}, None, 2, 11),
    ],
    ids=[
        "equal",
        "input_sizes",
        "input_sizes_negative_axis",
        "attribute_sizes",
        "num_outputs_uneven",
        "num_outputs",
        "one_output",
        "num_outputs_7_by_4",
        "zero_size_parts",
        "attribute_negative_axis",
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


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([1000], [1001], [1], None),
        ([-1000], [-999], [1], None),
        ([4], [1], [1], None),
        ([-100], [100], [1], [-1]),
        ([100], [-100], [1], [-3]),
        ([0, 0], [3, 10], [0, 1], [1, 3]),
    ],
    ids=["start_beyond_end", "end_before_start", "empty_reversed_bounds", "reversed_clamped", "reversed_step3", "all"],
)
def test_slice_edge_cases(starts, ends, axes, steps, tmp_path):
    """Out-of-range bounds clamp like NumPy; empty selections stay empty."""
    inputs = [x(3, 10, 2), i64(*starts), i64(*ends), i64(*axes)] + ([i64(*steps)] if steps else [])
    check_op("Slice", inputs, {}, tmp_path)


def test_slice_int_data(tmp_path):
    check_op("Slice", [x(data=np.arange(24, dtype=np.int64).reshape(4, 6)), i64(1), i64(-1), i64(1)], {}, tmp_path)


def test_slice_runtime_bounds_refused():
    check_unsupported("Slice", [x(2, 5), x(data=np.array([1], np.int64)), i64(3)], {}, "starts")


@pytest.mark.parametrize(
    "shape",
    [(0, -1), (-1,), (2, 0, 2, -1), (6, 4), (0, 3, 2, 2)],
    ids=["zero_and_minus1", "flat", "zero_mid", "explicit", "split_axis"],
)
def test_reshape(shape, tmp_path):
    check_op("Reshape", [x(2, 3, 4), i64(*shape)], {}, tmp_path)


def test_reshape_allowzero(tmp_path):
    """allowzero=1 takes a 0 literally: with no 0 in the shape it reshapes as usual."""
    check_op("Reshape", [x(2, 3, 4), i64(4, -1)], {"allowzero": 1}, tmp_path, opset=14)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float16])
def test_reshape_dtypes(dtype, tmp_path):
    check_op("Reshape", [x(data=(np.arange(12) % 3).astype(dtype).reshape(3, 4)), i64(0, 2, -1)], {}, tmp_path)


def test_reshape_runtime_shape_refused():
    """The loader's shape run fed ones to the shape input; the converter must not use that shape."""
    check_unsupported(
        "Reshape", [x(1, 1), x(data=np.array([1, 1], np.int64))], {}, "shape (input 1) must be a constant"
    )


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, 4, -4, -2])
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


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_transpose_dtypes(dtype, tmp_path):
    check_op("Transpose", [x(data=(np.arange(24) % 5).astype(dtype).reshape(2, 3, 4))], {"perm": [2, 0, 1]}, tmp_path)


def test_squeeze_runtime_axes_refused():
    check_unsupported("Squeeze", [x(3, 1), x(data=np.array([1], np.int64))], {}, "axes (input 1) must be a constant")


@pytest.mark.parametrize("opset", [11, 13, 21])
@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [0, -1], [3, 0, 2]])
def test_unsqueeze(axes, opset, tmp_path):
    """Axes as an attribute (opset 11) or an input (13 on), unsorted and negative."""
    if opset < 13:
        check_op("Unsqueeze", [x(3, 4)], {"axes": axes}, tmp_path, opset=opset)
    else:
        check_op("Unsqueeze", [x(3, 4), i64(*axes)], {}, tmp_path, opset=opset)


def test_unsqueeze_runtime_axes_refused():
    """The loader's shape run fed ones to the axes input: [1], not the real axes."""
    check_unsupported(
        "Unsqueeze", [x(3, 4), x(data=np.array([0], np.int64))], {}, "axes (input 1) must be a constant", opset=13
    )


_ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL}


def _graph_model(nodes, inputs, outputs, dtype, inits=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, _ONNX_TYPE[dtype], list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(n, _ONNX_TYPE[dtype], None) for n in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _values(shape, dtype, seed):
    return (rand(*shape, seed=seed, low=-3, high=3)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack(axis, dtype, tmp_path):
    """torch2ms.Stack, what passes/stacking.py makes of torch.stack's Unsqueezes and Concat."""
    from torch2ms.passes import UnsqueezesToStack

    nodes = [helper.make_node("Unsqueeze", [f"x{k}", "axes"], [f"u{k}"], name=f"/Unsqueeze_{k}") for k in range(3)]
    nodes.append(helper.make_node("Concat", ["u0", "u1", "u2"], ["y"], name="/Concat", axis=axis))
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [axis])]
    model = _graph_model(nodes, [(f"x{k}", (2, 3)) for k in range(3)], ["y"], dtype, inits)
    feeds = {f"x{k}": _values((2, 3), dtype, seed=k) for k in range(3)}
    source, _ = check_model(model, feeds, tmp_path, passes=[UnsqueezesToStack()], expect_nodes=["Stack"])
    assert f"axis={axis % 3}" in source


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("axis, shape", [(0, (3, 2, 4)), (1, (2, 3)), (-1, (2, 4, 2))])
def test_unstack(axis, shape, dtype, tmp_path):
    """torch2ms.Unstack, what passes/stacking.py makes of one Gather per position of an axis."""
    from torch2ms.passes import GathersToUnstack

    n = shape[axis]
    nodes = [helper.make_node("Gather", ["x", f"i{k}"], [f"y{k}"], name=f"/Gather_{k}", axis=axis) for k in range(n)]
    inits = [helper.make_tensor(f"i{k}", TensorProto.INT64, [], [k]) for k in range(n)]
    model = _graph_model(nodes, [("x", shape)], [f"y{k}" for k in range(n)], dtype, inits)
    source, _ = check_model(
        model, {"x": _values(shape, dtype, seed=4)}, tmp_path, passes=[GathersToUnstack()], expect_nodes=["Unstack"]
    )
    assert f"ops.unstack(x, axis={axis % len(shape)})" in source


CASTS = {
    "float_to_int64": (rand(3, 4, low=-5, high=5), 7),
    "float_to_int32": (rand(3, 4, low=-5, high=5), 6),
    "float_to_bool": (np.array([[0.0, 1.5, -2.0, 0.0]], np.float32), 9),
    "int64_to_float": (np.array([[1, -2, 3]], np.int64), 1),
    "bool_to_float": (np.array([[True, False]]), 1),
    "float_to_float16": (rand(3, 4), 10),
    "float_to_uint8": (rand(3, 4, low=0, high=200), 2),
    "int64_to_int32": (np.array([5, -3], np.int64), 6),
    "float_to_double": (rand(3, 4), 11),
    "double_to_float": (rand(3, 4).astype(np.float64), 1),
    "float16_to_float": (rand(3, 4).astype(np.float16), 1),
    "float_to_int8": (rand(3, 4, low=-100, high=100), 3),
    "float_to_int16": (rand(3, 4, low=-1000, high=1000), 5),
    "float_to_uint16": (rand(3, 4, low=0, high=1000), 4),
    "float_to_uint32": (rand(3, 4, low=0, high=1000), 12),
    "float_to_uint64": (rand(3, 4, low=0, high=1000), 13),
    "uint8_to_float": (np.array([[0, 7, 255]], np.uint8), 1),
    "int32_to_bool": (np.array([[0, 7, -1]], np.int32), 9),
    "same_type": (rand(2, 3), 1),
}


@pytest.mark.parametrize("name", list(CASTS))
def test_cast(name, tmp_path):
    data, to = CASTS[name]
    check_op("Cast", [x(data=data)], {"to": to}, tmp_path, rel_tol=1e-3 if to == 10 else 1e-5)


@pytest.mark.parametrize(
    "to, name", [(8, "object"), (17, "float8_e4m3fn"), (19, "float8_e5m2"), (20, "float8_e5m2fnuz")]
)
def test_cast_unsupported_type_refused(to, name):
    """The loader refuses the output's dtype by name before the converter runs. (INT4/UINT4 outputs
    cannot be tested here: onnxruntime's Shape, which the loader runs, lacks them.)"""
    check_unsupported("Cast", [x(2, 3)], {"to": to}, f"has no tensor type for Cast output 'out0' ({name})", opset=21)


def test_cast_through_bfloat16(tmp_path):
    """float32 -> bfloat16 -> float32 rounds to bfloat16 precision (bfloat16 is not a graph output)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["b"], name="/to_bf16/Cast", to=16),
        helper.make_node("Cast", ["b"], ["y"], name="/to_f32/Cast", to=1),
    ]
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    src, _ = check_model(model, {"x": rand(3, 4)}, tmp_path, rel_tol=0, expect_nodes=["Cast", "Cast"])
    assert "ms.bfloat16" in src


@pytest.mark.parametrize(
    "data, like",
    [
        (rand(2, 3, low=-5, high=5), np.zeros(1, np.int32)),
        (np.array([[1, -2, 3]], np.int64), np.zeros(2, np.float16)),
        (rand(2, 3), np.zeros(1, np.float64)),
        (rand(2, 3), np.zeros(1, np.float32)),
    ],
    ids=["float_like_int32", "int64_like_float16", "float_like_double", "same"],
)
def test_cast_like(data, like, tmp_path):
    """Only the dtype of target_type counts; it may be a constant or a graph input."""
    check_op("CastLike", [x(data=data), const(like)], {}, tmp_path, opset=15)
    check_op("CastLike", [x(data=data), x(data=like)], {}, tmp_path / "runtime", opset=15)


@pytest.mark.parametrize(
    "shape, target",
    [((3, 1), (3, 4)), ((1, 4), (2, 3, 4)), ((3, 4), (1, 1)), ((2, 1, 4), (2, 3, 1))],
    ids=["widen", "new_axes", "shape_smaller", "both_ways"],
)
def test_expand(shape, target, tmp_path):
    check_op("Expand", [x(*shape), i64(*target)], {}, tmp_path)


def test_expand_int_data(tmp_path):
    check_op("Expand", [x(data=np.array([[1], [0]], np.int64)), i64(2, 3)], {}, tmp_path)


def test_expand_runtime_shape_refused():
    """The bug this guards: the loader's shape run fed ones to the shape input, so the output
    shape it inferred was (3, 1), and the generated code silently broadcast to that."""
    check_unsupported(
        "Expand", [x(3, 1), x(data=np.array([2, 3, 4], np.int64))], {}, "shape (input 1) must be a constant"
    )


@pytest.mark.parametrize("repeats", [(1, 2), (3, 1), (2, 2), (1, 1)])
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


def test_tile_runtime_repeats_refused():
    check_unsupported("Tile", [x(2, 3), x(data=np.array([1, 2], np.int64))], {}, "repeats (input 1) must be a constant")


def test_split_runtime_sizes_refused():
    check_unsupported(
        "Split",
        [x(2, 2), x(data=np.array([1, 1], np.int64))],
        {"axis": 1},
        "split (input 1) must be a constant",
        n_outputs=2,
    )


def test_pad_int_data(tmp_path):
    check_op(
        "Pad", [x(data=np.arange(6, dtype=np.int64).reshape(2, 3)), i64(1, 0, 0, 2), const(np.int64(7))], {}, tmp_path
    )


def test_pad_wrap_refused():
    check_unsupported("Pad", [x(1, 2, 4, 5), i64(0, 0, 1, 1, 0, 0, 1, 1)], {"mode": "wrap"}, "mode", opset=19)


# onnxruntime moves int64 and bool with these ops from opset 28 only
SPACE_DTYPES = [(np.float32, 13), (np.uint8, 13), (np.int64, 28), (np.bool_, 28)]


@pytest.mark.parametrize("dtype, opset", SPACE_DTYPES, ids=["float32", "uint8", "int64", "bool"])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_depth_to_space(blocksize, mode, dtype, opset, tmp_path):
    shape = (2, 2 * blocksize**2, 3, 2)
    values = (np.arange(np.prod(shape)) % 7).astype(dtype).reshape(shape)
    check_op("DepthToSpace", [x(data=values)], {"blocksize": blocksize, "mode": mode}, tmp_path, opset=opset)


def test_depth_to_space_opset11_default_mode(tmp_path):
    check_op("DepthToSpace", [x(1, 8, 2, 3)], {"blocksize": 2}, tmp_path, opset=11)


@pytest.mark.parametrize("dtype, opset", SPACE_DTYPES, ids=["float32", "uint8", "int64", "bool"])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_space_to_depth(blocksize, dtype, opset, tmp_path):
    shape = (2, 3, 2 * blocksize, 3 * blocksize)
    values = (np.arange(np.prod(shape)) % 5).astype(dtype).reshape(shape)
    check_op("SpaceToDepth", [x(data=values)], {"blocksize": blocksize}, tmp_path, opset=opset)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_mode(mode, tmp_path):
    """Opset 28 adds SpaceToDepth's mode; CRD is DepthToSpace(CRD)'s inverse."""
    check_op("SpaceToDepth", [x(1, 2, 4, 6)], {"blocksize": 2, "mode": mode}, tmp_path, opset=28)


@pytest.mark.parametrize(
    "in_shape, shape, axes",
    [
        ((20, 10, 3), (10, 7, 3), None),
        ((10, 7, 3), (20, 10, 3), None),
        ((20, 8, 3), (10, 10, 3), None),
        ((20, 8, 3), (10, 9), [0, 1]),
        ((3, 20, 8), (10, 9), [1, 2]),
        ((20, 8, 3), (9, 10), [-2, -3]),
        ((5, 5), (5, 5), None),
    ],
    ids=["crop", "pad", "crop_and_pad", "axes_hwc", "axes_chw", "negative_axes", "same"],
)
def test_center_crop_pad(in_shape, shape, axes, tmp_path):
    attrs = {} if axes is None else {"axes": axes}
    check_op("CenterCropPad", [x(*in_shape), i64(*shape)], attrs, tmp_path, opset=18)


def test_center_crop_pad_int_data(tmp_path):
    check_op("CenterCropPad", [x(data=np.arange(12, dtype=np.int64).reshape(3, 4)), i64(6, 1)], {}, tmp_path, opset=18)


def test_center_crop_pad_runtime_shape_refused():
    check_unsupported(
        "CenterCropPad",
        [x(1, 1), x(data=np.array([1, 1], np.int64))],
        {},
        "shape (input 1) must be a constant",
        opset=18,
    )
