"""Photos as sample inputs: ``inputs[].data`` entries that are images (or ``skimage:<name>``) become the
tensor the bundle's ``infer.py`` would feed the model for that photo.

Detection recipes (``postprocess.format: yolo``) letterbox like Ultralytics (``yolo.letterbox``: aspect
kept, grey 114 padding); other recipes resize with Pillow's BILINEAR, as ``infer.py`` does. Then
``x = (pixel * scale - mean) / std`` per channel (reversed to BGR for ``color: bgr``), NCHW; letterboxed
inputs compute ``pixel / (1 / scale)`` as Ultralytics does (``/ 255``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torch2ms.errors import RecipeError


def load_rgb(path: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except OSError as err:
        raise RecipeError(f"{path}: cannot read it as an image ({err})") from None


def image_sample(path: Path, shape: tuple[int, ...], recipe, where: str) -> np.ndarray:
    if len(shape) != 4 or shape[0] != 1 or shape[1] != 3:
        raise RecipeError(f"{where}: {path} is an image, but the input's shape {list(shape)} is not [1, 3, H, W]")
    rgb = load_rgb(path)
    size = (shape[2], shape[3])
    letterboxed = recipe.postprocess is not None and recipe.postprocess.format == "yolo"
    if letterboxed:
        from torch2ms.postprocess.yolo import letterbox

        pixels = letterbox(rgb, size)[0]
    else:
        from PIL import Image

        img = Image.fromarray(rgb)
        pixels = np.asarray(img if img.size == size[::-1] else img.resize(size[::-1], Image.BILINEAR))
    pre = recipe.preprocess
    x = pixels.astype(np.float32)
    if pre.color == "bgr":
        x = x[:, :, ::-1]
    # letterboxed inputs divide like Ultralytics (pixel / 255), which differs from pixel * (1/255) by an ulp
    x = x / np.float32(1 / pre.scale) if letterboxed else x * np.float32(pre.scale)
    x = (x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)
