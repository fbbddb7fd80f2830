"""How far a bound may widen, in one place: widening multiplies the distance from exact agreement.

A bound is a distance from exact agreement: a relative error ``r`` (exact: 0), a cosine ``c``
(distance ``1 - c``), a task agreement ``a`` (distance ``1 - a``). Widening it by ``k``:

    r' = k * r;   c' = 1 - k * (1 - c);   a' = max(0, 1 - k * (1 - a))

The rules that use it:
- the noise floor (``compare.Tolerance.bound``, ``tasks.bound``): ``check.noise_factor`` times the
  distance of two correct float32 implementations (onnxruntime or float32 PyTorch from PyTorch);
- accumulated rounding (``pipeline.runner``): ``check.noise_factor`` times the stage's bound, when
  ``diff``'s replay finds no node wrong;
- the replay's own bound (``divergence``): ``LOCAL_SHARE`` (0.1) times the tolerance, a narrowing.

**The ceiling.** Without evidence that every node is right, no output passes beyond
``check.ceiling`` (relative error, 1e-3) or the cosine widened by the same factor from the recipe's
(0.99999 -> 0.9999): under a noise-floor bound of 6.37 (a random RT-DETR, whose float32 is 64% from
float64) a converter bug 10% wrong would pass. The recipe's own bound is never capped.
``pipeline.evidence`` decides what an output beyond the ceiling needs.
"""

from __future__ import annotations

# A node is wrong when its output, computed from onnxruntime's own inputs, leaves this share of
# the tolerance: a correct float32 op differs by ~1e-7..1e-6 relative, and each injected fault
# (tests/pipeline/test_fault_injection.py) by far more than 1e-5. diff's replay, the export's float64
# evidence and its first diverging module all hold a node to it.
LOCAL_SHARE = 0.1


def widen(rel_error: float, cosine: float, factor: float) -> tuple[float, float]:
    """(relative error, cosine) with their distance from exact agreement times ``factor``."""
    return factor * rel_error, 1.0 - factor * (1.0 - cosine)


def widen_agreement(agreement: float, factor: float) -> float:
    """A task agreement with its disagreement times ``factor`` (never below 0)."""
    return max(0.0, 1.0 - factor * (1.0 - agreement))


def ceiling(check) -> tuple[float, float]:
    """The widest (relative error, cosine) an output passes without per-node evidence: ``check.ceiling``
    and the recipe's cosine widened by the same factor, never tighter than the recipe's own bound."""
    rel = max(check.ceiling, check.rel_error)
    return rel, widen(check.rel_error, check.cosine, rel / check.rel_error)[1]
