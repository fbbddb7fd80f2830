"""MaxPool, AveragePool, LpPool (1-D to 3-D), the Global pools and MaxUnpool against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, rand, x

# (input H, W, attrs): kernels, strides, symmetric/asymmetric pads, ceil_mode, auto_pad
POOL_CASES = {
    "k2s2": ((8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "k3s2p1": ((9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "k3s1p1": ((6, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "k3s2_ceil": ((13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "k2s2_ceil": ((13, 12), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    "k1s1_ceil": ((5, 5), {"kernel_shape": [1, 1], "ceil_mode": 1}),
    "k3s2p1_ceil": ((10, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "k2s2p1_ceil_last_window_dropped": (
        (4, 4),
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "k3x2_s2x1": ((9, 8), {"kernel_shape": [3, 2], "strides": [2, 1]}),
    "pads_hw_differ": ((8, 8), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 0]}),
    "asym_pads": ((8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0]}),
    "asym_pads_ceil": ((9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1}),
    "same_upper": ((7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((7, 8), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "valid": ((7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    # ceil mode's last window starting on the end padding: onnxruntime drops it, ONNX shape inference keeps it
    "ceil_last_window_on_pad": (
        (2, 2),
        {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "ceil_last_window_on_asym_pad": (
        (3, 4),
        {"kernel_shape": [2, 2], "strides": [3, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1},
    ),
    "pads_over_half_kernel": ((5, 5), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
    "pads_over_half_kernel_s2_ceil": (
        (6, 7),
        {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 2, 1, 2], "ceil_mode": 1},
    ),
}


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_max_pool(name, tmp_path):
    (h, w), attrs = POOL_CASES[name]
    check_op("MaxPool", [x(1, 2, h, w)], attrs, tmp_path)


@pytest.mark.parametrize("dilations", [[2, 2], [1, 2]])
def test_max_pool_dilations(dilations, tmp_path):
    check_op(
        "MaxPool", [x(1, 2, 9, 9)], {"kernel_shape": [3, 3], "dilations": dilations, "pads": [1, 1, 1, 1]}, tmp_path
    )


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("name", list(POOL_CASES))
def test_average_pool(name, count_include_pad, tmp_path):
    (h, w), attrs = POOL_CASES[name]
    check_op("AveragePool", [x(1, 2, h, w)], attrs | {"count_include_pad": count_include_pad}, tmp_path)


def test_max_pool_opset11(tmp_path):
    check_op(
        "MaxPool",
        [x(1, 2, 9, 9)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        tmp_path,
        opset=11,
    )


INDICES_CASES = {
    "2d_k2s2": ((2, 3, 6, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "2d_k3s2p1_ceil": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "2d_dil2": ((1, 2, 9, 9), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d_k1_one_plane": ((1, 1, 4, 5), {"kernel_shape": [1, 1]}),
    "1d": ((2, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2, 5, 6, 7), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
}


@pytest.mark.parametrize("name", list(INDICES_CASES))
def test_max_pool_indices(name, tmp_path):
    """The Indices output counts through the whole tensor (batch and channel included)."""
    shape, attrs = INDICES_CASES[name]
    check_op("MaxPool", [x(*shape)], attrs, tmp_path, n_outputs=2)


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"kernel_shape": [3, 3], "pads": [0, 1, 1, 0]}, "Indices"),
        ({"kernel_shape": [2, 2], "storage_order": 1}, "storage_order=1"),
    ],
    ids=["asym_pads", "column_major"],
)
def test_max_pool_indices_refused(attrs, match):
    check_unsupported("MaxPool", [x(1, 2, 6, 6)], attrs, match, n_outputs=2)


def test_pool_empty_output_refused():
    check_unsupported("MaxPool", [x(1, 2, 2, 2)], {"kernel_shape": [3, 3]}, "empty output")


# (input spatial shape, attrs) for the 1-D and 3-D layers
POOL_CASES_1D = {
    "k2s2": ((8,), {"kernel_shape": [2], "strides": [2]}),
    "k3s2p1": ((9,), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "k3s2_ceil": ((10,), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}),
    "asym_pads_ceil": ((7,), {"kernel_shape": [3], "strides": [2], "pads": [0, 1], "ceil_mode": 1}),
    "ceil_last_window_on_pad": ((2,), {"kernel_shape": [3], "strides": [3], "pads": [1, 1], "ceil_mode": 1}),
    "same_upper": ((7,), {"kernel_shape": [4], "strides": [2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((7,), {"kernel_shape": [4], "strides": [3], "auto_pad": "SAME_LOWER"}),
    "dil2": ((9,), {"kernel_shape": [3], "dilations": [2], "pads": [1, 1]}),
}
POOL_CASES_3D = {
    "k2s2": ((4, 6, 5), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    "k3s2p1": ((5, 5, 7), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    "k3_mixed_ceil": ((5, 6, 7), {"kernel_shape": [1, 3, 3], "strides": [1, 2, 2], "ceil_mode": 1}),
    "asym_pads": ((5, 5, 4), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    "same_upper": ((5, 4, 6), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 2], "auto_pad": "SAME_UPPER"}),
    "dil_mixed": ((7, 6, 7), {"kernel_shape": [3, 2, 2], "dilations": [2, 1, 2], "strides": [1, 2, 1]}),
}
ND_CASES = {f"1d_{k}": ((1, 3) + v[0], v[1]) for k, v in POOL_CASES_1D.items()} | {
    f"3d_{k}": ((1, 2) + v[0], v[1]) for k, v in POOL_CASES_3D.items()
}


@pytest.mark.parametrize("name", list(ND_CASES))
def test_max_pool_nd(name, tmp_path):
    shape, attrs = ND_CASES[name]
    check_op("MaxPool", [x(*shape)], attrs, tmp_path)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("name", list(ND_CASES))
def test_average_pool_nd(name, count_include_pad, tmp_path):
    shape, attrs = ND_CASES[name]
    check_op("AveragePool", [x(*shape)], attrs | {"count_include_pad": count_include_pad}, tmp_path, opset=19)


# AveragePool's dilations (opset 19) are a depthwise convolution of 1 / window
AVG_DILATION_CASES = {
    "2d": ((1, 3, 9, 8), {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    "2d_pads_s2": (
        (1, 2, 9, 9),
        {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0]},
    ),
    "2d_ceil": ((1, 2, 10, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [3, 3], "ceil_mode": 1}),
    "1d": ((1, 2, 11), {"kernel_shape": [3], "dilations": [3], "pads": [2, 2]}),
    "3d": ((1, 2, 6, 7, 6), {"kernel_shape": [2, 2, 2], "dilations": [2, 2, 2], "pads": [1, 0, 1, 1, 1, 0]}),
}


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("name", list(AVG_DILATION_CASES))
def test_average_pool_dilations(name, count_include_pad, tmp_path):
    shape, attrs = AVG_DILATION_CASES[name]
    check_op("AveragePool", [x(*shape)], attrs | {"count_include_pad": count_include_pad}, tmp_path, opset=19)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_max_pool_dtypes(dtype, tmp_path):
    data = rand(1, 2, 7, 7, low=-100, high=100).astype(dtype) if dtype not in (np.float16, np.float64) else None
    data = rand(1, 2, 7, 7, dtype=dtype) if data is None else data
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0]}
    check_op("MaxPool", [x(data=data)], attrs, tmp_path, opset=12)


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 1, 1, 0]], ids=["layer", "explicit_pad"])
def test_average_pool_float16(pads, tmp_path):
    """(onnxruntime has no float64 AveragePool)"""
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": pads, "ceil_mode": 1}
    check_op("AveragePool", [x(data=rand(1, 2, 7, 8, dtype=np.float16))], attrs, tmp_path, rel_tol=1e-3)


LP_CASES = {
    "2d_k3": ((1, 2, 7, 8), {"kernel_shape": [3, 3]}),
    "2d_s2_pads": ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1]}),
    "2d_same_upper": ((1, 2, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "2d_ceil": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "2d_dilations": ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 3]}),
    "1d": ((1, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("name", list(LP_CASES))
def test_lp_pool(name, p, tmp_path):
    shape, attrs = LP_CASES[name]
    check_op("LpPool", [x(*shape)], attrs | {"p": p}, tmp_path, opset=18, rel_tol=2e-5)


def test_lp_pool_opset11(tmp_path):
    check_op("LpPool", [x(1, 2, 6, 6)], {"kernel_shape": [2, 2], "strides": [2, 2]}, tmp_path, opset=11)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7), (1, 2, 3, 4, 5)], ids=["2d", "1d", "3d"])
def test_global_lp_pool(shape, p, tmp_path):
    check_op("GlobalLpPool", [x(*shape)], {"p": p}, tmp_path, rel_tol=2e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7), (1, 2, 3, 4, 5)], ids=["2d", "1d", "3d"])
def test_global_pool(op, shape, tmp_path):
    check_op(op, [x(*shape)], {}, tmp_path)


def _max_pool_indices(data: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping k x k max pooling with ONNX's flat indices (batch and channel included)."""
    n, c, h, w = data.shape
    blocks = data.reshape(n, c, h // k, k, w // k, k).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // k, w // k, k * k)
    arg = blocks.argmax(-1)
    rows = np.arange(h // k)[:, None] * k + arg // k
    cols = np.arange(w // k)[None, :] * k + arg % k
    flat = ((np.arange(n)[:, None, None, None] * c + np.arange(c)[None, :, None, None]) * h + rows) * w + cols
    return blocks.max(-1), flat.astype(np.int64)


@pytest.mark.parametrize("output_shape", [None, (2, 3, 7, 9)], ids=["default", "output_shape"])
@pytest.mark.parametrize("indices", ["const", "input"])
def test_max_unpool(indices, output_shape, tmp_path):
    pooled, flat = _max_pool_indices(rand(2, 3, 6, 8), 2)
    inputs = [x(data=pooled), const(flat) if indices == "const" else x(data=flat)]
    if output_shape:
        inputs.append(const(np.array(output_shape, np.int64)))
    check_op("MaxUnpool", inputs, {"kernel_shape": [2, 2], "strides": [2, 2]}, tmp_path, opset=11)


def test_max_unpool_1d(tmp_path):
    data = rand(1, 2, 4)
    flat = np.array([[[0, 3, 5, 6], [9, 10, 12, 15]]], np.int64)
    check_op("MaxUnpool", [x(data=data), const(flat)], {"kernel_shape": [2], "strides": [2]}, tmp_path, opset=11)


# --- RoiAlign (ops.ROIAlign) ---

ROIS = np.array(
    [[0.0, 0.0, 9.0, 9.0], [1.0, 2.5, 7.3, 6.1], [2.0, 1.0, 11.5, 13.0], [3.2, 4.7, 5.9, 7.2], [-2.0, -1.0, 4.0, 3.0]],
    np.float32,
)
BATCH_INDICES = np.array([0, 1, 0, 1, 1], np.int64)


@pytest.mark.parametrize(
    "attrs",
    [
        {"output_height": 3, "output_width": 2, "sampling_ratio": 2},
        {"output_height": 2, "output_width": 4, "sampling_ratio": 1, "spatial_scale": 0.5},
        {"output_height": 5, "output_width": 5, "sampling_ratio": 3, "spatial_scale": 0.75},
    ],
    ids=["scale1", "scale0.5", "5x5"],
)
@pytest.mark.parametrize("transform", ["output_half_pixel", "half_pixel"])
def test_roi_align(attrs, transform, tmp_path):
    inputs = [x(2, 3, 12, 11), x(data=ROIS), x(data=BATCH_INDICES)]
    check_op("RoiAlign", inputs, attrs | {"coordinate_transformation_mode": transform}, tmp_path, opset=16)


def test_roi_align_const_rois_opset10(tmp_path):
    """Opset 10 has no coordinate_transformation_mode: it samples as output_half_pixel."""
    inputs = [x(2, 3, 12, 11), const(ROIS), const(BATCH_INDICES)]
    check_op("RoiAlign", inputs, {"output_height": 2, "output_width": 2, "sampling_ratio": 2}, tmp_path, opset=10)


@pytest.mark.xfail(strict=True, reason="ops.ROIAlign widens a RoI narrower than one feature cell to one cell")
def test_roi_align_half_pixel_tiny_roi(tmp_path):
    rois = np.array([[2.0, 3.0, 2.4, 3.5]], np.float32)
    inputs = [x(1, 2, 8, 8), x(data=rois), x(data=np.zeros(1, np.int64))]
    check_op("RoiAlign", inputs, {"output_height": 2, "output_width": 2, "sampling_ratio": 2}, tmp_path, opset=16)


@pytest.mark.parametrize(
    "attrs, match",
    [({"mode": "max", "sampling_ratio": 2}, "mode='max'"), ({}, "sampling_ratio=0")],
    ids=["max", "adaptive_sampling"],
)
def test_roi_align_refused(attrs, match):
    check_unsupported("RoiAlign", [x(2, 3, 12, 11), x(data=ROIS), x(data=BATCH_INDICES)], attrs, match, opset=16)


def test_max_roi_pool_refused():
    rois = np.array([[0, 1.0, 1.0, 5.0, 6.0]], np.float32)
    check_unsupported("MaxRoiPool", [x(1, 2, 8, 8), x(data=rois)], {"pooled_shape": [2, 2]}, "refused")


# --- Col2Im (ops.fold) ---

COL2IM_CASES = {
    "basic": ((5, 5), (2, 2), {}),
    "strides": ((7, 9), (3, 3), {"strides": [2, 2]}),
    "pads": ((5, 6), (3, 3), {"pads": [1, 1, 1, 1]}),
    "asym_pads": ((5, 6), (3, 2), {"pads": [0, 1, 2, 1], "strides": [1, 2]}),
    "dilations": ((7, 8), (2, 3), {"dilations": [2, 2]}),
}


def _blocks(image, block, attrs) -> int:
    pads = attrs.get("pads", [0, 0, 0, 0])
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    counts = [
        (i + pads[a] + pads[a + 2] - (k - 1) * d - 1) // s + 1
        for a, (i, k, s, d) in enumerate(zip(image, block, strides, dilations))
    ]
    return counts[0] * counts[1]


@pytest.mark.parametrize("name", list(COL2IM_CASES))
def test_col2im(name, tmp_path):
    image, block, attrs = COL2IM_CASES[name]
    data = x(2, 3 * block[0] * block[1], _blocks(image, block, attrs))
    inputs = [data, const(np.array(image, np.int64)), const(np.array(block, np.int64))]
    check_op("Col2Im", inputs, attrs, tmp_path, opset=18)


def test_col2im_3d_refused():
    inputs = [x(1, 8, 8), const(np.array([3, 3, 3], np.int64)), const(np.array([2, 2, 2], np.int64))]
    check_unsupported("Col2Im", inputs, {}, "3-D images", opset=18)


@pytest.mark.parametrize("op", ["LpPool", "GlobalLpPool", "MaxUnpool", "AveragePool"])
def test_pool_float16(op, tmp_path):
    """(onnxruntime has no float64 LpPool, GlobalLpPool or MaxUnpool); pools with dilations."""
    inputs = [x(data=rand(1, 3, 6, 6, dtype=np.float16))]
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} | ({"dilations": [2, 2]} if op != "MaxUnpool" else {})
    if op == "MaxUnpool":
        inputs.append(const(_max_pool_indices(rand(1, 3, 12, 12), 2)[1]))
    check_op(op, inputs, {} if op == "GlobalLpPool" else attrs, tmp_path, rel_tol=2e-3, opset=19)
