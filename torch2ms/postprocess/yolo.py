"""YOLO (Ultralytics anchor-free heads v8/v9/11/12) on the host, in numpy: letterbox in, detections out.

The exported model ends at the raw head ``[batch, 4 + nc + extra, anchors]``: boxes as centre
x, y, width, height in input pixels, class probabilities (sigmoid applied), then the extra
channels of the task (32 mask coefficients for -seg, ``K x 3`` keypoints for -pose, the angle
for -obb). NMS stays off the NPU (ATC cannot compile torchvision's NonMaxSuppression, and its
output shape depends on the data): this module does it, exactly as Ultralytics'
``non_max_suppression`` with torchvision's ``nms`` does:

* candidates: best class score ``> conf`` (float32 comparison, as torch does with a Python scalar);
* boxes xywh -> xyxy (``x -+ w / 2`` in float32);
* class-wise NMS by the coordinate trick: boxes shifted by ``class * max_wh`` (7680) in float32,
  then one greedy NMS (torchvision's: stable descending sort by score, suppress when
  ``inter / (area_i + area_j - inter) > iou``, IoU in float32 compared with the double threshold);
  ``agnostic`` shifts nothing;
* keep the first ``max_det``.

Rotated boxes (-obb) use Ultralytics' fast NMS (upper-triangular probiou matrix, a box is dropped
when any higher-scored box overlaps it more than ``iou``, suppressed or not). Masks follow
``ops.process_mask(upsample=True)``: coefficients @ prototypes, bilinear upsampling to the input
size (align_corners=False), ``> 0``, zeroed outside the box. Keypoints and boxes are mapped back
to the original image like ``ops.scale_coords`` / ``ops.scale_boxes``.

The letterbox is Ultralytics' ``LetterBox(auto=False)``: scale ``r = min(H / h, W / w)``, each side
``max(round(side * r), 1)``, OpenCV ``INTER_LINEAR`` resize, grey 114 padding split
``round(d / 2 - 0.1)`` before and ``round(d / 2 + 0.1)`` after. With OpenCV installed it calls
the same ``cv2.resize``; without, a numpy copy of OpenCV's 11-bit fixed-point bilinear.
"""

from __future__ import annotations

import math

import numpy as np

MAX_WH = 7680  # Ultralytics' per-class coordinate offset
MAX_NMS = 30000  # candidates kept before NMS
PAD_VALUE = 114


# ---------------------------------------------------------------- letterbox (preprocessing)


def letterbox_geometry(shape_hw: tuple[int, int], size_hw: tuple[int, int]) -> dict:
    """Ultralytics LetterBox(new_shape=size_hw, auto=False, scaleup=True, center=True) parameters."""
    h0, w0 = shape_hw
    r = min(size_hw[0] / h0, size_hw[1] / w0)
    new_w, new_h = max(round(w0 * r), 1), max(round(h0 * r), 1)
    dw, dh = (size_hw[1] - new_w) / 2, (size_hw[0] - new_h) / 2
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    return {"new_hw": (new_h, new_w), "top": top, "bottom": bottom, "left": left, "right": right}


def letterbox(image: np.ndarray, size_hw: tuple[int, int], pad_value: int = PAD_VALUE, use_cv2: bool = True):
    """HWC uint8 image -> (letterboxed HWC uint8 of size_hw, geometry)."""
    g = letterbox_geometry(image.shape[:2], size_hw)
    new_h, new_w = g["new_hw"]
    if image.shape[:2] != (new_h, new_w):
        image = resize_linear(image, new_h, new_w, use_cv2=use_cv2)
    out = np.full((new_h + g["top"] + g["bottom"], new_w + g["left"] + g["right"], image.shape[2]), pad_value, np.uint8)
    out[g["top"] : g["top"] + new_h, g["left"] : g["left"] + new_w] = image
    return out, g


def resize_linear(image: np.ndarray, new_h: int, new_w: int, use_cv2: bool = True) -> np.ndarray:
    """``cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)`` for HWC uint8."""
    if use_cv2:
        try:
            import cv2
        except ImportError:
            cv2 = None
        if cv2 is not None:
            out = cv2.resize(np.ascontiguousarray(image), (new_w, new_h), interpolation=cv2.INTER_LINEAR)
            return out if out.ndim == 3 else out[..., None]
    rows, ry = _linear_taps(image.shape[0], new_h)
    cols, rx = _linear_taps(image.shape[1], new_w)
    src = image.astype(np.int32)
    horiz = src[:, cols[:, 0]] * rx[None, :, 0, None] + src[:, cols[:, 1]] * rx[None, :, 1, None]
    s0, s1 = horiz[rows[:, 0]], horiz[rows[:, 1]]
    b0, b1 = ry[:, 0, None, None], ry[:, 1, None, None]
    # OpenCV's vectorised vertical pass (VResizeLinearVec_32s8u): 16-bit high products, then round
    out = ((((s0 >> 4) * b0) >> 16) + (((s1 >> 4) * b1) >> 16) + 2) >> 2
    return np.clip(out, 0, 255).astype(np.uint8)


