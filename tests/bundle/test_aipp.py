"""AIPP (torch2ms/bundle/aipp.py): the shipped aipp.cfg files, run through a numpy model of AIPP's
documented arithmetic on scikit-image's photos, reproduce the recipe's preprocessing within what
fp16 (and the integer colour conversion) explains; a wrong channel order, a wrong mean and a
missing 1/255 are each caught, by the check and by `package`; the YUV420SP path agrees with an RGB
image sent through the same BT.601 conversion, and with OpenCV's NV12 decoder."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
from conftest import write_recipe

from torch2ms.bundle import aipp, targets
from torch2ms.bundle.build import build_bundle
from torch2ms.errors import CheckFailed
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

IMAGENET = {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "color": "rgb"}
SIZE = (64, 96)  # H, W: the photos are resized (Pillow BILINEAR) to it, for both sides


@pytest.fixture(scope="module")
def images():
    imgs = aipp.check_images(SIZE)
    assert set(aipp.PHOTOS) <= set(imgs) and all(i.shape == (*SIZE, 3) for i in imgs.values())
    return imgs


def one_level(pre: dict) -> float:
    """One pixel level, in model-input units, on the channel where it is smallest."""
    return float(np.min(np.abs(pre["scale"] / np.array(pre["std"]))))


# --- the documented constants ---


def test_csc_matrices_are_the_documented_ones():
    # ATC docs, "CSC Configuration", YUV420SP_U8 to RGB888_U8, JPEG and BT-601NARROW columns
    assert aipp.csc_matrix("jpeg", "rgb").tolist() == [[256, 0, 359], [256, -88, -183], [256, 454, 0]]
    assert aipp.csc_matrix("bt601-narrow", "rgb").tolist() == [[298, 0, 409], [298, -100, -208], [298, 516, 0]]
    # ... and the "YUV420SP_U8 to BGR" sample: the rows in B, G, R order
    assert aipp.csc_matrix("bt601-narrow", "bgr").tolist() == [[298, 516, 0], [298, -100, -208], [298, 0, 409]]


def test_cfg_round_trips_through_the_parser():
    pre = {**IMAGENET, "color": "bgr"}
    for name, (text, standard) in targets.aipp_configs(pre, *SIZE).items():
        cfg = aipp.parse_cfg(text)
        assert (cfg.src_image_size_h, cfg.src_image_size_w) == SIZE and cfg.mean_chn == [0, 0, 0]
        np.testing.assert_allclose(cfg.min_chn, np.array(pre["mean"]) * 255, atol=5e-7)
        np.testing.assert_allclose(cfg.var_reci_chn, 1 / (np.array(pre["std"]) * 255), atol=5e-10)
        if standard is None:
            assert name == "aipp.cfg" and cfg.input_format == "RGB888_U8" and cfg.rbuv_swap_switch
        else:
            assert name == "aipp_yuv420sp.cfg" and cfg.input_format == "YUV420SP_U8" and cfg.csc_switch
            assert (cfg.matrix == aipp.csc_matrix(standard, "bgr")).all() and cfg.input_bias == [0, 128, 128]
            assert "DVPP's JPEG decoder" in text  # the file says which decoder/camera format it expects
    with pytest.raises(ValueError, match="unknown parameter 'mean_chan_0'"):
        aipp.parse_cfg("aipp_op {\n  mean_chan_0: 3\n}\n")


def test_odd_sizes_get_no_yuv420sp_config():
    assert list(targets.aipp_configs(IMAGENET, 31, 32)) == ["aipp.cfg"]


# --- the shipped configs pass, within a bound that sees one pixel level ---


@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_shipped_configs_reproduce_the_recipe_on_photos(color, images):
    pre = {**IMAGENET, "color": color}
    check = aipp.check_bundle(targets.aipp_configs(pre, *SIZE), pre, SIZE)
    assert check["images"] == list(images)
    rgb, yuv = check["configs"]["aipp.cfg"], check["configs"]["aipp_yuv420sp.cfg"]
    assert rgb["passed"] and yuv["passed"] and yuv["standard"] == "jpeg"
    for r in (rgb, yuv):
        assert all(0 < e <= r["bound"] for e in r["max_error"].values()), r
    # fp16 alone stays below a quarter level; the 8-bit CSC costs about one level more
    assert rgb["bound"] < one_level(pre) / 3 < yuv["bound"] < 3 * one_level(pre)


def test_the_levels_image_covers_every_pixel_value():
    levels = aipp.check_images((16, 16))["levels"]  # 256 pixels
    assert all(sorted(np.unique(levels[:, :, c])) == list(range(256)) for c in range(3))
    small = aipp.check_images((8, 8))  # 64 pixels: four images
    assert [k for k in small if k.startswith("levels")] == ["levels", "levels1", "levels2", "levels3"]


@pytest.mark.parametrize(
    "mean, std", [(IMAGENET["mean"], IMAGENET["std"]), ([0.5] * 3, [0.5] * 3), ([0.1] * 3, [2.0] * 3)]
)
def test_the_fp16_bound_holds_for_every_pixel_value(mean, std):
    """Exhaustive over 0..255 (AIPP is per pixel and channel): every error within the bound."""
    pre = {**IMAGENET, "mean": mean, "std": std}
    cfg = aipp.parse_cfg(targets.aipp_cfg(pre, 1, 256))
    pixels = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)
    err = np.abs(aipp.run(cfg, pixels, (1, 256)) - aipp.recipe_preprocess(pixels, pre)).max(axis=(0, 1))
    assert (err <= aipp.fp16_bound(pre)).all() and (err > 0).all()


# --- faults: each caught ---


FAULTS = {
    "channel order": {**IMAGENET, "color": "bgr"},
    "mean in reversed channel order": {**IMAGENET, "mean": IMAGENET["mean"][::-1]},
    "mean off by one level": {**IMAGENET, "mean": [IMAGENET["mean"][0] + 1 / 255, *IMAGENET["mean"][1:]]},
    "missing 1/255": {**IMAGENET, "scale": 1.0},
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_wrong_config_is_caught(fault, images):
    # the 8-bit CSC costs ~2 levels, so the YUV path cannot tell one level of mean from rounding
    for yuv in (None,) if fault == "mean off by one level" else (None, "jpeg"):
        wrong = targets.aipp_cfg(FAULTS[fault], *SIZE, yuv)
        r = aipp.check_config(wrong, IMAGENET, SIZE, yuv, images)
        assert not r["passed"] and r["max_error"][r["worst"]] > r["bound"], (fault, yuv, r)
    with pytest.raises(CheckFailed, match=r"aipp\.cfg: max error .* on '.*' > "):
        aipp.check_bundle({"aipp.cfg": (targets.aipp_cfg(FAULTS[fault], *SIZE), None)}, IMAGENET, SIZE)


# --- YUV420SP ---


def test_yuv420sp_matches_rgb_through_the_same_conversion(images):
    """NV12 frames made from each photo with BT.601 (full range, JPEG) go through the YUV config;
    the same photo through that conversion and back (exactly, in float) goes through the recipe's
    preprocessing and, rounded to uint8, through the RGB config."""
    configs = targets.aipp_configs(IMAGENET, *SIZE)
    yuv_cfg, rgb_cfg = aipp.parse_cfg(configs["aipp_yuv420sp.cfg"][0]), aipp.parse_cfg(configs["aipp.cfg"][0])
    yuv_bound, rgb_bound = aipp.bound(IMAGENET, "jpeg"), aipp.bound(IMAGENET)
    for name, rgb in images.items():
        nv12 = aipp.rgb_to_yuv420sp(rgb, "jpeg")
        assert nv12.shape == (SIZE[0] * 3 // 2, SIZE[1]) and nv12.dtype == np.uint8
        seen = aipp.yuv420sp_to_rgb(nv12, SIZE[0], "jpeg")  # the RGB the frame represents
        got = aipp.run(yuv_cfg, nv12, SIZE).astype(np.float64)
        assert np.abs(got - aipp.recipe_preprocess(seen, IMAGENET)).max() <= yuv_bound, name
        via_rgb = aipp.run(rgb_cfg, np.rint(seen).astype(np.uint8), SIZE).astype(np.float64)
        assert np.abs(got - via_rgb).max() <= yuv_bound + rgb_bound + 0.5 * np.max(
            1 / (255 * np.array(IMAGENET["std"]))
        )
    # the encoder itself: a photo whose colour is constant over 2x2 blocks loses only the rounding
    # of Y, U and V to integers (half a level each, through the matrix) on the way back
    blocks = images["astronaut"][::2, ::2].repeat(2, 0).repeat(2, 1)
    back = aipp.yuv420sp_to_rgb(aipp.rgb_to_yuv420sp(blocks, "jpeg"), SIZE[0], "jpeg")
    assert np.abs(back - blocks).max() <= 0.5 * np.abs(aipp.STANDARDS["jpeg"].yuv_to_rgb).sum(axis=1).max()


def test_nv12_layout_matches_opencv():
    """OpenCV's COLOR_YUV2RGB_NV12 decodes narrow-range BT.601: an independent reading of the NV12
    layout (Y plane, then U,V interleaved) and of the narrow matrix the cfg comments offer."""
    import cv2

    rgb = aipp.check_images(SIZE)["astronaut"]
    nv12 = aipp.rgb_to_yuv420sp(rgb, "bt601-narrow")
    decoded = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12).astype(np.float64)
    assert np.abs(aipp.yuv420sp_to_rgb(nv12, SIZE[0], "bt601-narrow") - decoded).max() <= 1.0  # OpenCV rounds
    cfg = aipp.parse_cfg(targets.aipp_cfg(IMAGENET, *SIZE, "bt601-narrow"))
    err = np.abs(aipp.run(cfg, nv12, SIZE) - aipp.recipe_preprocess(decoded, IMAGENET)).max()
    assert err <= aipp.bound(IMAGENET, "bt601-narrow") + np.max(1 / (255 * np.array(IMAGENET["std"])))


def test_yuv_faults_are_caught(images):
    cfg = aipp.parse_cfg(targets.aipp_cfg(IMAGENET, *SIZE, "jpeg"))
    rgb = images["coffee"]
    want = aipp.recipe_preprocess(aipp.yuv420sp_to_rgb(aipp.rgb_to_yuv420sp(rgb, "jpeg"), SIZE[0], "jpeg"), IMAGENET)
    nv21 = aipp.rgb_to_yuv420sp(rgb, "jpeg")
    nv21[SIZE[0] :] = nv21[SIZE[0] :].reshape(-1, 2)[:, ::-1].reshape(nv21[SIZE[0] :].shape)  # V before U
    narrow = aipp.rgb_to_yuv420sp(rgb, "bt601-narrow")  # a camera frame fed to the JPEG config
    for frame in (nv21, narrow):
        assert np.abs(aipp.run(cfg, frame, SIZE) - want).max() > 3 * aipp.bound(IMAGENET, "jpeg")
    cfg.rbuv_swap_switch = True  # what the cfg comment says to do for NV21
    assert np.abs(aipp.run(cfg, nv21, SIZE) - want).max() <= aipp.bound(IMAGENET, "jpeg")


# --- crop and padding, as documented ---


def test_crop_then_padding(images):
    photo = images["chelsea"]
    cfg = aipp.parse_cfg(targets.aipp_cfg(IMAGENET, *SIZE))
    plain = aipp.run(cfg, photo, SIZE)
    cfg.src_image_size_h, cfg.src_image_size_w = SIZE
    cfg.crop, cfg.load_start_pos_h, cfg.load_start_pos_w = True, 4, 6
    cfg.padding, cfg.top_padding_size, cfg.bottom_padding_size = True, 1, 3
    cfg.left_padding_size, cfg.right_padding_size, cfg.padding_value = 2, 4, -7.0
    out = aipp.run(cfg, photo, SIZE)  # crop size from the model input minus the padding
    inner = out[1 : SIZE[0] - 3, 2 : SIZE[1] - 4]
    np.testing.assert_array_equal(inner, plain[4 : 4 + SIZE[0] - 4, 6 : 6 + SIZE[1] - 6])
    border = np.ones(SIZE, bool)
    border[1 : SIZE[0] - 3, 2 : SIZE[1] - 4] = False
    assert (out[border] == -7.0).all()
    cfg.crop_size_h = SIZE[0]  # documented: load_start_pos + crop_size <= src_image_size
    with pytest.raises(ValueError, match="crop window 90x64 at \\(6, 4\\) leaves the 96x64 image"):
        aipp.run(cfg, photo, SIZE)
    cfg.crop_size_h = 30  # crop + padding no longer give the model's size
    with pytest.raises(ValueError, match="AIPP produces 96x34, the model takes 96x64"):
        aipp.run(cfg, photo, SIZE)


# --- package runs the check on what it ships ---


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("aipp")
    recipe = write_recipe(d / "tiny.yaml", preprocess={"resize": [32, 32], **IMAGENET}, check={"samples": 1})
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run()
    assert result.passed
    return result, d


def test_package_records_the_aipp_check(tiny_run):
    result, d = tiny_run
    bundle = build_bundle(result, d / "dist", log=lambda m: None)
    check = bundle.manifest["aipp_check"]
    assert set(check["configs"]) == {"aipp.cfg", "aipp_yuv420sp.cfg"}
    assert check["images"][-3:] == list(aipp.PHOTOS)
    with tarfile.open(bundle.path) as tar:
        compat = tar.extractfile("compatibility.md").read().decode()
        shipped = tar.extractfile("targets/atlas-200i-dk-a2/aipp.cfg").read().decode()
        compat_json = json.loads(tar.extractfile("compatibility.json").read())
    assert shipped == targets.aipp_cfg(IMAGENET, 32, 32)
    assert "## AIPP vs the recipe's preprocessing" in compat and compat_json["aipp"] == check
    row = next(line for line in compat.splitlines() if line.startswith("| aipp.cfg |"))
    assert row.endswith(f" | {check['configs']['aipp.cfg']['bound']:.3g} |")


def test_package_refuses_a_wrong_aipp_generator(tiny_run, monkeypatch):
    result, d = tiny_run
    real = targets.aipp_cfg
    monkeypatch.setattr(targets, "aipp_cfg", lambda pre, h, w, yuv=None: real({**pre, "scale": 1.0}, h, w, yuv))
    with pytest.raises(CheckFailed, match=r"AIPP would not compute the recipe's preprocessing: aipp\.cfg: max error"):
        build_bundle(result, d / "bad", log=lambda m: None)
    assert not (d / "bad").exists()
