"""ConvTranspose (nn.Conv1dTranspose / nn.Conv2dTranspose / nn.Conv3dTranspose) against onnxruntime:
output_padding, output_shape, groups, dilations, auto_pad and asymmetric pads, odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, rand, x

# (input shape, out channels per group, kernel, attrs)
CASES_2D = {
    "k3_s2_p1": ((1, 4, 5, 5), 3, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "k3_s2_p1_outpad1": ((1, 4, 5, 6), 3, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    "k3_s2_p0_outpad1": ((1, 4, 5, 5), 3, (3, 3), {"strides": [2, 2], "output_padding": [1, 1]}),
    "k4_s3_p1_outpad2": ((1, 2, 4, 5), 3, (4, 4), {"strides": [3, 3], "pads": [1, 1, 1, 1], "output_padding": [2, 1]}),
    "k2_s2": ((2, 3, 4, 5), 4, (2, 2), {"strides": [2, 2]}),
    "k4_s2_p1": ((1, 3, 6, 7), 2, (4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "k1_s1": ((1, 3, 5, 5), 4, (1, 1), {}),
    "k1_s2": ((1, 3, 5, 6), 2, (1, 1), {"strides": [2, 2]}),  # kernel shorter than the stride
    "k2_s3_mixed": ((1, 3, 4, 5), 2, (2, 3), {"strides": [3, 2]}),
    "k3_s1_p1": ((1, 3, 6, 5), 4, (3, 3), {"pads": [1, 1, 1, 1]}),
    "k3x2_s_mixed": ((1, 3, 5, 6), 2, (3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    "asym_pads": ((1, 3, 5, 5), 2, (3, 3), {"strides": [2, 2], "pads": [0, 2, 1, 0]}),
    "dil2": ((1, 3, 5, 5), 2, (3, 3), {"dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    "dil2_s2_outpad1": ((1, 3, 5, 4), 2, (3, 3), {"dilations": [2, 2], "strides": [2, 2], "output_padding": [1, 1]}),
    "group2": (
        (1, 4, 5, 5),
        3,
        (3, 3),
        {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "depthwise": ((1, 4, 5, 6), 1, (4, 4), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "output_shape": ((1, 3, 5, 5), 2, (3, 3), {"strides": [2, 2], "output_shape": [10, 10]}),
    "output_shape_odd_total": ((1, 3, 5, 5), 2, (3, 3), {"strides": [2, 2], "output_shape": [8, 9]}),
    "output_shape_s3": ((1, 3, 4, 4), 2, (3, 3), {"strides": [3, 3], "output_shape": [12, 11]}),
    "same_upper_s2": ((1, 3, 5, 5), 2, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower_s2": ((1, 3, 5, 5), 2, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "same_upper_k4_s2": ((1, 3, 4, 5), 2, (4, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "valid": ((1, 3, 4, 4), 2, (3, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
}

CASES_1D = {
    "k3_s2_p1": ((1, 4, 7), 3, (3,), {"strides": [2], "pads": [1, 1]}),
    "k3_s2_p1_outpad1": ((2, 4, 5), 3, (3,), {"strides": [2], "pads": [1, 1], "output_padding": [1]}),
    "k4_s2_asym": ((1, 3, 6), 2, (4,), {"strides": [2], "pads": [2, 1]}),
    "k3_s2_p0_outpad1": ((1, 3, 6), 2, (3,), {"strides": [2], "output_padding": [1]}),
    "dil2_group2": ((1, 4, 5), 2, (3,), {"dilations": [2], "group": 2}),
    "k1_s2": ((1, 3, 6), 2, (1,), {"strides": [2]}),
    "same_upper": ((1, 3, 5), 2, (3,), {"strides": [2], "auto_pad": "SAME_UPPER"}),
    "output_shape": ((1, 3, 5), 2, (3,), {"strides": [3], "output_shape": [16]}),
}

CASES_3D = {
    "k3_s2_p1": ((1, 3, 3, 4, 5), 2, (3, 3, 3), {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    "k3_s2_p1_outpad1": (
        (1, 3, 3, 4, 5),
        2,
        (3, 3, 3),
        {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1], "output_padding": [1, 0, 1]},
    ),
    "k2_s2": ((1, 2, 3, 3, 4), 3, (2, 2, 2), {"strides": [2, 2, 2]}),
    "k1_s2": ((1, 2, 3, 3, 4), 2, (1, 1, 1), {"strides": [2, 2, 2]}),
    "asym_pads": ((1, 2, 3, 4, 4), 2, (3, 3, 2), {"strides": [1, 2, 2], "pads": [0, 1, 1, 2, 0, 0]}),
    "dil2_depth": ((1, 2, 3, 4, 4), 2, (3, 3, 3), {"dilations": [2, 1, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    "group2": ((1, 4, 3, 3, 3), 2, (3, 3, 3), {"group": 2, "strides": [2, 2, 2]}),
    "same_lower": ((1, 2, 3, 3, 4), 2, (3, 3, 3), {"strides": [2, 2, 2], "auto_pad": "SAME_LOWER"}),
}


def _inputs(shape, per_group, kernel, attrs, bias):
    group = attrs.get("group", 1)
    w = rand(shape[1], per_group, *kernel, seed=1, low=-0.5, high=0.5)
    return [x(*shape), const(w)] + ([const(rand(per_group * group, seed=2))] if bias else [])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CASES_2D))
def test_conv_transpose_2d(name, bias, tmp_path):
    check_op("ConvTranspose", _inputs(*CASES_2D[name][:3], CASES_2D[name][3], bias), CASES_2D[name][3], tmp_path)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CASES_1D))
def test_conv_transpose_1d(name, bias, tmp_path):
    check_op("ConvTranspose", _inputs(*CASES_1D[name][:3], CASES_1D[name][3], bias), CASES_1D[name][3], tmp_path)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CASES_3D))
def test_conv_transpose_3d(name, bias, tmp_path):
    check_op("ConvTranspose", _inputs(*CASES_3D[name][:3], CASES_3D[name][3], bias), CASES_3D[name][3], tmp_path)


def test_conv_transpose_opset11(tmp_path):
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}
    check_op("ConvTranspose", _inputs((1, 3, 4, 4), 2, (3, 3), attrs, True), attrs, tmp_path, opset=11)


def test_conv_transpose_dynamic_weight_refused():
    check_unsupported("ConvTranspose", [x(1, 3, 4, 4), x(3, 2, 3, 3)], {}, "weight")


@pytest.mark.parametrize("shape", [(1, 3, 5), (1, 3, 5, 6)], ids=["1d_as_2d", "2d"])
def test_conv_transpose_float16(shape, tmp_path):
    """float16 runs as float32 between casts (onnxruntime has no float64 ConvTranspose)."""
    n = len(shape) - 2
    w = rand(3, 2, *[3] * n, seed=1, low=-0.5, high=0.5, dtype=np.float16)
    inputs = [x(data=rand(*shape, dtype=np.float16)), const(w), const(rand(2, seed=2, dtype=np.float16))]
    attrs = {"strides": [2] * n, "pads": [1] * (2 * n), "output_padding": [1] * n}
    check_op("ConvTranspose", inputs, attrs, tmp_path, rel_tol=2e-3)
