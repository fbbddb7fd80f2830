"""The numpy YOLO postprocess (torch2ms.postprocess.yolo) against Ultralytics' and torchvision's own functions
on the same raw tensors: same boxes, classes and order, scores within 1e-6, same masks after thresholding,
same letterbox as ultralytics.data.augment.LetterBox on real photos."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("YOLO_OFFLINE", "1")
import torch
import torchvision
from ultralytics.utils import nms as ul_nms
from ultralytics.utils import ops as ul_ops

from torch2ms.postprocess import yolo  # noqa: E402

PHOTOS = ("astronaut", "coffee", "chelsea", "hubble_deep_field", "rocket")


def random_head(rng, nc=80, extra=0, anchors=2000, size=640, overlap=False, score_scale=1.0):
    """A raw head [1, 4 + nc + extra, anchors]: xywh boxes in pixels, class probabilities, extra channels."""
    if overlap:  # many boxes around a few centres: NMS has real work to do
        centres = rng.uniform(100, size - 100, (8, 2))
        xy = centres[rng.integers(0, 8, anchors)] + rng.normal(0, 6, (anchors, 2))
        wh = rng.uniform(60, 120, (anchors, 2))
    else:
        xy = rng.uniform(0, size, (anchors, 2))
        wh = rng.uniform(4, 200, (anchors, 2))
    cls = rng.uniform(0, 1, (anchors, nc)) ** 6 * score_scale
    ext = rng.normal(0, 2, (anchors, extra))
    return np.concatenate([xy, wh, cls, ext], 1).T[None].astype(np.float32)


def ultralytics_nms(head, conf=0.25, iou=0.7, **kw):
    return [d.numpy() for d in ul_nms.non_max_suppression(torch.from_numpy(head.copy()), conf, iou, **kw)]


def assert_same_detections(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_array_equal(a[:, 5], b[:, 5])  # classes, in order
        np.testing.assert_array_equal(a[:, :4], b[:, :4])  # boxes
        np.testing.assert_allclose(a[:, 4], b[:, 4], rtol=0, atol=1e-6)  # scores
        np.testing.assert_array_equal(a[:, 6:], b[:, 6:])  # extra channels follow their box


@pytest.mark.parametrize("iou", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("overlap", [False, True])
def test_nms_is_torchvision_nms(iou, overlap):
    rng = np.random.default_rng(int(iou * 10) + overlap)
    head = random_head(rng, nc=1, anchors=1500, overlap=overlap)[0].T
    boxes, scores = yolo.xywh2xyxy(head[:, :4]), head[:, 4]
    scores[rng.integers(0, len(scores), 200)] = 0.5  # ties: torchvision keeps the lower index first
    want = torchvision.ops.nms(torch.from_numpy(boxes), torch.from_numpy(scores), iou).numpy()
    np.testing.assert_array_equal(yolo.nms(boxes, scores, iou), want)
    assert len(want) < len(boxes) or not overlap


@pytest.mark.parametrize(
    "case, kw",
    [
        ("random", dict(conf=0.25, iou=0.7)),
        ("overlapping", dict(conf=0.05, iou=0.45)),
        ("overlapping agnostic", dict(conf=0.05, iou=0.45, agnostic=True)),
        ("max_det truncation", dict(conf=0.01, iou=0.7, max_det=17)),
        ("empty", dict(conf=0.6, iou=0.7)),
        ("low conf", dict(conf=0.001, iou=0.6)),
    ],
)
def test_detect_matches_ultralytics(case, kw):
    rng = np.random.default_rng(len(case))
    head = random_head(rng, overlap="overlap" in case, anchors=3000, score_scale=0.5 if case == "empty" else 1.0)
    want = ultralytics_nms(head, **kw)
    ours = yolo.non_max_suppression(head, **kw)
    assert_same_detections(ours, want)
    if case == "empty":
        assert len(ours[0]) == 0
    elif case == "max_det truncation":
        assert len(ours[0]) == kw["max_det"]
    else:
        assert len(ours[0]) > 5


def test_batch_of_heads():
    rng = np.random.default_rng(3)
    head = np.concatenate([random_head(rng, overlap=True), random_head(rng)], 0)
    assert_same_detections(yolo.non_max_suppression(head, conf=0.1), ultralytics_nms(head, conf=0.1))


def test_class_wise_nms_matches_torchvision_batched_nms():
    """Per-class NMS (max_wh=None) against torchvision.ops.batched_nms, whose vanilla per-class loop runs above
    1000 boxes on CPU; and the coordinate trick against batched_nms's own trick (offset max + 1) below that."""
    rng = np.random.default_rng(7)
    for anchors, max_wh in ((3000, None), (800, "max+1")):
        head = random_head(rng, nc=5, anchors=anchors, overlap=True)
        x = head[0].T
        boxes, scores, classes = yolo.xywh2xyxy(x[:, :4]), x[:, 4:].max(1), x[:, 4:].argmax(1)
        offset = None if max_wh is None else boxes.max() + np.float32(1)
        ours = yolo.non_max_suppression(head, conf=0.0, iou=0.5, max_det=10**6, max_wh=offset)[0]
        keep = torchvision.ops.batched_nms(
            torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(classes), 0.5
        ).numpy()
        np.testing.assert_array_equal(ours[:, :4], boxes[keep])
        np.testing.assert_array_equal(ours[:, 5], classes[keep])
        assert len(keep) < anchors


