"""What the runner asks of the layers above it, handed in by whoever builds the runner.

pipeline/ runs stages, records and checks what they did; it converts nothing and knows no task,
converter plugin or graph. So the runner (``Runner(..., checks=...)``) is given a ``Checks``: the
recipe task's agreement with PyTorch, the recipe's converter plugins, diff's localisation of a
failed stage and the evidence that every node is right past ``check.ceiling``.
``torch2ms.stages.PipelineChecks`` answers for the pipeline's stages; a test with a stage list of
its own passes the same one. A ``Checks`` is pickled into a stage's own process
(``pipeline.own_process``) with the stages, so it holds no state that does not pickle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class Checks(ABC):
    @abstractmethod
    def task_check(self, recipe, outputs, reference, floor: float | None, source: str | None) -> tuple[Any, str | None]:
        """The recipe task's agreement with PyTorch (None for task 'other') and its violation, if
        any. ``floor``: the agreement two correct float32 implementations reach."""

    @abstractmethod
    def task_note(self, recipe) -> str | None:
        """The report's line under the stage table: what the task column measures and its gate (None
        without a task)."""

    @abstractmethod
    def plugins(self, recipe) -> dict[str, list[str]]:
        """The recipe's converter plugins, loaded (registered) in this process: module -> the ops it registers."""

    @abstractmethod
    def plugin_fingerprint(self, plugins: dict, kernels: bool) -> dict:
        """What of ``plugins`` a stage's fingerprint covers (``kernels``: their kernels' sources too)."""

    @abstractmethod
    def localize(self, ctx, stage: str, out: Path):
        """The first node of ``out``'s network.py that leaves onnxruntime, and the replay's local errors
        (a ``DiffReport``), written as diff.json/diff.md into ``out``. It may raise: the runner logs it."""

    @abstractmethod
    def evidence(self, ctx, stage, out: Path, beyond: list[str], diff, outputs) -> dict:
        """Whether every node is right, for a stage whose outputs lie beyond check.ceiling
        (``pipeline.evidence``): ``by`` replay, float64, wrong or none."""

    @abstractmethod
    def reference_off(self, ctx, diff, stage: str, outputs, needed: list[str]) -> dict | None:
        """A localized stage out of its bound where onnxruntime itself is off float64 and no statement
        is wrong: the evidence that its outputs are within the recipe's bound of ``model.onnx`` in
        float64, or None."""