def _linear_taps(n_in: int, n_out: int):
    """OpenCV INTER_LINEAR source indices and 11-bit weights for one axis."""
    scale = 1.0 / (n_out / n_in)
    f = ((np.arange(n_out) + 0.5) * scale - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s.astype(np.float32)).astype(np.float32)
    low = s < 0
    f[low], s[low] = 0, 0
    high = s >= n_in - 1
    f[high], s[high] = 0, n_in - 1
    w1 = np.rint(f * np.float32(2048)).astype(np.int32)
    w0 = np.rint((np.float32(1) - f) * np.float32(2048)).astype(np.int32)
    return np.stack([s, np.minimum(s + 1, n_in - 1)], 1), np.stack([w0, w1], 1)


# ---------------------------------------------------------------- NMS


def xywh2xyxy(x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    wh = x[..., 2:] / 2
    y[..., :2] = x[..., :2] - wh
    y[..., 2:] = x[..., :2] + wh
    return y


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """torchvision.ops.nms: indices kept, by decreasing score (ties: lower index first)."""
    boxes = np.asarray(boxes, np.float32)
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-np.asarray(scores, np.float32), kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        w = np.maximum(np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            ovr = inter / (areas[i] + areas[rest] - inter)
        order = rest[~(ovr.astype(np.float64) > iou)]  # NaN (empty boxes) suppresses nothing, as in torchvision
    return np.asarray(keep, np.int64)


def batch_probiou(obb1: np.ndarray, obb2: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Ultralytics' probabilistic IoU of rotated boxes (x, y, w, h, angle), pairwise [len(obb1), len(obb2)]."""
    x1, y1 = obb1[:, 0:1], obb1[:, 1:2]
    x2, y2 = obb2[None, :, 0], obb2[None, :, 1]
    a1, b1, c1 = _covariance(obb1)
    a2, b2, c2 = (v[:, 0][None] for v in _covariance(obb2))
    eps = np.float32(eps)
    den = (a1 + a2) * (b1 + b2) - (c1 + c2) ** 2 + eps
    t1 = (((a1 + a2) * (y1 - y2) ** 2 + (b1 + b2) * (x1 - x2) ** 2) / den) * np.float32(0.25)
    t2 = (((c1 + c2) * (x2 - x1) * (y1 - y2)) / den) * np.float32(0.5)
    det = np.clip(a1 * b1 - c1**2, 0, None) * np.clip(a2 * b2 - c2**2, 0, None)
    t3 = np.log(((a1 + a2) * (b1 + b2) - (c1 + c2) ** 2) / (np.float32(4) * np.sqrt(det) + eps) + eps) * np.float32(0.5)
    bd = np.clip(t1 + t2 + t3, eps, np.float32(100.0))
    hd = np.sqrt(np.float32(1.0) - np.exp(-bd) + eps)
    return np.float32(1) - hd


def _covariance(boxes: np.ndarray):
    a = boxes[:, 2:3] ** 2 / np.float32(12)
    b = boxes[:, 3:4] ** 2 / np.float32(12)
    c = boxes[:, 4:5]
    cos, sin = np.cos(c), np.sin(c)
    cos2, sin2 = cos**2, sin**2
    return a * cos2 + b * sin2, a * sin2 + b * cos2, (a - b) * cos * sin


def fast_nms_rotated(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Ultralytics TorchNMS.fast_nms with probiou: indices kept, by decreasing score."""
    if not len(boxes):
        return np.zeros(0, np.int64)
    order = np.argsort(-scores, kind="stable")
    ious = np.triu(batch_probiou(boxes[order], boxes[order]), k=1)
    return order[(ious > np.float32(iou)).sum(0) <= 0]


def non_max_suppression(
    prediction: np.ndarray,
    conf: float = 0.25,
    iou: float = 0.7,
    agnostic: bool = False,
    max_det: int = 300,
    nc: int = 0,
    rotated: bool = False,
    max_wh: float = MAX_WH,
    max_nms: int = MAX_NMS,
) -> list[np.ndarray]:
    """Ultralytics ``non_max_suppression`` on a raw head ``[batch, 4 + nc + extra, anchors]``.

    Returns, per image, ``[n, 6 + extra]`` rows (x1, y1, x2, y2, score, class, extra...) by decreasing
    score; with ``rotated`` the box stays (x, y, w, h) and the angle is the last column.
    ``max_wh=None`` runs NMS per class separately instead of the coordinate trick.
    """
    prediction = np.asarray(prediction, np.float32)
    nc = nc or prediction.shape[1] - 4
    mi = 4 + nc
    out = []
    for x in prediction.transpose(0, 2, 1):
        x = x[x[:, 4:mi].max(1) > np.float32(conf)]
        if not rotated:
            x = np.concatenate([xywh2xyxy(x[:, :4]), x[:, 4:]], 1)
        cls = x[:, 4:mi]
        j = cls.argmax(1) if len(x) else np.zeros(0, np.int64)
        score = cls[np.arange(len(x)), j]
        x = np.concatenate([x[:, :4], score[:, None], j[:, None].astype(np.float32), x[:, mi:]], 1)
        x = x[score > np.float32(conf)]
        if len(x) > max_nms:
            x = x[np.argsort(-x[:, 4], kind="stable")[:max_nms]]
        if not len(x):
            out.append(x)
            continue
        scores = x[:, 4]
        if max_wh is None and not agnostic:
            keep = _nms_per_class(x, scores, iou, rotated)
        else:
            c = x[:, 5:6] * np.float32(0 if agnostic else max_wh)
            if rotated:
                keep = fast_nms_rotated(np.concatenate([x[:, :2] + c, x[:, 2:4], x[:, -1:]], 1), scores, iou)
            else:
                keep = nms(x[:, :4] + c, scores, iou)
        out.append(x[keep[:max_det]])
    return out


def _nms_per_class(x, scores, iou, rotated):
    keep = []
    for k in np.unique(x[:, 5]):
        idx = np.flatnonzero(x[:, 5] == k)
        boxes = np.concatenate([x[idx, :4], x[idx, -1:]], 1) if rotated else x[idx, :4]
        keep.append(idx[(fast_nms_rotated if rotated else nms)(boxes, scores[idx], iou)])
    keep = np.concatenate(keep)
    return keep[np.argsort(-scores[keep], kind="stable")]


# ---------------------------------------------------------------- masks, keypoints, rotated boxes


def interpolate_bilinear(x: np.ndarray, size_hw: tuple[int, int], chunk: int = 16) -> np.ndarray:
    """torch.nn.functional.interpolate(x[None], size, mode='bilinear', align_corners=False)[0] for [N, H, W]
    float32, with torch's order of operations: rows first, ``(a * w0 + b * w1) * h0 + (c * w0 + d * w1) * h1``."""
    x = np.asarray(x, np.float32)
    h0, h1, lh0, lh1 = _bilinear_taps(x.shape[1], size_hw[0])
    w0, w1, lw0, lw1 = _bilinear_taps(x.shape[2], size_hw[1])
    lh0, lh1 = lh0[None, :, None], lh1[None, :, None]
    out = np.empty((len(x), *size_hw), np.float32)
    for s in range(0, len(x), chunk):
        across = x[s : s + chunk, :, w0] * lw0 + x[s : s + chunk, :, w1] * lw1  # each input row, at output columns
        out[s : s + chunk] = across[:, h0] * lh0 + across[:, h1] * lh1
    return out


def _bilinear_taps(n_in: int, n_out: int):
    # torch's CPU kernel computes scale * (dst + 0.5) - 0.5 as one fused multiply-add: exact in float64, one rounding
    scale = np.float64(np.float32(n_in / n_out))
    src = (scale * (np.arange(n_out, dtype=np.float64) + 0.5) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    l1 = (src - i0.astype(np.float32)).astype(np.float32)
    return i0, i1, (np.float32(1) - l1).astype(np.float32), l1


def crop_mask(masks: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Zero every mask outside its box (x1, y1, x2, y2), like ops.crop_mask."""
    _, h, w = masks.shape
    x1, y1, x2, y2 = (boxes[:, k, None, None].astype(np.float32) for k in range(4))
    r = np.arange(w, dtype=np.float32)[None, None, :]
    c = np.arange(h, dtype=np.float32)[None, :, None]
    return masks * ((r >= x1) & (r < x2)) * ((c >= y1) & (c < y2))


def process_mask(protos: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray, shape_hw: tuple[int, int]):
    """ops.process_mask(upsample=True): [n, H, W] uint8 masks at the input size."""
    c, mh, mw = protos.shape
    if not len(coefficients):
        return np.zeros((0, *shape_hw), np.uint8)
    logits = (coefficients.astype(np.float32) @ protos.astype(np.float32).reshape(c, -1)).reshape(-1, mh, mw)
    masks = (interpolate_bilinear(logits, shape_hw) > 0).astype(np.uint8)
    return crop_mask(masks, boxes).astype(np.uint8)


def regularize_rboxes(rboxes: np.ndarray) -> np.ndarray:
    """ops.regularize_rboxes: angle in [0, pi/2), width and height swapped where needed."""
    x, y, w, h, t = rboxes.T
    swap = t % math.pi >= math.pi / 2
    return np.stack([x, y, np.where(swap, h, w), np.where(swap, w, h), t % (math.pi / 2)], -1)


# ---------------------------------------------------------------- back to the original image


def scale_boxes(boxes: np.ndarray, g: dict, shape_hw: tuple[int, int], xywh: bool = False) -> np.ndarray:
    """Letterboxed-input coordinates -> original image pixels (ops.scale_boxes), clipped unless xywh."""
    boxes = boxes.astype(np.float32).copy()
    gain_y, gain_x = g["new_hw"][0] / shape_hw[0], g["new_hw"][1] / shape_hw[1]
    boxes[:, 0] -= g["left"]
    boxes[:, 1] -= g["top"]
    if not xywh:
        boxes[:, 2] -= g["left"]
        boxes[:, 3] -= g["top"]
    boxes[:, [0, 2]] /= gain_x
    boxes[:, [1, 3]] /= gain_y
    if not xywh:
        boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, shape_hw[1])
        boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, shape_hw[0])
    return boxes


def scale_coords(coords: np.ndarray, g: dict, shape_hw: tuple[int, int]) -> np.ndarray:
    """Keypoint x, y -> original image pixels (ops.scale_coords), clipped."""
    coords = coords.astype(np.float32).copy()
    gain_y, gain_x = g["new_hw"][0] / shape_hw[0], g["new_hw"][1] / shape_hw[1]
    coords[..., 0] = ((coords[..., 0] - g["left"]) / gain_x).clip(0, shape_hw[1])
    coords[..., 1] = ((coords[..., 1] - g["top"]) / gain_y).clip(0, shape_hw[0])
    return coords


def scale_masks(masks: np.ndarray, g: dict, shape_hw: tuple[int, int]) -> np.ndarray:
    """[n, H, W] input-size masks -> [n, h, w] bool masks on the original image (crop the padding, resize)."""
    new_h, new_w = g["new_hw"]
    inner = masks[:, g["top"] : g["top"] + new_h, g["left"] : g["left"] + new_w].astype(np.float32)
    return interpolate_bilinear(inner, shape_hw) > 0.5


# ---------------------------------------------------------------- comparing two runs of one model

BOX_IOU = 0.99
MASK_IOU = 0.99
KEYPOINT_PX = 1.0
VISIBILITY = 0.01
MIN_BOXES = 10


def choose_conf(head: np.ndarray, params: dict) -> tuple[float, int, float]:
    """(conf, detections kept at it, relative score gap there) for one image's head: greedy NMS keeps at ``c``
    exactly the detections it keeps at 0 that score above ``c``; of their sorted scores ``s_1 >= s_2 >= ...``,
    take the ``k`` in [MIN_BOXES, max_det] with the widest relative gap, ``conf = (s_k + s_k+1) / 2``."""
    every = non_max_suppression(
        head,
        conf=0.0,
        iou=params["iou"],
        agnostic=params["agnostic"],
        max_det=head.shape[-1],
        nc=params["nc"],
        rotated=params["kind"] == "obb",
    )[0]
    s = every[:, 4].astype(np.float64)
    if len(s) <= MIN_BOXES:
        return float(s[-1] / 2) if len(s) else 0.0, len(s), 1.0
    ks = np.arange(MIN_BOXES, min(params["max_det"], len(s) - 1) + 1)
    gaps = (s[ks - 1] - s[ks]) / np.maximum(s[ks - 1], 1e-30)
    k = int(ks[np.argmax(gaps)])
    return float((s[k - 1] + s[k]) / 2), k, float(gaps.max())


def _iou(a: np.ndarray, b: np.ndarray, rotated: bool) -> np.ndarray:
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    if rotated:
        return batch_probiou(a.astype(np.float32), b.astype(np.float32)).astype(np.float64)
    a, b = a.astype(np.float64), b.astype(np.float64)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:4], b[None, :, 2:4])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def match_detections(
    ref: dict, got: dict, kind: str
) -> tuple[list[tuple[int, int]], list[tuple[int, str]], list[int], dict]:
    """Greedy, in PyTorch's order: (matched pairs, PyTorch detections unmatched with why, extra stage detections,
    worst figures of the matched pairs)."""
    ious = _iou(ref["boxes"], got["boxes"], kind == "obb")
    free = np.ones(len(got["boxes"]), bool)
    pairs, missing = [], []
    worst = {"box_iou": 1.0}
    for i in range(len(ref["boxes"])):
        same = (got["classes"] == ref["classes"][i]) & free
        cand = np.where(same, ious[i], -1.0) if len(free) else np.zeros(0)
        j = int(np.argmax(cand)) if len(cand) else -1
        if j < 0 or cand[j] < BOX_IOU:
            best = float(ious[i].max()) if ious.shape[1] else 0.0
            missing.append(
                (i, f"best box IoU {best:.4f} with any class, {max(float(cand.max(initial=0)), 0):.4f} same class")
            )
            continue
        why = []
        if kind == "segment":
            # inside both boxes: each mask is cropped to its own box, so a box edge that moves across a
            # pixel row (the boxes are judged apart, above) would count that row against the mask
            both = np.concatenate(
                [
                    np.maximum(ref["boxes"][i, :2], got["boxes"][j, :2]),
                    np.minimum(ref["boxes"][i, 2:4], got["boxes"][j, 2:4]),
                ]
            )[None]
            m = _mask_iou(crop_mask(ref["masks"][i][None], both)[0], crop_mask(got["masks"][j][None], both)[0])
            worst["mask_iou"] = min(worst.get("mask_iou", 1.0), m)
            if m < MASK_IOU:
                why.append(f"mask IoU {m:.4f} < {MASK_IOU}")
        if kind == "pose":
            a, b = ref["keypoints"][i], got["keypoints"][j]
            dist = float(np.sqrt(((a[:, :2] - b[:, :2]) ** 2).sum(1)).max())
            worst["keypoint_px"] = max(worst.get("keypoint_px", 0.0), dist)
            vis = float(np.abs(a[:, 2] - b[:, 2]).max()) if a.shape[1] == 3 else 0.0
            worst["visibility"] = max(worst.get("visibility", 0.0), vis)
            if dist > KEYPOINT_PX:
                why.append(f"keypoints {dist:.3f} px apart > {KEYPOINT_PX}")
            if vis > VISIBILITY:
                why.append(f"keypoint visibility differs by {vis:.4f} > {VISIBILITY}")
        if why:
            missing.append((i, "; ".join(why)))
            continue
        free[j] = False
        worst["box_iou"] = min(worst["box_iou"], float(ious[i, j]))
        pairs.append((i, j))
    return pairs, missing, [int(j) for j in np.flatnonzero(free)], worst


# ---------------------------------------------------------------- all together


def detect(outputs: dict[str, np.ndarray], params: dict, conf: float | None = None) -> list[dict]:
    """Raw model outputs (one batch) -> per image: boxes (xyxy, or xywh + angle for obb), scores, classes,
    and masks / keypoints. ``params`` is the manifest's (or recipe's) postprocess section."""
    names = list(outputs)
    head = outputs[params.get("output") or names[0]]
    kind = params.get("kind", "detect")
    dets = non_max_suppression(
        head,
        conf=params["conf"] if conf is None else conf,
        iou=params["iou"],
        agnostic=params.get("agnostic", False),
        max_det=params["max_det"],
        nc=params["nc"],
        rotated=kind == "obb",
    )
    results = []
    for b, d in enumerate(dets):
        r = {"boxes": d[:, :4], "scores": d[:, 4], "classes": d[:, 5].astype(np.int64)}
        if kind == "segment":
            protos_name = (params.get("masks") or {}).get("prototypes") or names[1]
            protos = outputs[protos_name][b]
            r["masks"] = process_mask(protos, d[:, 6:], d[:, :4], _input_hw(params, protos))
        elif kind == "pose":
            k, dim = (params.get("keypoints") or {}).get("shape") or (17, 3)
            r["keypoints"] = d[:, 6:].reshape(len(d), k, dim)
        elif kind == "obb":
            r["boxes"] = np.concatenate([d[:, :4], d[:, -1:]], 1)
        results.append(r)
    return results


def _input_hw(params: dict, protos: np.ndarray) -> tuple[int, int]:
    hw = params.get("input_hw")
    return tuple(hw) if hw else (protos.shape[-2] * 4, protos.shape[-1] * 4)
