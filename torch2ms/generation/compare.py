"""Generation compared token for token, and the logits of every step, against a reference.

* ``first_divergence``: the first step (then the first row at that step) where the tokens differ,
  with both tokens and the reference's top-2 logit gap there: a gap within float noise makes the
  difference a near-tie, not an error.
* ``step_errors``: per step, the logits' ``max|a - r| / max|r|`` and cosine over every row
  (``torch2ms.compare``'s metrics). Only a teacher-forced run (``loop.greedy(teacher=...)``) compares
  like with like after a differing token.
* ``gap_summary``: how close the reference's top two logits come over all steps and rows, which
  says how rare near-ties are for these weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch2ms.compare import compare_arrays
from torch2ms.generation.loop import Generated


@dataclass(frozen=True)
class Divergence:
    step: int
    row: int
    expected: int
    got: int
    gap: float  # the reference's top-1 minus top-2 logit at (row, step)

    def describe(self) -> str:
        return (
            f"step {self.step}, row {self.row}: token {self.got} instead of {self.expected} "
            f"(reference top-2 gap {self.gap:.3g})"
        )


def top2_gaps(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 logit over the last axis."""
    two = np.partition(logits, -2, axis=-1)[..., -2:]
    return two[..., 1] - two[..., 0]


def first_divergence(reference: Generated, candidate: Generated) -> Divergence | None:
    """The earliest (step, row) whose token differs, or None when every token is the same."""
    if reference.tokens.shape != candidate.tokens.shape:
        raise ValueError(f"token shapes differ: {reference.tokens.shape} against {candidate.tokens.shape}")
    differ = np.argwhere((reference.tokens != candidate.tokens).T)  # (step, row), step-major
    if not len(differ):
        return None
    step, row = (int(i) for i in differ[0])
    gap = float(top2_gaps(reference.logits[row, step]))
    return Divergence(step, row, int(reference.tokens[row, step]), int(candidate.tokens[row, step]), gap)


@dataclass(frozen=True)
class StepError:
    step: int
    rel_error: float
    cosine: float
    top1_agreement: float  # share of rows whose argmax is the reference's token


def step_errors(reference: Generated, candidate: Generated) -> list[StepError]:
    """Per step, the candidate's logits against the reference's over every row."""
    out = []
    for step in range(reference.logits.shape[1]):
        m = compare_arrays("logits", candidate.logits[:, step], reference.logits[:, step])
        agree = float(np.mean(candidate.logits[:, step].argmax(-1) == reference.tokens[:, step]))
        out.append(StepError(step, m.rel_error, m.cosine, agree))
    return out


@dataclass(frozen=True)
class GapSummary:
    count: int
    smallest: float
    quantiles: dict[str, float]  # "p1", "p10", "p50" of the gaps
    scale: float  # max |logit| of the reference, for gaps relative to it
    below: dict[float, int]  # threshold -> how many gaps are under it


def gap_summary(reference: Generated, thresholds=(1e-5, 1e-4, 1e-3, 1e-2)) -> GapSummary:
    gaps = top2_gaps(reference.logits).ravel()
    q = np.quantile(gaps, [0.01, 0.1, 0.5])
    return GapSummary(
        count=int(gaps.size),
        smallest=float(gaps.min()),
        quantiles={"p1": float(q[0]), "p10": float(q[1]), "p50": float(q[2])},
        scale=float(np.abs(reference.logits).max()),
        below={t: int((gaps < t).sum()) for t in thresholds},
    )
