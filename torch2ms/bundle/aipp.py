"""AIPP, modelled in numpy, and the check that the shipped ``aipp.cfg`` files compute the
recipe's preprocessing.

With ``atc --insert_op_conf=aipp.cfg`` the NPU's AI pre-processing unit (AIPP) turns uint8 camera
or decoder pixels into the model's input; the host preprocessing of ``infer.py`` no longer runs.
A wrong channel order, mean or scale in that file changes every prediction on the board and
nothing on the host notices. ``package`` therefore runs the shipped configs through this model
of AIPP on real photos and compares with the recipe's preprocessing.

The arithmetic, per the CANN ATC documentation ("AIPP Configuration": CSC, normalisation,
crop/padding; the ``aclmdlSetAIPP*`` parameter ranges), in AIPP's order
swap -> crop -> CSC -> normalisation -> padding:

* ``rbuv_swap_switch`` swaps R/B of an RGB input, U/V of a YUV input (NV21 -> NV12), first.
* ``crop``: the ``crop_size_w x crop_size_h`` window at ``(load_start_pos_w, load_start_pos_h)``
  (even positions for YUV420SP); without a size, the model's input size.
* CSC (``csc_switch``), integer matrix ``M = matrix_r{i}c{j}``, ``>> 8`` an arithmetic shift::

      YUV -> RGB:  out = (M @ (yuv - input_bias)) >> 8          rows in the output channel order
      RGB -> YUV:  out = ((M @ rgb) >> 8) + output_bias

  saturated to 0..255 (the result is U8). YUV420SP_U8 (NV12) is a full-resolution Y plane and a
  half-resolution interleaved UV plane; each UV pair serves a 2x2 block of pixels.
* normalisation to fp16: ``out_i = (pixel_i - mean_chn_i - min_chn_i) * var_reci_chn_i``.
  ``mean_chn`` is an integer, ``min_chn`` and ``var_reci_chn`` are fp16 (range +-65504), and
  every operation is rounded to fp16 here (the most rounding the hardware can do).
* padding: ``*_padding_size`` pixels of ``padding_value`` around the normalised image.

**The bound.** Let ``u = 2**-11`` (fp16 unit roundoff), ``m = mean / scale`` and ``v = scale / std``
the recipe's exact values, ``D = max(|m|, |255 - m|)`` the largest ``|pixel - m|``, and ``e_m``,
``e_v`` half a unit in the last digit written to the file. fp16 rounds ``x`` by at most
``u|x|`` (plus 2**-25 below the normal range, added to every rounding in the code). Storing the
parameters moves them by ``δ_m = u(|m| + e_m) + e_m`` and ``δ_v = u(|v| + e_v) + e_v``; then
``pixel - mean_chn`` is exact, ``- min_chn`` rounds a value of at most ``T = D + δ_m`` and the
product rounds one of at most ``(1+u) T (|v| + δ_v)``, so per channel::

    |AIPP - (pixel - m) * v| <= (u T + δ_m)(|v| + δ_v) + D δ_v + u (1+u) T (|v| + δ_v)

For ImageNet's red channel (m = 123.675, v = 0.01712) that is 4.3e-3: a quarter of one pixel
level (0.0171), so a mean off by one level already fails. For a YUV input the integer CSC adds,
in pixel levels, at most 1 (the shift truncates) plus ``sum_j range_j / 512`` (each coefficient
an integer / 256, at most 1/512 from the exact BT.601 value; ``range_j`` the largest
``|component - input_bias_j|``): about 2 levels. These bounds come from the recipe and the
format's precision only, never from the file under test, so a wrong file cannot widen them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from torch2ms.errors import CheckFailed

U16 = 2.0**-11  # fp16 unit roundoff (round to nearest)
MIN_DECIMALS = 6  # digits after the point written for min_chn (targets.aipp_cfg)
VAR_DECIMALS = 9  # ... and for var_reci_chn
PHOTOS = ("astronaut", "coffee", "chelsea")  # scikit-image's bundled photos


# --- colour standards ---------------------------------------------------------------------------


def _yuv_to_rgb(kr: float, kb: float, y_scale: float, c_scale: float) -> np.ndarray:
    """Exact YUV -> RGB matrix (rows R, G, B; columns Y, U=Cb, V=Cr) of a BT.601-style standard."""
    kg = 1 - kr - kb
    return np.array(
        [
            [y_scale, 0.0, 2 * (1 - kr) * c_scale],
            [y_scale, -2 * (1 - kb) * kb / kg * c_scale, -2 * (1 - kr) * kr / kg * c_scale],
            [y_scale, 2 * (1 - kb) * c_scale, 0.0],
        ]
    )


@dataclass(frozen=True)
class ColorStandard:
    name: str
    yuv_to_rgb: np.ndarray  # exact, rows R G B
    bias: tuple[int, int, int]  # input_bias: Y, U, V offsets
    source: str  # who produces frames in this standard (written into the cfg)


STANDARDS = {
    s.name: s
    for s in (
        ColorStandard(
            "jpeg",
            _yuv_to_rgb(0.299, 0.114, 1.0, 1.0),
            (0, 128, 128),
            "full-range BT.601 (JFIF), e.g. DVPP's JPEG decoder (JPEGD) output",
        ),
        ColorStandard(
            "bt601-narrow",
            _yuv_to_rgb(0.299, 0.114, 255 / 219, 255 / 224),
            (16, 128, 128),
            "narrow-range BT.601 (Y 16-235), e.g. SD camera or video decoder (VDEC) frames",
        ),
    )
}


def csc_matrix(standard: str, color: str) -> np.ndarray:
    """The integer YUV -> RGB (or BGR) matrix AIPP takes: ``round(256 * exact)``, rows in the
    model's channel order (the ATC documentation's tables for JPEG and BT-601NARROW)."""
    m = np.rint(256 * STANDARDS[standard].yuv_to_rgb).astype(int)
    return m[::-1] if color == "bgr" else m


def rgb_to_yuv420sp(rgb: np.ndarray, standard: str) -> np.ndarray:
    """Encode an H x W x 3 uint8 RGB image as NV12 bytes ((H*3/2) x W uint8) in ``standard``:
    the exact inverse of its YUV -> RGB matrix, rounded; chroma averaged over 2x2 blocks."""
    std = STANDARDS[standard]
    h, w, _ = rgb.shape
    if h % 2 or w % 2:
        raise ValueError(f"YUV420SP needs an even width and height, got {w}x{h}")
    yuv = rgb.astype(np.float64) @ np.linalg.inv(std.yuv_to_rgb).T + np.array(std.bias)
    yuv = np.clip(np.rint(yuv), 0, 255)
    chroma = yuv[:, :, 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))
    out = np.empty((h * 3 // 2, w), np.uint8)
    out[:h] = yuv[:, :, 0]
    out[h:] = np.clip(np.rint(chroma), 0, 255).reshape(h // 2, w)
    return out


def yuv420sp_planes(nv12: np.ndarray, height: int) -> np.ndarray:
    """NV12 bytes -> H x W x 3 (Y, U, V) integers, each UV pair repeated over its 2x2 block."""
    y = nv12[:height].astype(np.int64)
    uv = nv12[height:].astype(np.int64).reshape(height // 2, -1, 2)
    uv = uv.repeat(2, axis=0).repeat(2, axis=1)
    return np.concatenate([y[:, :, None], uv], axis=2)


def yuv420sp_to_rgb(nv12: np.ndarray, height: int, standard: str) -> np.ndarray:
    """The RGB (float, 0..255) an NV12 frame represents: the exact matrix, clipped to 0..255."""
    std = STANDARDS[standard]
    yuv = yuv420sp_planes(nv12, height).astype(np.float64) - np.array(std.bias)
    return np.clip(yuv @ std.yuv_to_rgb.T, 0, 255)


# --- the config file ----------------------------------------------------------------------------


@dataclass
class AippConfig:
    input_format: str = "RGB888_U8"
    src_image_size_w: int = 0
    src_image_size_h: int = 0
    crop: bool = False
    load_start_pos_w: int = 0
    load_start_pos_h: int = 0
    crop_size_w: int = 0
    crop_size_h: int = 0
    padding: bool = False
    left_padding_size: int = 0
    right_padding_size: int = 0
    top_padding_size: int = 0
    bottom_padding_size: int = 0
    padding_value: float = 0.0
    csc_switch: bool = False
    rbuv_swap_switch: bool = False
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((3, 3), int))
    input_bias: list[int] = field(default_factory=lambda: [0, 0, 0])
    output_bias: list[int] = field(default_factory=lambda: [0, 0, 0])
    mean_chn: list[int] = field(default_factory=lambda: [0, 0, 0])
    min_chn: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    var_reci_chn: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])


def parse_cfg(text: str) -> AippConfig:
    """Read one ``aipp_op { key: value ... }`` block (``#`` starts a comment)."""
    cfg = AippConfig()
    body = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    body = [line for line in body if line and line not in ("aipp_op {", "aipp_op{", "}")]
    for line in body:
        key, sep, value = (s.strip() for s in line.partition(":"))
        if not sep:
            raise ValueError(f"aipp.cfg: cannot read {line!r}")
        if key.startswith("matrix_r"):
            cfg.matrix[int(key[8]), int(key[10])] = int(value)
        elif key[:-2] in ("input_bias", "output_bias", "mean_chn", "min_chn", "var_reci_chn"):
            index = int(key[-1])
            if index < 3:  # channel 3 is the alpha of XRGB formats
                kind = float if key.startswith(("min", "var")) else int
                getattr(cfg, key[:-2])[index] = kind(value)
        elif key in ("aipp_mode", "related_input_rank"):
            continue
        elif hasattr(cfg, key):
            current = getattr(cfg, key)
            parsed = value == "true" if isinstance(current, bool) else type(current)(value)
            setattr(cfg, key, parsed)
        else:
            raise ValueError(f"aipp.cfg: unknown parameter {key!r}")
    return cfg


# --- AIPP ---------------------------------------------------------------------------------------


def run(cfg: AippConfig, source: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """What AIPP feeds the model for one image: H x W x 3 float16 (NHWC, one batch item).

    ``source``: RGB888_U8 as H x W x 3 uint8; YUV420SP_U8 as (H*3/2) x W uint8 (NV12)."""
    if cfg.input_format == "RGB888_U8":
        pixels = source.astype(np.int64)
    elif cfg.input_format == "YUV420SP_U8":
        pixels = yuv420sp_planes(source, source.shape[0] * 2 // 3)
    else:
        raise ValueError(f"input_format {cfg.input_format} is not modelled (RGB888_U8, YUV420SP_U8 are)")
    if (cfg.src_image_size_h, cfg.src_image_size_w) not in ((0, 0), pixels.shape[:2]):
        raise ValueError(
            f"the image is {pixels.shape[1]}x{pixels.shape[0]}, aipp.cfg expects "
            f"{cfg.src_image_size_w}x{cfg.src_image_size_h} (src_image_size_w x _h)"
        )
    if cfg.rbuv_swap_switch:
        pixels = pixels[:, :, [2, 1, 0]] if cfg.input_format == "RGB888_U8" else pixels[:, :, [0, 2, 1]]
    if cfg.crop:
        pad_h = cfg.top_padding_size + cfg.bottom_padding_size if cfg.padding else 0
        pad_w = cfg.left_padding_size + cfg.right_padding_size if cfg.padding else 0
        h, w = cfg.crop_size_h or out_hw[0] - pad_h, cfg.crop_size_w or out_hw[1] - pad_w
        y0, x0 = cfg.load_start_pos_h, cfg.load_start_pos_w
        if y0 + h > pixels.shape[0] or x0 + w > pixels.shape[1]:
            raise ValueError(
                f"crop window {w}x{h} at ({x0}, {y0}) leaves the {pixels.shape[1]}x{pixels.shape[0]} image"
            )
        pixels = pixels[y0 : y0 + h, x0 : x0 + w]
    if cfg.csc_switch:
        if cfg.input_format == "YUV420SP_U8":
            pixels = ((pixels - np.array(cfg.input_bias)) @ cfg.matrix.T) >> 8
        else:
            pixels = ((pixels @ cfg.matrix.T) >> 8) + np.array(cfg.output_bias)
        pixels = np.clip(pixels, 0, 255)
    f16 = np.float16
    x = pixels.astype(f16) - np.array(cfg.mean_chn, f16)
    x = (x - np.array(cfg.min_chn, np.float64).astype(f16)) * np.array(cfg.var_reci_chn, np.float64).astype(f16)
    if cfg.padding:
        rows, cols = (cfg.top_padding_size, cfg.bottom_padding_size), (cfg.left_padding_size, cfg.right_padding_size)
        x = np.pad(x, (rows, cols, (0, 0)), constant_values=cfg.padding_value)
    if x.shape[:2] != tuple(out_hw):
        raise ValueError(f"AIPP produces {x.shape[1]}x{x.shape[0]}, the model takes {out_hw[1]}x{out_hw[0]}")
    return x


def recipe_preprocess(rgb: np.ndarray, pre: dict) -> np.ndarray:
    """The recipe's preprocessing after the resize, exactly (float64): ``(pixel * scale - mean) / std``
    per channel, channels reversed for a "bgr" model; H x W x 3, like ``infer.py``'s."""
    x = np.asarray(rgb, np.float64)
    if pre["color"] == "bgr":
        x = x[:, :, ::-1]
    return (x * pre["scale"] - np.array(pre["mean"])) / np.array(pre["std"])


# --- the bound ----------------------------------------------------------------------------------


def fp16_bound(pre: dict) -> np.ndarray:
    """Per channel: the largest |AIPP - exact| that fp16 parameters and arithmetic explain (see
    the module docstring), from the recipe's values only."""
    u, tiny = U16, 2.0**-25  # relative rounding of a normal fp16, half the subnormal spacing
    m = np.abs(np.array(pre["mean"]) / pre["scale"])
    v = np.abs(pre["scale"] / np.array(pre["std"]))
    e_m, e_v = 0.5 * 10.0**-MIN_DECIMALS, 0.5 * 10.0**-VAR_DECIMALS
    d_m = u * (m + e_m) + tiny + e_m  # |fp16(min_chn) - m|
    d_v = u * (v + e_v) + tiny + e_v  # |fp16(var_reci_chn) - v|
    d = np.maximum(m, np.abs(255 - np.array(pre["mean"]) / pre["scale"]))  # largest |pixel - m|
    t = d + d_m  # largest |pixel - mean_chn - fp16(min_chn)|
    return (u * t + tiny + d_m) * (v + d_v) + d * d_v + u * ((1 + u) * t + tiny) * (v + d_v) + tiny


def csc_bound_levels(standard: str) -> float:
    """Pixel levels the integer CSC may add: 1 for the truncating shift, plus 1/512 per coefficient
    times the largest |component - bias| it multiplies, on the worst output row."""
    bias = np.array(STANDARDS[standard].bias)
    ranges = np.maximum(bias, 255 - bias)
    return 1.0 + float(ranges.sum()) / 512


def bound(pre: dict, standard: str | None = None) -> float:
    """The check's limit in model-input units, worst channel."""
    per_channel = fp16_bound(pre)
    if standard is not None:
        per_channel = per_channel + csc_bound_levels(standard) * np.abs(pre["scale"] / np.array(pre["std"]))
    return float(per_channel.max())


# --- the check ----------------------------------------------------------------------------------


def check_images(size_hw: tuple[int, int]) -> dict[str, np.ndarray]:
    """H x W x 3 uint8 RGB test images at the model's size: every level 0..255 in every channel
    (``levels``), and scikit-image's bundled photos resized like ``infer.py`` (Pillow BILINEAR)."""
    from PIL import Image

    h, w = size_hw
    n = -(-256 // (h * w)) if h * w < 256 else 1
    ramp = np.arange(h * w * n) % 256
    images = {}
    for k in range(n):
        flat = ramp[k * h * w : (k + 1) * h * w]
        rgb = np.stack([flat, (flat + 85) % 256, 255 - flat], -1)  # each channel runs through 0..255
        images[f"levels{k or ''}"] = rgb.reshape(h, w, 3).astype(np.uint8)
    try:
        from skimage import data
    except ImportError:
        return images
    for name in PHOTOS:
        img = Image.fromarray(getattr(data, name)())
        images[name] = np.asarray(img.resize((w, h), Image.BILINEAR) if img.size != (w, h) else img)
    return images


def check_config(text: str, pre: dict, size_hw: tuple[int, int], standard: str | None = None, images=None) -> dict:
    """Run one shipped config on the check images; the max |AIPP - recipe| per image (model-input
    units) and the bound. ``standard``: the YUV standard a YUV420SP_U8 config is meant for."""
    cfg = parse_cfg(text)
    images = check_images(size_hw) if images is None else images
    limit = bound(pre, standard if cfg.input_format == "YUV420SP_U8" else None)
    errors = {}
    for name, rgb in images.items():
        if cfg.input_format == "YUV420SP_U8":
            source = rgb_to_yuv420sp(rgb, standard)
            want = recipe_preprocess(yuv420sp_to_rgb(source, rgb.shape[0], standard), pre)
        else:
            source, want = rgb, recipe_preprocess(rgb, pre)
        got = run(cfg, source, size_hw).astype(np.float64)
        errors[name] = float(np.abs(got - want).max())
    worst = max(errors, key=errors.get)
    return {
        "input_format": cfg.input_format,
        "standard": standard if cfg.input_format == "YUV420SP_U8" else None,
        "max_error": {k: _sig(v) for k, v in errors.items()},
        "bound": _sig(limit),
        "worst": worst,
        "passed": errors[worst] <= limit,
    }


def check_bundle(configs: dict[str, tuple[str, str | None]], pre: dict, size_hw: tuple[int, int]) -> dict:
    """Check every shipped config (file name -> (text, YUV standard or None)); raise CheckFailed
    naming the file and image when one leaves its bound. Returns the figures for the manifest."""
    images = check_images(size_hw)
    results = {name: check_config(text, pre, size_hw, std, images) for name, (text, std) in configs.items()}
    bad = [
        f"{name}: max error {r['max_error'][r['worst']]:.3g} on {r['worst']!r} > {r['bound']:.3g} "
        f"(what fp16{' and the integer CSC' if r['standard'] else ''} explain)"
        for name, r in results.items()
        if not r["passed"]
    ]
    if bad:
        raise CheckFailed(
            "AIPP would not compute the recipe's preprocessing: " + "; ".join(bad),
            hint="the generated aipp.cfg disagrees with the recipe's preprocess (channel order, mean, std or scale)",
        )
    return {
        "method": "numpy model of AIPP's documented arithmetic (fp16 normalisation), vs the recipe's preprocessing "
        "in float64 after the same resize; error in model-input units",
        "images": list(images),
        "configs": results,
    }


def _sig(v: float, digits: int = 3) -> float:
    return float(f"{v:.{digits}g}") if math.isfinite(v) else v
