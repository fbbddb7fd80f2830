"""MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool against onnxruntime."""

from __future__ import annotations

import pytest
from converters.helpers import check_op, check_unsupported, x

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


def test_max_pool_indices_refused():
    check_unsupported("MaxPool", [x(1, 2, 4, 4)], {"kernel_shape": [2, 2]}, "Indices", n_outputs=2)


def test_pool_1d_refused():
    check_unsupported("MaxPool", [x(1, 2, 8)], {"kernel_shape": [2]}, "rank")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7), (1, 2, 3, 4, 5)], ids=["2d", "1d", "3d"])
def test_global_pool(op, shape, tmp_path):
    check_op(op, [x(*shape)], {}, tmp_path)
