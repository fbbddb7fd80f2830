"""Detection agreement with PyTorch: the same boxes after the host postprocess, not only close tensors.

Both PyTorch's raw head and the stage's go through the same numpy postprocess
(``torch2ms.postprocess.yolo``, the bundle's ``postprocess.py``: NMS as Ultralytics does it), and
are compared by ``yolo.match_detections``, which the bundle's ``infer.py --self-check`` uses too.
A PyTorch detection is *matched* when
the stage has an unmatched detection of the same class whose box overlaps it at IoU >= 0.99
(probiou for rotated boxes), and for -seg whose mask overlaps at IoU >= 0.99 inside both boxes (each
mask is cropped to its own box, whose edges are judged by the box IoU), for -pose whose
keypoints are within 1 pixel and visibilities within 0.01. Agreement = matched / PyTorch's
detections, over all samples; every unmatched and extra detection is listed with its coordinates.

**The confidence threshold is chosen per sample**, on PyTorch's output: random weights put few or
very many boxes above the recipe's ``conf``. Greedy NMS never lets a lower-scored box remove a
higher-scored one, so the detections at threshold ``c`` are those at threshold 0 that score above
``c``. With those scores sorted, ``s_1 >= s_2 >= ...``, the tool takes the ``k`` in
``[10, max_det]`` whose gap ``s_k - s_{k+1}`` is the widest relative to ``s_k`` and sets
``conf = (s_k + s_{k+1}) / 2``: PyTorch then keeps exactly ``k`` detections and no score sits near
the threshold, so an error of 1e-6 in a score cannot move a box across it.
"""

from __future__ import annotations

import numpy as np

from torch2ms.postprocess.yolo import choose_conf, match_detections
from torch2ms.tasks import Task, TaskResult, task

MAX_NOTES = 40


def params_of(recipe) -> dict:
    spec = recipe.postprocess
    params = spec.model_dump(mode="json")
    shape = recipe.inputs[0].shape
    params["input_hw"] = [shape[-2], shape[-1]]
    return params


def _fmt(det: dict, i: int, names) -> str:
    c = int(det["classes"][i])
    label = names[c] if names else str(c)
    box = ", ".join(f"{v:.1f}" for v in det["boxes"][i])
    return f"{label} {det['scores'][i]:.4f} [{box}]"


def _image(outputs: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    return {k: v[b : b + 1] for k, v in outputs.items()}


@task("detection")
class Detection(Task):
    default_gate = 1.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        from torch2ms.postprocess import yolo

        params = params_of(recipe)
        names = params.get("class_names")
        kind = params["kind"]
        head_name = params.get("output") or next(iter(reference[0]))
        total = matched = extra = 0
        per_sample, notes = [], []
        worst: dict[str, float] = {}
        for s, (got_out, ref_out) in enumerate(zip(outputs, reference)):
            for b in range(ref_out[head_name].shape[0]):
                conf, k, gap = choose_conf(ref_out[head_name][b : b + 1], params)
                ref = yolo.detect(_image(ref_out, b), params, conf=conf)[0]
                got = yolo.detect(_image(got_out, b), params, conf=conf)[0]
                pairs, missing, extras, w = match_detections(ref, got, kind)
                for key, v in w.items():
                    worst[key] = (max if key in ("keypoint_px", "visibility") else min)(worst.get(key, v), v)
                where = f"sample {s}" + (f" image {b}" if ref_out[head_name].shape[0] > 1 else "")
                notes += [f"{where}: PyTorch's {_fmt(ref, i, names)} not matched ({why})" for i, why in missing]
                notes += [f"{where}: extra {_fmt(got, j, names)} (PyTorch has no such detection)" for j in extras]
                total, matched, extra = total + len(ref["boxes"]), matched + len(pairs), extra + len(extras)
                per_sample.append(
                    {
                        "sample": s,
                        "conf": round(conf, 8),
                        "score_gap": round(gap, 6),
                        "pytorch": len(ref["boxes"]),
                        "stage": len(got["boxes"]),
                        "matched": len(pairs),
                        "unmatched": len(missing),
                        "extra": len(extras),
                    }
                )
        agreement = matched / total if total else 1.0
        if extra and agreement == 1.0:
            agreement = matched / (total + extra)  # extra boxes are disagreement too
        if len(notes) > MAX_NOTES:
            notes = notes[:MAX_NOTES] + [f"... and {len(notes) - MAX_NOTES} more"]
        figures = {
            "detections": total,
            "matched": matched,
            "unmatched": total - matched,
            "extra": extra,
            "per_sample": per_sample,
            **{f"worst_{k}": round(v, 6) for k, v in worst.items()},
        }
        return TaskResult("detection agreement", agreement, figures, notes)
