"""Ultralytics YOLO models (v8/v9/11/12 anchor-free heads) for the detection recipes.

Ultralytics is AGPL-3.0: it is imported here, by recipes and tests, never by torch2ms itself
or by a bundle. ``yolo(cfg)`` builds ``YOLO(cfg).model`` offline (``YOLO_OFFLINE=1``, no
weights are downloaded) with its head in export mode, so that the model returns what Ultralytics'
own ONNX export returns and what the numpy postprocess expects:

* detect / pose / obb: the raw head ``[1, 4 + nc + extra, anchors]`` (boxes xywh in input
  pixels, class probabilities after sigmoid, then keypoints or the angle), without NMS;
* segment: that head (32 mask coefficients as the extra channels) and the mask prototypes
  ``[1, 32, H/4, W/4]``.

Random weights with random BatchNorm statistics make activations grow layer after layer until
the head's outputs are meaningless. The BatchNorm statistics are therefore *calibrated*: seeded
affine parameters (so the checks exercise them), then one forward pass in training mode over
letterboxed photos that scikit-image ships (other photos than the recipes check on), with
``momentum=None`` so that the running statistics become the batch's, then eval mode; the last
class and box convolutions are rescaled so that scores spread over (0, 1) instead of saturating.
The outputs then stay in the range a trained model's do. Recipes using this set
``model.init: as_is`` so that torch2ms keeps these statistics.
"""

from __future__ import annotations

import os


def yolo(cfg: str = "yolov8n.yaml", imgsz: int = 640, seed: int = 0):
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    model = YOLO(cfg).model
    calibrate_norm(model, imgsz, seed=seed)
    model.model[-1].export = True  # return the decoded head (and prototypes), not the training dict
    return model.eval().requires_grad_(False)


def calibrate_norm(model, imgsz: int, seed: int = 0) -> int:
    """Seeded BatchNorm affine parameters, running statistics measured on photos, head rescaled."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    images = calibration_images(imgsz)
    with torch.no_grad():
        for m in norms:
            m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.copy_(torch.rand(m.num_features, generator=g) * 0.4 - 0.2)
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: one pass over the batch gives its statistics
        model.train()
        model(images)
        for m in norms:
            m.momentum = 0.03
        model.eval()
    scale_head(model, images)
    return len(norms)


CALIBRATION_PHOTOS = ("rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg", "ihc.png")


def calibration_images(size: int):
    """Photos shipped with scikit-image (not the ones the recipes check on), letterboxed like Ultralytics does
    (aspect kept, grey 114 padding), RGB / 255: the statistics the first layers see on real inputs."""
    from pathlib import Path

    import numpy as np
    import skimage
    import torch
    from PIL import Image

    out = []
    for name in CALIBRATION_PHOTOS:
        img = Image.open(Path(skimage.data.__file__).parent / name).convert("RGB")
        r = size / max(img.size)
        w, h = max(round(img.width * r), 1), max(round(img.height * r), 1)
        canvas = np.full((size, size, 3), 114, np.uint8)
        top, left = (size - h) // 2, (size - w) // 2
        canvas[top : top + h, left : left + w] = np.asarray(img.resize((w, h), Image.BILINEAR))
        out.append(torch.from_numpy(canvas).permute(2, 0, 1).float() / 255)
    return torch.stack(out)


def scale_head(model, images, cls_mean: float = -4.0, cls_std: float = 0.5, box_std: float = 1.5) -> None:
    """Rescale the last convolution of the class and box branches so that, on the calibration images, class
    logits have mean ``cls_mean`` and std ``cls_std`` (a few anchors above 0.25, as after training) and the DFL
    logits std ``box_std`` (box edges spread over the 16 bins instead of pinned to the last one)."""
    import torch

    head = model.model[-1]
    seen = {}
    hooks = [
        conv.register_forward_hook(lambda m, i, o, key=(kind, k): seen.__setitem__(key, o))
        for kind, branch in (("box", head.cv2), ("cls", head.cv3))
        for k, conv in enumerate(b[-1] for b in branch)
    ]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    for (kind, k), out in seen.items():
        conv = (head.cv2 if kind == "box" else head.cv3)[k][-1]
        mean, std = out.mean().item(), out.std().item()
        target_mean, target_std = (cls_mean, cls_std) if kind == "cls" else (0.0, box_std)
        with torch.no_grad():
            conv.weight.mul_(target_std / std)
            conv.bias.copy_((conv.bias - mean) * (target_std / std) + target_mean)
