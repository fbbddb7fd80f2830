"""Text and sequence models: does every stage predict the same tokens, labels or vectors as PyTorch?

The first output is judged, by the recipe's ``task``:

* ``language_model``: logits ``(batch, positions, vocabulary)``; **top-1 agreement** (gated) is
  the share of (row, position) pairs whose argmax token is PyTorch's, over all samples. The
  figures also give the agreement of the worst position (``worst_position``), where a stage that
  breaks the causal mask or the rotary positions shows first.
* ``sequence_classification``: logits ``(batch, labels)``; **argmax agreement** (gated) is the
  share of rows whose label is PyTorch's.
* ``embedding``: vectors along the last axis (``(batch, dim)`` pooled, or ``(batch, tokens, dim)``);
  the gated figure is the **smallest cosine** between a stage's vector and PyTorch's, with the
  mean beside it.

Default gates are 0 (report only), as for classification: the tensor bounds already hold every
value, and a flip on random weights is a near tie. Set ``check.task_agreement`` to gate them.
"""

from __future__ import annotations

import numpy as np

from torch2ms.tasks import Task, TaskResult, limited_notes, task
from torch2ms.tasks.classification import score_rows


def _first(reference) -> str:
    return next(iter(reference[0]))


@task("language_model")
class LanguageModel(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = _first(reference)
        shape = reference[0][name].shape
        if len(shape) < 2 or shape[-1] < 2:
            return None
        positions = shape[-2]
        got, want = score_rows(outputs, name).argmax(axis=1), score_rows(reference, name).argmax(axis=1)
        agree = got == want
        per_position = agree.reshape(-1, positions).mean(axis=0)  # rows of every sample, per position
        worst = int(per_position.argmin())
        flips = np.flatnonzero(~agree)
        notes = limited_notes(
            f"row {i // positions} position {i % positions}: PyTorch token {want[i]}, stage token {got[i]}"
            for i in flips
        )
        return TaskResult(
            metric="top-1 agreement per position",
            agreement=float(agree.mean()),
            figures={
                "output": name,
                "positions": int(positions),
                "vocabulary": int(shape[-1]),
                "tokens": int(agree.size),
                "worst_position": worst,
                "worst_position_agreement": float(per_position[worst]),
                "flips": int(len(flips)),
            },
            notes=notes,
        )


@task("sequence_classification")
class SequenceClassification(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = _first(reference)
        if reference[0][name].ndim < 1 or reference[0][name].shape[-1] < 2:
            return None
        got, want = score_rows(outputs, name).argmax(axis=1), score_rows(reference, name).argmax(axis=1)
        agree = got == want
        notes = limited_notes(f"row {i}: PyTorch label {want[i]}, stage label {got[i]}" for i in np.flatnonzero(~agree))
        return TaskResult(
            metric="argmax agreement",
            agreement=float(agree.mean()),
            figures={"output": name, "rows": int(agree.size), "labels": int(reference[0][name].shape[-1])},
            notes=notes,
        )


@task("embedding")
class Embedding(Task):
    default_gate = 0.0

    def measure(self, recipe, outputs, reference) -> TaskResult | None:
        name = _first(reference)
        got, want = score_rows(outputs, name), score_rows(reference, name)
        norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
        dots = (got * want).sum(axis=1)
        # two zero vectors agree; one zero vector against a non-zero one does not
        both_zero = (np.linalg.norm(got, axis=1) == 0) & (np.linalg.norm(want, axis=1) == 0)
        cosine = np.where(both_zero, 1.0, dots / np.where(norms > 0, norms, 1.0))
        worst = int(cosine.argmin())
        return TaskResult(
            metric="smallest cosine",
            agreement=float(cosine[worst]),
            figures={
                "output": name,
                "vectors": int(len(cosine)),
                "dim": int(want.shape[1]),
                "mean_cosine": float(cosine.mean()),
                "worst_vector": worst,
            },
        )
