"""GridSample and AffineGrid (converters/grid.py) against onnxruntime: 2-D and 3-D, every mode
and padding mode, both align_corners, grids reaching outside [-1, 1], opsets 16 and 20."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, i64, rand, x


def grid(*shape, seed=0):
    """Normalized positions, some beyond [-1, 1] (where padding_mode decides)."""
    return x(data=rand(*shape, seed=seed, low=-1.3, high=1.3))


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_2d(mode, padding_mode, align_corners, tmp_path):
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_op("GridSample", [x(2, 3, 5, 7), grid(2, 4, 6, 2)], attrs, tmp_path, opset=16)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d(mode, padding_mode, align_corners, tmp_path):
    """Opset 20: N-D GridSample, mode 'linear' (trilinear here)."""
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_op("GridSample", [x(1, 2, 4, 5, 3), grid(1, 3, 2, 4, 3)], attrs, tmp_path, opset=20)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_opset20_2d(mode, tmp_path):
    check_op("GridSample", [x(1, 2, 6, 4), grid(1, 3, 3, 2)], {"mode": mode}, tmp_path, opset=20)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_nearest_ties(align_corners, tmp_path):
    """Positions exactly half-way between pixels: both round half to even."""
    w = 6
    pixels = np.array([0.5, 1.5, 2.5, 3.5, 4.5])
    norm = pixels * 2 / (w - 1) - 1 if align_corners else (2 * pixels + 1) / w - 1
    g = np.stack(np.meshgrid(norm, norm[:3]), -1)[None].astype(np.float32)
    attrs = {"mode": "nearest", "align_corners": align_corners}
    check_op("GridSample", [x(1, 1, 3, w), x(data=g)], attrs, tmp_path, opset=16)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_constant_grid(mode, tmp_path):
    inputs = [x(1, 2, 5, 5), const(rand(1, 3, 3, 2, low=-1, high=1))]
    check_op("GridSample", inputs, {"mode": mode}, tmp_path, opset=16)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_nearest_size_1(align_corners, tmp_path):
    check_op(
        "GridSample",
        [x(1, 2, 1, 5), grid(1, 2, 3, 2)],
        {"mode": "nearest", "align_corners": align_corners},
        tmp_path,
        opset=16,
    )


@pytest.mark.parametrize("mode, opset", [("bicubic", 16), ("cubic", 20)])
def test_grid_sample_cubic_refused(mode, opset):
    check_unsupported("GridSample", [x(1, 1, 4, 4), grid(1, 2, 2, 2)], {"mode": mode}, f"mode='{mode}'", opset=opset)


@pytest.mark.parametrize(
    "size, align_corners",
    [((2, 3, 5, 7), 0), ((2, 3, 5, 7), 1), ((1, 1, 1, 4), 0), ((2, 3, 4, 5, 6), 0), ((2, 3, 4, 5, 6), 1)],
    ids=["2d", "2d_aligned", "2d_single_row", "3d", "3d_aligned"],
)
def test_affine_grid(size, align_corners, tmp_path):
    theta = x(size[0], len(size) - 2, len(size) - 1)
    check_op("AffineGrid", [theta, i64(*size)], {"align_corners": align_corners}, tmp_path, opset=20)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_affine_grid_into_grid_sample(mode, tmp_path):
    """The spatial-transformer pair: AffineGrid's output feeds GridSample. An identity theta
    halving 8x8 to 4x4 samples exactly half-way between pixels: nearest must break the ties
    like onnxruntime."""
    from converters.helpers import check_model
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="/stn/AffineGrid", align_corners=0),
        helper.make_node("GridSample", ["x", "grid"], ["y"], name="/stn/GridSample", mode=mode),
    ]
    graph = helper.make_graph(
        nodes,
        "stn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8]),
            helper.make_tensor_value_info("theta", TensorProto.FLOAT, [2, 2, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])],
        [numpy_helper.from_array(np.array([2, 3, 4, 4], np.int64), "size")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    theta = np.tile(np.eye(2, 3, dtype=np.float32), (2, 1, 1)) if mode == "nearest" else rand(2, 2, 3, low=-1, high=1)
    feeds = {"x": rand(2, 3, 8, 8), "theta": theta}
    check_model(model, feeds, tmp_path, expect_nodes=["AffineGrid", "GridSample"])


def test_affine_grid_size_1_aligned_refused():
    """-1 .. 1 over one pixel: onnxruntime puts it at 1, MindSpore (like PyTorch) at 0."""
    check_unsupported("AffineGrid", [x(1, 2, 3), i64(1, 1, 1, 4)], {"align_corners": 1}, "spatial size of 1", opset=20)


def test_affine_grid_runtime_size_refused():
    inputs = [x(1, 2, 3), x(data=np.array([1, 1, 4, 4], np.int64))]
    check_unsupported("AffineGrid", inputs, {}, "size (input 1) must be a constant", opset=20)
