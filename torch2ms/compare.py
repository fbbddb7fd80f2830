"""Numeric equivalence of a stage's outputs with the PyTorch reference.

Per output: max abs error, max abs error relative to the largest reference magnitude
(``rel_error = max|a - r| / max|r|``, so a model whose outputs reach 1e12 is judged on scale),
mean abs error, cosine similarity of the flattened tensors, and for class-score outputs
(rank >= 2) the share of positions where ``argmax`` over axis 1 agrees. NaN or Inf in either
side is reported as such and never passes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class OutputMetrics:
    name: str
    max_abs: float
    rel_error: float
    mean_abs: float
    cosine: float
    argmax_agreement: float | None
    nonfinite: str | None = None  # e.g. "stage output has 3 NaN"

    def to_dict(self) -> dict:
        return {k: _json_float(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Tolerance:
    rel_error: float = 1e-4
    cosine: float = 0.99999
    argmax_agreement: float = 0.0

    def violations(self, m: OutputMetrics) -> list[str]:
        if m.nonfinite:
            return [m.nonfinite]
        out = []
        if not m.rel_error <= self.rel_error:
            out.append(f"relative error {m.rel_error:.3g} > {self.rel_error:.3g}")
        if not m.cosine >= self.cosine:
            out.append(f"cosine {m.cosine:.7f} < {self.cosine}")
        if m.argmax_agreement is not None and m.argmax_agreement < self.argmax_agreement:
            out.append(f"argmax agreement {m.argmax_agreement:.4f} < {self.argmax_agreement}")
        return out


def _json_float(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _nonfinite(label: str, a: np.ndarray) -> str | None:
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    if nan or inf:
        parts = [f"{nan} NaN"] * bool(nan) + [f"{inf} Inf"] * bool(inf)
        return f"{label} has {' and '.join(parts)}"
    return None


def compare_arrays(name: str, actual: np.ndarray, reference: np.ndarray) -> OutputMetrics:
    actual = np.asarray(actual)
    reference = np.asarray(reference)
    if actual.shape != reference.shape:
        raise ValueError(f"output {name!r}: shape {actual.shape} differs from the reference's {reference.shape}")
    bad = _nonfinite("reference output", reference) or _nonfinite("stage output", actual)
    a = actual.astype(np.float64).ravel()
    r = reference.astype(np.float64).ravel()
    if bad:
        return OutputMetrics(name, math.nan, math.nan, math.nan, math.nan, None, bad)
    diff = np.abs(a - r)
    max_abs = float(diff.max(initial=0.0))
    scale = float(np.abs(r).max(initial=0.0))
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    na, nr = float(np.linalg.norm(a)), float(np.linalg.norm(r))
    if na == 0 and nr == 0:
        cosine = 1.0
    elif na == 0 or nr == 0:
        cosine = 0.0
    else:
        cosine = float(np.dot(a, r) / (na * nr))
    agree = None
    if reference.ndim >= 2 and reference.shape[1] > 1 and np.issubdtype(reference.dtype, np.floating):
        agree = float((actual.argmax(axis=1) == reference.argmax(axis=1)).mean())
    return OutputMetrics(name, max_abs, rel, float(diff.mean()) if diff.size else 0.0, cosine, agree)


def compare_outputs(
    actual: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]
) -> list[OutputMetrics]:
    """Compare per output name over all samples (samples stacked along a new leading axis)."""
    if len(actual) != len(reference):
        raise ValueError(f"{len(actual)} samples produced, {len(reference)} expected")
    out = []
    for name in reference[0]:
        a = np.stack([s[name] for s in actual])
        r = np.stack([s[name] for s in reference])
        m = compare_arrays(name, a.reshape(-1, *a.shape[2:]), r.reshape(-1, *r.shape[2:]))
        out.append(m)
    return out


def worst(metrics: list[OutputMetrics]) -> OutputMetrics:
    """The output furthest from the reference (non-finite first, then relative error)."""
    return max(metrics, key=lambda m: (m.nonfinite is not None, m.rel_error if math.isfinite(m.rel_error) else math.inf))
