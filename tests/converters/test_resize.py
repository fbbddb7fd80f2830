"""Resize against onnxruntime: linear and nearest, every coordinate_transformation_mode the
converter accepts, sizes and scales (integral and not), up and down, and the refusals."""

from __future__ import annotations

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


def test_resize_generated_code_uses_interpolate_when_it_is_exact(tmp_path):
    src = check_op("Resize", _inputs((5, 6), (2.0, 2.0), None, 17), {"mode": "linear"}, tmp_path / "a")
    assert 'ops.interpolate(in0, size=(10, 12), mode="bilinear", align_corners=False)' in src
    src = check_op("Resize", _inputs((13, 13), (0.5, 0.5), None, 17), {"mode": "linear"}, tmp_path / "b")
    assert "ops.interpolate" not in src and "ops.matmul" in src
    # segmentation-head sizes: float32 rounding of large coordinates must not lose the shortcut
    # (and shows in the values: MindSpore and onnxruntime round them differently, 1.4e-5 measured)
    src = check_op("Resize", _inputs((33, 65), None, (257, 513), 17), {"mode": "linear"}, tmp_path / "c", rel_tol=5e-5)
    assert 'ops.interpolate(in0, size=(257, 513), mode="bilinear", align_corners=False)' in src
    src = check_op(
        "Resize",
        _inputs((33, 65), None, (257, 513), 17),
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        tmp_path / "d",
        rel_tol=5e-5,
    )
    assert 'ops.interpolate(in0, size=(257, 513), mode="bilinear", align_corners=True)' in src


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"mode": "cubic"}, "mode"),
        ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "coordinate_transformation_mode"),
        (
            {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
            "coordinate_transformation_mode",
        ),
        ({"mode": "linear", "antialias": 1}, "antialias"),
    ],
)
def test_resize_refuses(attrs, match):
    opset = 18 if "antialias" in attrs else 17
    inputs = [x(1, 2, 6, 6), f32(0, 0, 0, 0, 1, 1, 1, 1), f32(1.0, 1.0, 0.5, 0.5)]
    check_unsupported("Resize", inputs, attrs, match, opset=opset)


def test_resize_refuses_channel_axis():
    check_unsupported("Resize", [x(1, 2, 6, 6), None, f32(1.0, 2.0, 1.0, 1.0)], {"mode": "nearest"}, "channel")


def test_resize_refuses_3d():
    check_unsupported("Resize", [x(1, 2, 6), None, f32(1.0, 1.0, 2.0)], {"mode": "linear"}, "rank")
