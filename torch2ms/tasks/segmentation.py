"""Segmentation: does every stage draw the same class map as PyTorch?

The first output shaped ``N x classes x H x W`` holds per-pixel class scores; its argmax over
axis 1 is the class map. Pooled over every pixel of every sample:

* **pixel agreement** (gated): share of pixels whose class equals PyTorch's;
* **mIoU vs PyTorch**: PyTorch's map taken as the ground truth, ``IoU_c = |S=c ∧ T=c| / |S=c ∨ T=c|``
  per class ``c`` present in either map, averaged over those classes. Unlike pixel agreement it
  weighs a small class as much as the background, so a stage that erases a thin object shows.

From the confusion matrix ``M[t, s]`` (PyTorch class t, stage class s):
``IoU_c = M[c, c] / (sum_s M[c, s] + sum_t M[t, c] - M[c, c])``.

The notes list the classes whose IoU is below 1, worst first, and the largest top-1/top-2 margin
PyTorch had on a pixel that changed class (small: near ties; large: a real change).

Default gate 0 (report only), for the reasons given in ``classification``: the tensor tolerance
already bounds the flips, and on random-weight models near ties are common; gate explicitly
with ``check.task_agreement`` where it matters.
"""

from __future__ import annotations

import numpy as np

from torch2ms.tasks import Task, TaskResult, task

MAX_NOTES = 10


def class_maps(outputs: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    """Argmax over the class axis of one output for every sample, as one flat array of pixels."""
    return np.concatenate([np.asarray(s[name]).argmax(axis=1).ravel() for s in outputs])


def confusion(truth: np.ndarray, pred: np.ndarray, classes: int) -> np.ndarray:
    return np.bincount(truth * classes + pred, minlength=classes * classes).reshape(classes, classes)


def iou_per_class(cm: np.ndarray) -> dict[int, float]:
    """IoU of every class present in either map (rows: truth, columns: prediction)."""
    inter = np.diag(cm).astype(np.float64)
    union = cm.sum(axis=0) + cm.sum(axis=1) - inter
    return {int(c): float(inter[c] / union[c]) for c in np.flatnonzero(union)}


@task("segmentation")
class Segmentation(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = next((n for n, v in reference[0].items() if v.ndim == 4 and v.shape[1] >= 2), None)
        if name is None:
            return None
        classes = reference[0][name].shape[1]
        want, got = class_maps(reference, name), class_maps(outputs, name)
        agree = want == got
        ious = iou_per_class(confusion(want, got, classes))
        margins = np.concatenate([_top2_margin(r[name]) for r in reference])
        names = recipe.class_names or ()
        worst = sorted((iou, c) for c, iou in ious.items() if iou < 1.0)
        label = lambda c: f"class {c} ({names[c]})" if c < len(names) else f"class {c}"  # noqa: E731
        notes = [f"{label(c)}: IoU {iou:.4f}" for iou, c in worst[:MAX_NOTES]]
        if len(worst) > MAX_NOTES:
            notes.append(f"... and {len(worst) - MAX_NOTES} more classes below IoU 1")
        if not agree.all():
            notes.append(f"largest PyTorch top-1/top-2 margin on a changed pixel: {margins[~agree].max():.3g}")
        return TaskResult(
            metric="pixel agreement",
            agreement=float(agree.mean()),
            figures={
                "output": name,
                "pixels": int(agree.size),
                "classes": int(classes),
                "classes_present": len(ious),
                "miou": float(np.mean(list(ious.values()))),
                "pixels_changed": int((~agree).sum()),
            },
            notes=notes,
        )


def _top2_margin(scores: np.ndarray) -> np.ndarray:
    """Per pixel (flattened like ``class_maps``): best minus second-best class score."""
    top2 = np.partition(np.asarray(scores, np.float64), -2, axis=1)[:, -2:]
    return (top2[:, 1] - top2[:, 0]).ravel()
