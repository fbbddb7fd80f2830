"""Face detection by MTCNN's stage networks (P-, R-, O-Net): the same faces, the same boxes.

Each network scores candidates and regresses their boxes (Zhang et al., "Joint Face Detection and
Alignment using Multi-task Cascaded Convolutional Networks"; facenet-pytorch's ``detect_face``):

* R- and O-Net take one crop per row: outputs ``(batch, 4)`` box offsets and ``(batch, 2)``
  scores (O-Net adds ``(batch, 10)`` landmarks). A row is a candidate, its box the crop
  ``[0, 0, 1, 1]`` moved by the offsets (``bbreg``: offsets are fractions of the crop's side).
* P-Net is fully convolutional: ``(batch, 4, h, w)`` offsets and ``(batch, 2, h, w)`` scores;
  each cell is a candidate, its box the 12x12 window at stride 2 (``[2x + 1, 2y + 1, 2x + 12,
  2y + 12]``, ``generateBoundingBox`` at scale 1) moved by ``offset * 12`` (``bbreg``).

A candidate is a face when its face score (channel 1 of the two-way softmax) passes ``FACE``, the
loosest of facenet's three stage thresholds. **Agreement** (gated) = candidates both sides call a
face with boxes at IoU >= ``MATCH_IOU`` / candidates either side calls a face (1 when neither finds
one); the figures give the faces found and the smallest and mean IoU of the agreeing boxes.
"""

from __future__ import annotations

import numpy as np

from torch2ms.tasks import Task, TaskResult, limited_notes, task
from torch2ms.tasks.boxes import box_iou
from torch2ms.tasks.ocr import MATCH_IOU

FACE = 0.6  # facenet-pytorch MTCNN thresholds [0.6, 0.7, 0.7]
CELL, STRIDE = 12, 2  # P-Net's window and stride (detect_face's generateBoundingBox)


def _heads(out: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scores, offsets) by their channel counts, or None when the outputs are not MTCNN's."""
    by_channels = {v.shape[1]: v for v in out.values() if v.ndim in (2, 4)}
    if 2 not in by_channels or 4 not in by_channels:
        return None
    return by_channels[2], by_channels[4]


def candidates(scores: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every candidate's face score and refined box ``[x0, y0, x1, y1]``, flattened over the batch."""
    if scores.ndim == 2:
        base = np.tile([0.0, 0.0, 1.0, 1.0], (len(scores), 1))
        return scores[:, 1], base + offsets.astype(np.float64)
    n, _, h, w = scores.shape
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    x0, y0 = (STRIDE * xs + 1).astype(np.float64), (STRIDE * ys + 1).astype(np.float64)
    base = np.stack([x0, y0, x0 + CELL - 1, y0 + CELL - 1], axis=-1)[None]  # (1, h, w, 4), pixels inclusive
    boxes = base + CELL * np.moveaxis(offsets, 1, -1).astype(np.float64)
    return scores[:, 1].reshape(-1), boxes.reshape(-1, 4)


@task("face_detection")
class FaceDetection(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        if _heads(reference[0]) is None:
            return None
        ious: list[float] = []
        union = faces = 0
        notes = []
        for s, (got, ref) in enumerate(zip(outputs, reference)):
            (p_ref, b_ref), (p_got, b_got) = candidates(*_heads(ref)), candidates(*_heads(got))
            f_ref, f_got = p_ref > FACE, p_got > FACE
            both = np.flatnonzero(f_ref & f_got)
            pair = box_iou(b_ref[both], b_got[both]).diagonal() if len(both) else np.zeros(0)
            ious += [float(v) for v in pair]
            union += int((f_ref | f_got).sum())
            faces += int(f_ref.sum())
            agreed = int((pair >= MATCH_IOU).sum())
            if agreed != int((f_ref | f_got).sum()):
                found = f"{int(f_ref.sum())} reference faces, {int(f_got.sum())} stage faces"
                notes.append(f"sample {s}: {found}, {agreed} agree")
        agreed = sum(v >= MATCH_IOU for v in ious)
        return TaskResult(
            metric=f"faces agreeing (score > {FACE}, box IoU >= {MATCH_IOU})",
            agreement=float(agreed / union) if union else 1.0,
            figures={
                "reference_faces": faces,
                "faces_either_side": union,
                "agreeing": int(agreed),
                "min_iou": float(min(ious)) if ious else None,
                "mean_iou": float(np.mean(ious)) if ious else None,
            },
            notes=limited_notes(notes),
        )
