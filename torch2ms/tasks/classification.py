"""Classification: does every stage pick the same classes as PyTorch?

The first output holds class scores along its last axis; every other axis is a row (a batch of
N images gives N rows per sample). Over all rows of all samples:

* **top-1 agreement** (gated): share of rows whose argmax is PyTorch's argmax;
* **top-5 overlap**: mean of ``|top-k(stage) ∩ top-k(PyTorch)| / k``, ``k = min(5, classes)``
  (recorded as ``top5_overlap`` with ``k``).

Each flip is listed in the notes (first 10) with PyTorch's top-1/top-2 margin on that row: a
flip needs the stage to move two scores by the margin together, so a margin near the tensor
tolerance reads as a near tie, a large one as a real change.

Default gate 0 (report only): with the default tensor tolerance a flip can only come from a near
tie, which the tensor check already bounds; a sample is often one row, so an agreement gate on
two samples moves in steps of 50%. Set ``check.task_agreement`` (e.g. 0.999) where the tensor
tolerance is loosened (fp16) or where the check samples are real, labelled-looking data.
"""

from __future__ import annotations

import numpy as np

from torch2ms.tasks import Task, TaskResult, limited_notes, task

TOP_K = 5


def score_rows(outputs: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    """One output of every sample as rows of class scores (float64, classes on the last axis)."""
    return np.concatenate([np.asarray(s[name], np.float64).reshape(-1, s[name].shape[-1]) for s in outputs])


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, best first (stable: ties keep the lower index)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@task("classification")
class Classification(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = next(iter(reference[0]))
        if reference[0][name].ndim < 1 or reference[0][name].shape[-1] < 2:
            return None
        got, want = score_rows(outputs, name), score_rows(reference, name)
        k = min(TOP_K, want.shape[1])
        top_got, top_want = top_k(got, k), top_k(want, k)
        agree = top_got[:, 0] == top_want[:, 0]
        overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(top_got, top_want)])
        ranked = np.sort(want, axis=1)
        margin = ranked[:, -1] - ranked[:, -2]
        flips = np.flatnonzero(~agree)
        notes = limited_notes(
            f"row {i}: PyTorch class {top_want[i, 0]} (margin {margin[i]:.3g}), stage class {top_got[i, 0]}"
            for i in flips
        )
        return TaskResult(
            metric="top-1 agreement",
            agreement=float(agree.mean()),
            figures={
                "output": name,
                "rows": int(len(agree)),
                "classes": int(want.shape[1]),
                "k": k,
                "top5_overlap": float(overlap),
                "flips": int(len(flips)),
            },
            notes=notes,
        )
