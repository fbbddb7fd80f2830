"""Numeric equivalence of a stage's outputs with the PyTorch reference.

Per output: max abs error, max abs error relative to the largest reference magnitude
(``rel_error = max|a - r| / max|r|``, so a model whose outputs reach 1e12 is judged on scale),
mean abs error, cosine similarity of the flattened tensors, and for class-score outputs
(rank >= 2) the share of positions where ``argmax`` over axis 1 agrees. NaN or Inf in either
side is reported as such and never passes.

Integer and boolean outputs (token ids, masks, argmax indices) are compared exactly: the
metrics above are still recorded, and ``mismatched`` counts the elements that differ; a single
one fails the stage whatever the bounds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from torch2ms.bounds import widen


@dataclass(frozen=True)
class OutputMetrics:
    name: str
    max_abs: float
    rel_error: float
    mean_abs: float
    cosine: float
    argmax_agreement: float | None
    nonfinite: str | None = None  # e.g. "stage output has 3 NaN"
    mismatched: int | None = None  # integer / bool reference: elements that differ (None: a float output)

    def to_dict(self) -> dict:
        return {k: _json_float(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Tolerance:
    """When a stage's output counts as PyTorch's.

    The bound is the recipe's (``rel_error``, ``cosine``), widened only for a network that is
    itself sensitive: ``floor`` holds, per output, onnxruntime's own distance from PyTorch on the
    same inputs (two correct float32 implementations that differ only in summation order), and
    an output passes within ``noise_factor`` times that distance when this is looser than the
    recipe's bound. A well-conditioned network's floor is ~1e-6, far inside the default 1e-4, so
    the recipe's bound applies and a real bug (a wrong padding, epsilon, weight or sign in one
    layer) still fails; an ill-conditioned one (outputs through saturated sigmoids, activations
    of 1e4) is judged against what float32 can do for it. ``bound()`` says which bound applied.

    ``ceiling`` (``bounds.ceiling``): an output within a widened bound but beyond it passes only
    with evidence that every node is right (``beyond_ceiling``, ``pipeline.evidence``).
    """

    rel_error: float = 1e-4
    cosine: float = 0.99999
    argmax_agreement: float = 0.0
    noise_factor: float = 0.0
    floor: dict[str, tuple[float, float]] | None = None  # output -> (rel_error, cosine) of onnxruntime
    floor_source: str = "onnxruntime's distance from PyTorch"
    ceiling: tuple[float, float] | None = None  # (rel_error, cosine) past which evidence is needed
    recorded: dict[str, dict] | None = None  # output -> the bound a stage's record (stage.json) holds

    @classmethod
    def from_record(cls, check, record: dict | None) -> Tolerance:
        """The bounds a stage passed under, as its record (``stage.json`` ``bounds``) holds them: the
        recipe's, a noise floor's or a replay's, each with its ``by``; an output the record does not
        name is held to the recipe's. A run's later users (bench, verify) judge by what was passed."""
        return cls(check.rel_error, check.cosine, check.argmax_agreement, recorded=(record or {}).get("bounds") or {})

    def bound(self, name: str) -> dict:
        """The relative-error and cosine bounds for output ``name`` and which rule set them."""
        if self.recorded and name in self.recorded:
            b = self.recorded[name]
            return {"rel_error": b["rel_error"], "cosine": b["cosine"], "by": b.get("by", "recipe")}
        rel, cos, by = self.rel_error, self.cosine, "recipe"
        floor = (self.floor or {}).get(name)
        if floor and self.noise_factor > 0 and all(math.isfinite(v) for v in floor):
            noisy_rel, noisy_cos = widen(floor[0], floor[1], self.noise_factor)
            if noisy_rel > rel or noisy_cos < cos:
                rel, cos = max(rel, noisy_rel), min(cos, noisy_cos)
                by = f"{self.noise_factor:g}x {self.floor_source}"
        return {"rel_error": rel, "cosine": cos, "by": by}

    def violations(self, m: OutputMetrics) -> list[str]:
        if m.nonfinite:
            return [m.nonfinite]
        if m.mismatched:
            return [f"{m.mismatched} elements differ (an integer or bool output is compared exactly)"]
        b = self.bound(m.name)
        why = "" if b["by"] == "recipe" else f" ({b['by']})"
        out = []
        if not m.rel_error <= b["rel_error"]:
            out.append(f"relative error {m.rel_error:.3g} > {b['rel_error']:.3g}{why}")
        if not m.cosine >= b["cosine"]:
            out.append(f"cosine {m.cosine:.7f} < {b['cosine']:.7g}{why}")
        if m.argmax_agreement is not None and m.argmax_agreement < self.argmax_agreement:
            out.append(f"argmax agreement {m.argmax_agreement:.4f} < {self.argmax_agreement}")
        return out

    def beyond_ceiling(self, m: OutputMetrics) -> list[str]:
        """What of ``m``, within its bound, lies beyond the ceiling (needs per-node evidence)."""
        if self.ceiling is None or m.nonfinite or self.violations(m):
            return []
        rel, cos = self.ceiling
        out = []
        if m.rel_error > rel:
            out.append(f"relative error {m.rel_error:.3g} > check.ceiling {rel:.3g}")
        if m.cosine < cos:
            out.append(f"cosine {m.cosine:.7f} < {cos:.7g} (check.ceiling)")
        return out


def _json_float(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsAccumulator:
    """The metrics of one output over arrays added one at a time (e.g. one sample at a time, so
    a caller need not hold them all), as if they had been compared stacked."""

    def __init__(self, name: str, reference_label: str = "reference output", actual_label: str = "stage output"):
        self.name = name
        self.labels = (reference_label, actual_label)
        self.max_abs = self.scale = self.sum_abs = self.dot = self.norm_a = self.norm_r = 0.0
        self.count = 0
        self.mismatched: int | None = None  # counted while the reference is integer or bool
        self.nan = dict.fromkeys(self.labels, 0)
        self.inf = dict.fromkeys(self.labels, 0)

    # values per pass: each figure's temporaries (float64 copies, the difference) stay small, where
    # whole-array passes over a large output pair set the mindir stage's peak; and the passes run in
    # cache, as fast as whole-array ones (benchmarks/results/design_measurements.md)
    CHUNK = 1 << 18

    def add(self, actual, reference) -> None:
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            raise ValueError(
                f"output {self.name!r}: shape {actual.shape} differs from the reference's {reference.shape}"
            )
        a, r = actual.reshape(-1), reference.reshape(-1)
        for i in range(0, a.size, self.CHUNK):
            self._add_chunk(a[i : i + self.CHUNK], r[i : i + self.CHUNK])

    def _add_chunk(self, actual: np.ndarray, reference: np.ndarray) -> None:
        if reference.dtype.kind in "biu":
            exact = actual.astype(np.int64) if actual.dtype.kind in "biu" else actual
            differ = int((exact != reference.astype(np.int64)).sum())
            self.mismatched = (self.mismatched or 0) + differ
        a = actual.astype(np.float64, copy=False)
        r = reference.astype(np.float64, copy=False)
        for label, x in zip(self.labels, (r, a)):
            if not np.isfinite(x).all():
                self.nan[label] += int(np.isnan(x).sum())
                self.inf[label] += int(np.isinf(x).sum())
        diff = np.subtract(a, r)
        np.abs(diff, out=diff)
        self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
        self.scale = max(self.scale, float(r.max(initial=0.0)), -float(r.min(initial=0.0)))
        self.sum_abs += float(diff.sum())
        self.count += diff.size
        self.dot += float(np.dot(a, r))
        self.norm_a += float(np.dot(a, a))
        self.norm_r += float(np.dot(r, r))

    def metrics(self, argmax_agreement: float | None = None) -> OutputMetrics:
        for label in self.labels:  # NaN/Inf never passes: the reference side is named first
            nan, inf = self.nan[label], self.inf[label]
            if nan or inf:
                what = " and ".join([f"{nan} NaN"] * bool(nan) + [f"{inf} Inf"] * bool(inf))
                return OutputMetrics(self.name, math.nan, math.nan, math.nan, math.nan, None, f"{label} has {what}")
        rel = self.max_abs / self.scale if self.scale > 0 else (0.0 if self.max_abs == 0 else math.inf)
        na, nr = math.sqrt(self.norm_a), math.sqrt(self.norm_r)
        if na == 0 and nr == 0:
            cosine = 1.0
        elif na == 0 or nr == 0:
            cosine = 0.0
        else:
            cosine = self.dot / (na * nr)
        mean = self.sum_abs / self.count if self.count else 0.0
        return OutputMetrics(self.name, self.max_abs, rel, mean, cosine, argmax_agreement, None, self.mismatched)


def compare_arrays(name: str, actual: np.ndarray, reference: np.ndarray) -> OutputMetrics:
    return _compared(name, [actual], [reference])


def _compared(name: str, actual: list, reference: list) -> OutputMetrics:
    """One output's metrics over its samples, as if the arrays were stacked along axis 0, without
    stacking them (a copy of both, for every output of every check). The argmax agreement is taken
    along axis 1 where the reference is float with more than one channel there."""
    acc = MetricsAccumulator(name)
    agree = total = 0
    for a, r in zip(actual, reference):
        a, r = np.asarray(a), np.asarray(r)
        acc.add(a, r)
        if r.ndim >= 2 and r.shape[1] > 1 and np.issubdtype(r.dtype, np.floating):
            same = a.argmax(axis=1) == r.argmax(axis=1)
            agree, total = agree + int(same.sum()), total + same.size
    return acc.metrics(agree / total if total else None)


def compare_outputs(actual: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]) -> list[OutputMetrics]:
    """Compare per output name over all samples (as if stacked along a new leading axis, the
    samples' batch axes merged)."""
    if len(actual) != len(reference):
        raise ValueError(f"{len(actual)} samples produced, {len(reference)} expected")
    return [_compared(name, [s[name] for s in actual], [s[name] for s in reference]) for name in reference[0]]


def worst(metrics: list[OutputMetrics]) -> OutputMetrics:
    """The output furthest from the reference (non-finite first, then integer mismatches, then relative error)."""
    return max(
        metrics,
        key=lambda m: (
            m.nonfinite is not None,
            bool(m.mismatched),
            m.rel_error if math.isfinite(m.rel_error) else math.inf,
        ),
    )
