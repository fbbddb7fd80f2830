"""Task-level checks beside the tensor errors: does a stage's output *mean* what PyTorch's does?

The recipe's ``task`` picks one ``Task`` (classification, segmentation, detection; ``other`` has
none). After every stage the runner calls ``task.measure(recipe, outputs, reference)`` with the
stage's outputs and PyTorch's, per sample, and records the ``TaskResult`` in ``stage.json``
under ``task``. A stage fails when ``agreement`` is below the gate: ``check.task_agreement``
when the recipe sets it, else the task's ``default_gate``, widened like the tensor bound for a
network that float32 itself cannot decide (``bound``): the export stage measures float32 PyTorch's
agreement with the same model in float64, later stages onnxruntime's agreement with PyTorch, and a
stage also passes within ``check.noise_factor`` times that disagreement.

A task lives in its own module here and registers itself with ``@task("name")``; the modules
are imported on first use, like the converters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class TaskResult:
    metric: str  # what ``agreement`` measures, e.g. "top-1 agreement"
    agreement: float  # the gated figure, 0..1
    figures: dict[str, Any] = field(default_factory=dict)  # other figures (top-5 overlap, mIoU, ...)
    notes: list[str] = field(default_factory=list)  # details a reader needs (e.g. each missing box)
    gate: dict | None = None  # the runner's ``bound``: the agreement needed and which rule set it

    def to_dict(self) -> dict[str, Any]:
        out = {"metric": self.metric, "agreement": self.agreement, "figures": self.figures, "notes": self.notes}
        return {**out, "gate": self.gate} if self.gate else out


class Task:
    name = ""
    default_gate = 0.0  # 0: report only

    def measure(
        self, recipe, outputs: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]]
    ) -> TaskResult | None:
        """Compare a stage's outputs with PyTorch's (both per sample, per output name)."""
        raise NotImplementedError


TASKS: dict[str, Task] = {}


MAX_NOTES = 10  # the notes a task result lists before "... and N more"


def limited_notes(lines, limit: int = MAX_NOTES, more: str = "more") -> list[str]:
    """The first ``limit`` of ``lines`` (an iterable of note strings), then how many were left out."""
    lines = list(lines)
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [f"... and {len(lines) - limit} {more}"]


def task(name: str):
    """Register the decorated ``Task`` subclass for recipes with ``task: name``."""

    def deco(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls()
        return cls

    return deco


_LOADED = False


def task_for(recipe) -> Task | None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import importlib
        import pkgutil

        for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            importlib.import_module(f"{__name__}.{mod}")
    return TASKS.get(recipe.task)


def gate(recipe, t: Task) -> float:
    given = getattr(recipe.check, "task_agreement", None)
    return t.default_gate if given is None else given


def bound(recipe, t: Task, floor: float | None = None, source: str = "") -> dict:
    """The agreement a stage needs and which rule set it: the recipe's (or the task's) gate, or,
    when ``floor`` (the agreement of two correct float32 implementations, measured on the same
    samples) is below 1 and ``check.noise_factor`` times its disagreement is looser, that.

    Detection on random weights is where it matters: yolo12n's float32 PyTorch and float64
    PyTorch keep different boxes for 1 of ~600 detections (scores within 1e-6 of each other
    under NMS), so no float32 implementation can match PyTorch box for box there. A real bug
    moves far more than ``noise_factor`` times that, and the tensor bound still applies."""
    from torch2ms.bounds import widen_agreement

    need, by = gate(recipe, t), "recipe"
    factor = float(getattr(recipe.check, "noise_factor", 0.0) or 0.0)
    if floor is not None and factor > 0 and 0.0 <= floor < 1.0:
        noisy = widen_agreement(floor, factor)
        if noisy < need:
            need, by = noisy, f"{factor:g}x {source} ({floor:.4f})"
    return {"agreement": need, "by": by}