def test_segment_masks_match_ultralytics_process_mask():
    """Coefficients and prototypes on a 1/16 grid make every product and sum exact in float32, so any
    difference in the maths (upsampling taps, threshold, crop) shows as a differing pixel."""
    rng = np.random.default_rng(11)
    head = random_head(rng, nc=80, extra=32, anchors=600, overlap=True)
    head[0, 84:] = np.round(head[0, 84:] * 4) / 16
    protos = (rng.integers(-16, 17, (32, 160, 160)) / 16).astype(np.float32)
    want = ultralytics_nms(head, conf=0.3, iou=0.5, nc=80, max_det=40)[0]
    ours = yolo.non_max_suppression(head, conf=0.3, iou=0.5, nc=80, max_det=40)[0]
    assert_same_detections([ours], [want])
    ref = ul_ops.process_mask(
        torch.from_numpy(protos),
        torch.from_numpy(want[:, 6:]),
        torch.from_numpy(want[:, :4]),
        (640, 640),
        upsample=True,
    ).numpy()
    masks = yolo.process_mask(protos, ours[:, 6:], ours[:, :4], (640, 640))
    assert masks.shape == ref.shape and len(masks) > 5
    np.testing.assert_array_equal(masks, ref)
    assert masks.any()


def test_segment_masks_with_arbitrary_floats():
    """Real-valued coefficients: float32 matmul order may differ from torch's, only where a logit is ~0."""
    rng = np.random.default_rng(12)
    coeffs = rng.normal(0, 1, (20, 32)).astype(np.float32)
    protos = rng.normal(0, 1, (32, 160, 160)).astype(np.float32)
    boxes = yolo.xywh2xyxy(np.concatenate([rng.uniform(100, 500, (20, 2)), rng.uniform(50, 300, (20, 2))], 1)).astype(
        np.float32
    )
    ref = ul_ops.process_mask(
        torch.from_numpy(protos), torch.from_numpy(coeffs), torch.from_numpy(boxes), (640, 640), upsample=True
    ).numpy()
    masks = yolo.process_mask(protos, coeffs, boxes, (640, 640))
    assert (masks != ref).mean() < 1e-5


def test_interpolate_matches_torch():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (3, 40, 52)).astype(np.float32)
    for size in ((160, 208), (97, 31), (40, 52)):
        ref = torch.nn.functional.interpolate(torch.from_numpy(x)[None], size, mode="bilinear", align_corners=False)[0]
        np.testing.assert_allclose(yolo.interpolate_bilinear(x, size), ref.numpy(), rtol=0, atol=1e-6)


def test_pose_matches_ultralytics():
    rng = np.random.default_rng(5)
    head = random_head(rng, nc=1, extra=51, anchors=3000, overlap=True)
    want = ultralytics_nms(head, conf=0.02, iou=0.7, nc=1)
    ours = yolo.non_max_suppression(head, conf=0.02, iou=0.7, nc=1)
    assert_same_detections(ours, want)
    res = yolo.detect({"output": head}, {"kind": "pose", "conf": 0.02, "iou": 0.7, "max_det": 300, "nc": 1})
    np.testing.assert_array_equal(res[0]["keypoints"], want[0][:, 6:].reshape(-1, 17, 3))


@pytest.mark.parametrize("agnostic", [False, True])
def test_obb_matches_ultralytics(agnostic):
    rng = np.random.default_rng(9)
    head = random_head(rng, nc=15, extra=1, anchors=1500, overlap=True)
    head[0, -1] = rng.uniform(-np.pi / 4, 3 * np.pi / 4, head.shape[-1])
    kw = dict(conf=0.05, iou=0.5, nc=15, agnostic=agnostic)
    want = ultralytics_nms(head, rotated=True, **kw)
    ours = yolo.non_max_suppression(head, rotated=True, **kw)
    assert_same_detections(ours, want)
    assert 5 < len(ours[0]) < (head[0, 4:19].max(0) > 0.05).sum()
    rb = torch.from_numpy(np.concatenate([want[0][:, :4], want[0][:, -1:]], 1))
    np.testing.assert_allclose(yolo.regularize_rboxes(rb.numpy()), ul_ops.regularize_rboxes(rb).numpy(), atol=1e-6)


