"""Text detection and recognition (PP-OCR style): the same text boxes, the same recognised text.

* ``text_detection``: the first output is a DB probability map ``(batch, 1, H, W)``. Both maps go
  through the same box extraction, the DB post-processing's first steps (Liao et al., "Real-time
  Scene Text Detection with Differentiable Binarization"; rapidocr's ``DBPostProcess`` as its
  config.yaml sets it): each contour of the map above ``BINARY`` (dilated by ``DILATION``), its
  minimum-area rectangle a text box when its short side is at least ``MIN_SIDE`` pixels and the
  mean probability inside it ``BOX_SCORE`` (compared as axis-aligned boxes; no unclip, which would
  scale both sides' boxes alike). The reference's boxes are matched greedily, best IoU first, to
  the stage's; **agreement** (gated) = matched at IoU >= ``MATCH_IOU`` / (reference boxes +
  unmatched stage boxes), 1 when neither side finds text. The figures give the smallest and the
  mean IoU of the matched boxes.
* ``text_recognition``: the first output holds per time step the character scores ``(batch, T,
  classes)`` of a CTC recogniser. Each row is decoded greedily (argmax per step, repeats merged,
  class 0 the blank, as PP-OCR's ``CTCLabelDecode``); **agreement** (gated) = the share of rows
  whose decoded class sequence is the reference's, i.e. whose text is identical.

Default gates are 0 (report only) in the stages, where the tensor bounds hold every value; the INT8
plan gates them with ``precision.int8_task_agreement``.
"""

from __future__ import annotations

import numpy as np

from torch2ms.errors import RecipeError
from torch2ms.tasks import Task, TaskResult, limited_notes, task
from torch2ms.tasks.boxes import box_iou

BINARY = 0.3  # DB's binarisation threshold (rapidocr DBPostProcess thresh)
BOX_SCORE = 0.5  # a region's mean probability to count as text (box_thresh)
MIN_SIDE = 3  # a box's short side in pixels (DBPostProcess min_size)
DILATION = (2, 2)  # the binary map dilated first (rapidocr's config.yaml: Det use_dilation true)
MATCH_IOU = 0.5


def _first(reference) -> str:
    return next(iter(reference[0]))


def text_boxes(prob: np.ndarray) -> np.ndarray:
    """The text boxes ``[x0, y0, x1, y1]`` (pixels) of one ``(H, W)`` DB map: each contour of the
    map above ``BINARY``, dilated, its minimum-area rectangle kept when its short side reaches ``MIN_SIDE`` and
    the mean probability inside it ``BOX_SCORE``, as the rectangle's axis-aligned extent."""
    try:
        import cv2
    except ImportError as e:
        raise RecipeError(
            "task: text_detection needs OpenCV for the DB boxes", hint="pip install 'opencv-python<4.12'"
        ) from e

    binary = cv2.dilate((prob > BINARY).astype(np.uint8), np.ones(DILATION, np.uint8))
    contours, _ = cv2.findContours(binary, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours:
        rect = cv2.minAreaRect(contour)
        if min(rect[1]) < MIN_SIDE:
            continue
        corners = cv2.boxPoints(rect)
        mask = np.zeros(prob.shape, np.uint8)
        cv2.fillPoly(mask, [corners.astype(np.int32)], 1)  # truncated, as DB's box_score_fast
        if mask.any() and float(prob[mask > 0].mean()) >= BOX_SCORE:
            boxes.append([*corners.min(axis=0), *corners.max(axis=0)])
    return np.asarray(boxes, np.float64).reshape(-1, 4)


def match_boxes(ref: np.ndarray, got: np.ndarray, threshold: float = MATCH_IOU) -> tuple[list[float], int, int]:
    """Greedy one-to-one matching, best IoU first: the matched IoUs, the unmatched reference boxes
    and the unmatched ``got`` boxes."""
    ious = box_iou(ref, got) if len(ref) and len(got) else np.zeros((len(ref), len(got)))
    matched: list[float] = []
    free_r, free_g = set(range(len(ref))), set(range(len(got)))
    for flat in np.argsort(-ious, axis=None):
        i, j = divmod(int(flat), ious.shape[1])
        if ious[i, j] < threshold:
            break
        if i in free_r and j in free_g:
            free_r.discard(i)
            free_g.discard(j)
            matched.append(float(ious[i, j]))
    return matched, len(free_r), len(free_g)


def box_agreement(metric: str, pairs, notes: list[str]) -> TaskResult:
    """The gated agreement and IoU figures over ``pairs`` of (reference boxes, stage boxes)."""
    ious: list[float] = []
    total = missed = extra = 0
    for ref, got in pairs:
        m, r, g = match_boxes(ref, got)
        ious += m
        total, missed, extra = total + len(ref), missed + r, extra + g
    denominator = total + extra
    return TaskResult(
        metric=metric,
        agreement=float(len(ious) / denominator) if denominator else 1.0,
        figures={
            "reference_boxes": total,
            "matched": len(ious),
            "missed": missed,
            "extra": extra,
            "min_iou": float(min(ious)) if ious else None,
            "mean_iou": float(np.mean(ious)) if ious else None,
        },
        notes=limited_notes(notes),
    )


@task("text_detection")
class TextDetection(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = _first(reference)
        if reference[0][name].ndim != 4 or reference[0][name].shape[1] != 1:
            return None
        pairs, notes = [], []
        for s, (got, ref) in enumerate(zip(outputs, reference)):
            for b in range(ref[name].shape[0]):
                pair = text_boxes(ref[name][b, 0]), text_boxes(got[name][b, 0])
                pairs.append(pair)
                if len(pair[0]) != len(pair[1]):
                    notes.append(f"sample {s} image {b}: {len(pair[0])} reference boxes, {len(pair[1])} stage boxes")
        return box_agreement(f"text boxes matched (IoU >= {MATCH_IOU})", pairs, notes)


def ctc_greedy(scores: np.ndarray) -> list[int]:
    """One row ``(T, classes)`` decoded: argmax per step, repeats merged, the blank (0) dropped."""
    best = scores.argmax(axis=-1)
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(c) for c in best[keep] if c != 0]


@task("text_recognition")
class TextRecognition(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = _first(reference)
        if reference[0][name].ndim != 3 or reference[0][name].shape[-1] < 2:
            return None
        same, notes, chars = [], [], 0
        for s, (got, ref) in enumerate(zip(outputs, reference)):
            for b in range(ref[name].shape[0]):
                want, have = ctc_greedy(ref[name][b]), ctc_greedy(got[name][b])
                same.append(want == have)
                chars += len(want)
                if want != have:
                    notes.append(f"sample {s} row {b}: reference classes {want[:12]}, stage classes {have[:12]}")
        return TaskResult(
            metric="recognised text identical (CTC greedy)",
            agreement=float(np.mean(same)),
            figures={"output": name, "rows": len(same), "reference_characters": chars},
            notes=limited_notes(notes),
        )
