"""Resize against onnxruntime: linear and nearest, every coordinate_transformation_mode the
converter accepts, sizes and scales (integral and not), up and down, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, f32, i64, x

LINEAR_CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
# (input H, W, scales or None, sizes or None)
GEOMETRIES = {
    "x2": ((5, 6), (2.0, 2.0), None),
    "x0.5_even": ((8, 6), (0.5, 0.5), None),
    "x0.5_odd": ((13, 13), (0.5, 0.5), None),  # 13 * 0.5 -> 6: the scale is not out/in
    "x1.5_odd": ((13, 7), (1.5, 1.5), None),
    "x1.7_x0.6": ((6, 9), (1.7, 0.6), None),
    "only_w": ((4, 5), (1.0, 2.5), None),
    "sizes_up": ((5, 7), None, (11, 16)),
    "sizes_down": ((13, 13), None, (6, 4)),
    "sizes_to_1": ((4, 5), None, (1, 3)),
    "sizes_same": ((4, 5), None, (4, 5)),
}


def _inputs(hw, scales, sizes, opset):
    data = x(1, 2, *hw)
    roi = f32() if opset < 13 else None  # an empty roi input (opset 11 has no optional trailing form)
    if scales is not None:
        return [data, roi, f32(1.0, 1.0, *scales)]
    return [data, roi, f32(), i64(1, 2, *sizes)]


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("ctm", LINEAR_CTMS)
def test_resize_linear(ctm, geometry, tmp_path):
    hw, scales, sizes = GEOMETRIES[geometry]
    check_op(
        "Resize", _inputs(hw, scales, sizes, 17), {"mode": "linear", "coordinate_transformation_mode": ctm}, tmp_path
    )


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize(
    "ctm, nearest_mode",
    [
        ("asymmetric", "floor"),
        ("half_pixel", "round_prefer_floor"),
        ("half_pixel", "round_prefer_ceil"),
        ("pytorch_half_pixel", "floor"),
        ("align_corners", "round_prefer_floor"),
        ("asymmetric", "ceil"),
    ],
)
def test_resize_nearest(ctm, nearest_mode, geometry, tmp_path):
    hw, scales, sizes = GEOMETRIES[geometry]
    check_op(
        "Resize",
        _inputs(hw, scales, sizes, 17),
        {"mode": "nearest", "coordinate_transformation_mode": ctm, "nearest_mode": nearest_mode},
        tmp_path,
    )


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_resize_half_pixel_symmetric(mode, tmp_path):
    check_op(
        "Resize",
        _inputs((6, 7), (1.5, 0.7), None, 19),
        {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"},
        tmp_path,
        opset=19,
    )


@pytest.mark.parametrize("opset", [11, 13])
def test_resize_older_opsets(opset, tmp_path):
    check_op(
        "Resize",
        _inputs((5, 5), (1.5, 1.5), None, opset),
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        tmp_path,
        opset=opset,
    )
    check_op(
        "Resize",
        _inputs((5, 5), None, (8, 9), opset),
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        tmp_path / "sizes",
        opset=opset,
    )


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_keep_aspect_ratio(policy, tmp_path):
    """Opset 18: sizes for the listed axes only, optionally keeping the aspect ratio."""
    check_op(
        "Resize",
        [x(1, 2, 6, 8), None, None, i64(9, 10)],
        {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy},
        tmp_path,
        opset=18,
    )


def test_resize_generated_code_uses_mindspores_resize_when_it_is_exact(tmp_path):
    # the primitive ops.interpolate calls (ops.interpolate itself does not compile with a dynamic batch)
    src = check_op("Resize", _inputs((5, 6), (2.0, 2.0), None, 17), {"mode": "linear"}, tmp_path / "a")
    assert "ops.ResizeBilinearV2(align_corners=False,half_pixel_centers=True)(in0,(10,12))" in "".join(src.split())
    src = check_op("Resize", _inputs((13, 13), (0.5, 0.5), None, 17), {"mode": "linear"}, tmp_path / "b")
    assert "Resize" not in src.split("def construct")[1] and "ops.matmul" in src
    # segmentation-head sizes: float32 rounding of large coordinates must not lose the shortcut
    # (and shows in the values: MindSpore and onnxruntime round them differently, 1.4e-5 measured)
    src = check_op("Resize", _inputs((33, 65), None, (257, 513), 17), {"mode": "linear"}, tmp_path / "c", rel_tol=5e-5)
    assert "ops.ResizeBilinearV2(align_corners=False,half_pixel_centers=True)(in0,(257,513))" in "".join(src.split())
    src = check_op(
        "Resize",
        _inputs((33, 65), None, (257, 513), 17),
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        tmp_path / "d",
        rel_tol=5e-5,
    )
    assert "ops.ResizeBilinearV2(align_corners=True,half_pixel_centers=False)(in0,(257,513))" in "".join(src.split())


CUBIC_CTMS = LINEAR_CTMS + ["half_pixel_symmetric"]


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("ctm", CUBIC_CTMS)
def test_resize_cubic(ctm, geometry, tmp_path):
    hw, scales, sizes = GEOMETRIES[geometry]
    opset = 19 if ctm == "half_pixel_symmetric" else 17
    attrs = {"mode": "cubic", "coordinate_transformation_mode": ctm}
    check_op("Resize", _inputs(hw, scales, sizes, opset), attrs, tmp_path, opset=opset)


@pytest.mark.parametrize("geometry", ["x2", "x0.5_odd", "x1.7_x0.6", "sizes_to_1"])
@pytest.mark.parametrize("a, exclude_outside", [(-0.5, 1), (-0.75, 1), (-0.5, 0)])
def test_resize_cubic_coefficient_and_exclude_outside(a, exclude_outside, geometry, tmp_path):
    hw, scales, sizes = GEOMETRIES[geometry]
    attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude_outside}
    check_op("Resize", _inputs(hw, scales, sizes, 17), attrs, tmp_path)


def test_resize_cubic_opset11_asymmetric(tmp_path):
    attrs = {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}
    check_op("Resize", _inputs((5, 4), (2.0, 1.5), None, 11), attrs, tmp_path, opset=11)


@pytest.mark.parametrize("geometry", ["x0.5_even", "x0.5_odd", "x1.7_x0.6", "sizes_down", "x2", "sizes_same"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias(mode, exclude_outside, geometry, tmp_path):
    """Opset 18: downscaling widens the filter; upscaling is plain interpolation."""
    hw, scales, sizes = GEOMETRIES[geometry]
    attrs = {"mode": mode, "antialias": 1, "exclude_outside": exclude_outside}
    check_op("Resize", _inputs(hw, scales, sizes, 18), attrs, tmp_path, opset=18)


@pytest.mark.parametrize("ctm", ["align_corners", "asymmetric", "pytorch_half_pixel", "half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_coordinate_modes(mode, ctm, tmp_path):
    attrs = {"mode": mode, "antialias": 1, "coordinate_transformation_mode": ctm}
    check_op("Resize", _inputs((13, 11), (0.4, 0.7), None, 19), attrs, tmp_path, opset=19)


def test_resize_antialias_large_downscale(tmp_path):
    """A wide window: 4x down with cubic reads 17 input pixels per output pixel."""
    check_op("Resize", _inputs((32, 9), None, (8, 2), 18), {"mode": "cubic", "antialias": 1}, tmp_path, opset=18)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])
def test_resize_nearest_integer_data(dtype, tmp_path):
    data = x(data=np.arange(30, dtype=dtype).reshape(1, 1, 5, 6))
    check_op("Resize", [data, None, f32(1.0, 1.0, 2.0, 0.5)], {"mode": "nearest"}, tmp_path)


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "coordinate_transformation_mode"),
        (
            {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
            "coordinate_transformation_mode",
        ),
    ],
)
def test_resize_refuses(attrs, match):
    inputs = [x(1, 2, 6, 6), f32(0, 0, 0, 0, 1, 1, 1, 1), f32(1.0, 1.0, 0.5, 0.5)]
    check_unsupported("Resize", inputs, attrs, match, opset=11 if "tf_half_pixel_for_nn" in str(attrs) else 17)


def test_resize_refuses_integer_linear():
    data = x(data=np.arange(36, dtype=np.int32).reshape(1, 1, 6, 6))
    check_unsupported("Resize", [data, None, f32(1.0, 1.0, 1.5, 1.5)], {"mode": "linear"}, "nearest only")


def test_resize_refuses_runtime_sizes():
    data = [x(1, 1, 4, 4), None, None, x(data=np.array([1, 1, 8, 8], np.int64))]
    check_unsupported("Resize", data, {"mode": "linear"}, "sizes (input 3) must be a constant")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(2.0, 3.0), (1.5, 1.0), (2.5, 1.7)])
def test_upsample(mode, scales, tmp_path):
    """Deprecated Upsample (opset 9): asymmetric coordinates, nearest rounds down."""
    check_op("Upsample", [x(1, 2, 4, 5), f32(1.0, 1.0, *scales)], {"mode": mode}, tmp_path, opset=9)


def test_upsample_opset7_attribute(tmp_path):
    check_op("Upsample", [x(1, 2, 3, 3)], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 2.0]}, tmp_path, opset=7)


def test_resize_refuses_channel_axis():
    check_unsupported("Resize", [x(1, 2, 6, 6), None, f32(1.0, 2.0, 1.0, 1.0)], {"mode": "nearest"}, "channel")


def test_resize_refuses_3d():
    check_unsupported("Resize", [x(1, 2, 6), None, f32(1.0, 1.0, 2.0)], {"mode": "linear"}, "rank")