def test_probiou_matches_ultralytics():
    from ultralytics.utils.metrics import batch_probiou

    rng = np.random.default_rng(4)
    b = np.concatenate([rng.uniform(0, 100, (50, 2)), rng.uniform(5, 60, (50, 2)), rng.uniform(-1, 2, (50, 1))], 1)
    b = b.astype(np.float32)
    ours, want = yolo.batch_probiou(b, b), batch_probiou(torch.from_numpy(b), torch.from_numpy(b)).numpy()
    off = ~np.eye(len(b), dtype=bool)
    np.testing.assert_allclose(ours[off], want[off], atol=2e-6)
    # a box with itself: 1 - sqrt(1 - exp(-1e-7) + 1e-7) turns one ulp of exp near 1 into ~7e-5
    np.testing.assert_allclose(np.diag(ours), np.diag(want), atol=1e-4)


def photo(name):
    import skimage.io

    path = next(p for p in (Path(__import__("skimage").data.__file__).parent).iterdir() if p.stem == name)
    img = skimage.io.imread(path)
    return np.ascontiguousarray(img[..., :3]) if img.ndim == 3 else np.repeat(img[..., None], 3, 2)


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize("size", [(640, 640), (320, 320), (256, 384)])
def test_letterbox_is_ultralytics_letterbox(name, size):
    from ultralytics.data.augment import LetterBox

    img = photo(name)
    want = LetterBox(size, auto=False)(image=img.copy())
    ours, g = yolo.letterbox(img, size)
    np.testing.assert_array_equal(ours, want)  # with OpenCV installed: the very same resize
    plain, g2 = yolo.letterbox(img, size, use_cv2=False)
    assert g2 == g and plain.shape == want.shape
    inner = (slice(g["top"], g["top"] + g["new_hw"][0]), slice(g["left"], g["left"] + g["new_hw"][1]))
    pad = np.ones(want.shape[:2], bool)
    pad[inner] = False
    assert (plain[pad] == 114).all() and (want[pad] == 114).all()
    diff = np.abs(plain.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01  # numpy copy of OpenCV's fixed point: off by one at most


@pytest.mark.parametrize("name", ["coffee", "hubble_deep_field"])
def test_scale_back_to_the_original_image(name):
    img = photo(name)
    g = yolo.letterbox_geometry(img.shape[:2], (640, 640))
    rng = np.random.default_rng(0)
    boxes = yolo.xywh2xyxy(np.concatenate([rng.uniform(0, 640, (30, 2)), rng.uniform(4, 300, (30, 2))], 1)).astype(
        np.float32
    )
    want = ul_ops.scale_boxes((640, 640), torch.from_numpy(boxes.copy()), img.shape).numpy()
    np.testing.assert_allclose(yolo.scale_boxes(boxes, g, img.shape[:2]), want, rtol=1e-6, atol=1e-4)
    kpts = rng.uniform(0, 640, (30, 17, 2)).astype(np.float32)
    want = ul_ops.scale_coords((640, 640), torch.from_numpy(kpts.copy()), img.shape).numpy()
    np.testing.assert_allclose(yolo.scale_coords(kpts, g, img.shape[:2]), want, rtol=1e-6, atol=1e-4)


def test_module_needs_only_numpy():
    """The bundle copies yolo.py as postprocess.py onto a board without torch, torchvision or ultralytics."""
    tree = ast.parse(Path(yolo.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert imported <= {"__future__", "math", "numpy", "cv2"}, imported


def _segment(x2: float, mask: np.ndarray) -> dict:
    box = np.array([[10.0, 10.0, x2, 30.0]], np.float32)
    return {"boxes": box, "scores": np.ones(1, np.float32), "classes": np.zeros(1, np.int64), "masks": mask}


def test_a_mask_is_compared_inside_both_boxes():
    """A box edge that moves across a pixel column (x2 49.9 -> 50.1, box IoU 0.995) crops one more
    column into the mask: inside both boxes the masks are equal, so the detections match; a mask
    that differs inside the boxes still does not."""
    full = np.ones((1, 64, 64), np.uint8)
    ref = _segment(49.9, yolo.crop_mask(full, np.array([[10.0, 10.0, 49.9, 30.0]])))
    got = _segment(50.1, yolo.crop_mask(full, np.array([[10.0, 10.0, 50.1, 30.0]])))
    assert yolo._mask_iou(ref["masks"][0], got["masks"][0]) < yolo.MASK_IOU  # cropped to their own boxes
    pairs, missing, extras, worst = yolo.match_detections(ref, got, "segment")
    assert pairs == [(0, 0)] and not missing and not extras and worst["mask_iou"] == 1.0
    holed = got["masks"].copy()
    holed[0, 10:30, 10:15] = 0  # 100 of the 800 pixels inside both boxes
    pairs, missing, _, _ = yolo.match_detections(ref, {**got, "masks": holed}, "segment")
    assert not pairs and "mask IoU 0.8750" in missing[0][1]
