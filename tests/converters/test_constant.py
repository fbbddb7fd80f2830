"""Constant, Shape, Size, ConstantOfShape, Range (converters/constant.py) against onnxruntime.

The loader folds these whenever their inputs are constants (and Shape always), so a one-node
model never reaches the converter. ``check_unfolded`` loads the model as usual, then puts the
node back into the folded graph with its output no longer a constant: what the converter gets
when such a node is left in a graph. What would make the output shape data-dependent (a run-time
shape or bound) is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import (
    assert_close,
    check_op,
    check_unsupported,
    const,
    convert_and_run,
    i64,
    load,
    make_model,
    run_ort,
    x,
)
from onnx import TensorProto, helper, numpy_helper

from torch2ms.converters.registry import analyse
from torch2ms.graph.ir import Graph, Value
from torch2ms.graph.load import graph_from_model


def check_unfolded(op_type: str, inputs: list, attrs: dict | None, tmp_path, *, opset: int = 17) -> str:
    """Convert ``op_type`` as a node the loader did not fold; compare with onnxruntime."""
    model, feeds = make_model(op_type, inputs, attrs, opset=opset)
    expected = run_ort(model, feeds)
    folded, _ = load(model, feeds)
    assert not folded.nodes, "the loader no longer folds this node: test it with check_op"
    raw = graph_from_model(model, opset, {k: v.shape for k, v in feeds.items()}, fold=False)
    node = raw.nodes[0]
    values = {name: raw.values[name] for name in node.inputs if name}
    for name in raw.inputs:
        values[name] = Value(name, feeds[name].shape, feeds[name].dtype)
    values[node.outputs[0]] = Value(node.outputs[0], expected[0].shape, expected[0].dtype)
    graph = Graph([node], values, list(raw.inputs), list(raw.outputs), opset)
    results, source = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, (actual,) in results.items():
        assert_close(actual, expected[0], 1e-6, f"{op_type} {attrs or {}} ({mode} mode)")
    return source


@pytest.mark.parametrize(
    "attrs, written",
    [
        (
            {"value": np.arange(6, dtype=np.float32).reshape(2, 3)},
            "ms.Tensor(((0.0, 1.0, 2.0), (3.0, 4.0, 5.0)), ms.float32)",
        ),
        ({"value": np.arange(40, dtype=np.int64).reshape(5, 8)}, "self."),
        ({"value": np.array([0.1, 0.2])}, "self."),
        ({"value": np.array(True)}, "ms.Tensor(True, ms.bool_)"),
        ({"value_float": 2.5}, "ms.Tensor(2.5, ms.float32)"),
        ({"value_floats": [1.0, -0.5]}, "ms.Tensor((1.0, -0.5), ms.float32)"),
        ({"value_int": 7}, "ms.Tensor(7, ms.int64)"),
        ({"value_ints": [3, 1, 4]}, "ms.Tensor((3, 1, 4), ms.int64)"),
    ],
    ids=[
        "tensor",
        "large_tensor",
        "double_tensor",
        "bool_scalar",
        "value_float",
        "value_floats",
        "value_int",
        "value_ints",
    ],
)
def test_constant(attrs, written, tmp_path):
    """Small float32/integer values are written into the code; large or float64 ones are stored."""
    if "value" in attrs:
        attrs = {"value": numpy_helper.from_array(attrs["value"])}
    src = check_unfolded("Constant", [], attrs, tmp_path, opset=13)
    assert written in src


@pytest.mark.parametrize(
    "attrs, match", [({"value_strings": ["a"]}, "value_string"), ({"sparse_value": "sparse"}, "sparse_value")]
)
def test_constant_refuses_strings_and_sparse(attrs, match):
    """onnxruntime folds these before any converter sees them, so the node is analysed unfolded."""
    if "sparse_value" in attrs:
        values = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        attrs = {
            "sparse_value": helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64, [1], [0]), [3])
        }
    model, _ = make_model("Constant", [], attrs, opset=13)
    graph = graph_from_model(model, 13, {}, fold=False)
    out = graph.nodes[0].outputs[0]
    graph.values[out] = Value(out, (3,), np.dtype(np.float32))
    reasons = [p.reason for p in analyse(graph)]
    assert reasons and match in reasons[0], reasons


@pytest.mark.parametrize(
    "attrs",
    [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 3, "end": 1}, {"start": -10}],
    ids=["all", "start", "end_negative", "clamped_end", "start_after_end", "clamped_start"],
)
def test_shape(attrs, tmp_path):
    check_unfolded("Shape", [x(2, 3, 4, 5)], attrs, tmp_path, opset=15)


def test_size_of_a_graph_input(tmp_path):
    """Size is not folded when its input is computed (only Shape is): the converter runs."""
    src = check_op("Size", [x(2, 3, 4)], {}, tmp_path)
    assert "ms.Tensor(24, ms.int64)" in src


@pytest.mark.parametrize(
    "shape, value",
    [
        ((2, 3), None),
        ((4,), np.array([7], np.int64)),
        ((2, 1, 3), np.array([1.5], np.float32)),
        ((3,), np.array([True])),
    ],
    ids=["default_zeros", "int64", "float", "bool"],
)
def test_constant_of_shape(shape, value, tmp_path):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check_unfolded("ConstantOfShape", [i64(*shape)], attrs, tmp_path, opset=11)


def test_constant_of_shape_runtime_shape_refused():
    check_unsupported("ConstantOfShape", [x(data=np.array([2, 3], np.int64))], {}, "input (input 0) must be a constant")


@pytest.mark.parametrize(
    "start, limit, delta",
    [
        (np.int64(3), np.int64(9), np.int64(3)),
        (np.int32(10), np.int32(4), np.int32(-2)),
        (np.float32(1.0), np.float32(2.0), np.float32(0.3)),
        (np.float32(0.0), np.float32(-1.0), np.float32(0.5)),
    ],
    ids=["int64", "int32_negative_delta", "float", "empty"],
)
def test_range(start, limit, delta, tmp_path):
    check_unfolded("Range", [const(start), const(limit), const(delta)], {}, tmp_path, opset=11)


@pytest.mark.parametrize("stash_type", [0, 1])
def test_range_float16_stash_type(stash_type, tmp_path):
    """Opset 27: float16 bounds computed in float32 (stash_type=1) or float16."""
    inputs = [const(np.float16(1.0)), const(np.float16(9.0)), const(np.float16(0.7))]
    check_unfolded("Range", inputs, {"stash_type": stash_type}, tmp_path, opset=27)


def test_range_runtime_bound_refused():
    inputs = [const(np.float32(0)), x(data=np.array(5.0, np.float32)), const(np.float32(1))]
    check_unsupported("Range", inputs, {}, "limit (input 1) must be a constant", opset=11)
