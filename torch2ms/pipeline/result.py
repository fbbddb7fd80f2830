"""What a run returns: each stage's result and the run's, and ``raise_for``, which turns a run that
did not pass into the error its caller reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch2ms.errors import CheckFailed, NotCheckable
from torch2ms.pipeline import evidence as proof
from torch2ms.pipeline.stage import Stage
from torch2ms.recipe import Recipe


@dataclass
class StageResult:
    stage: str
    status: str  # passed | failed | not checkable | up to date | disabled | not run
    record: dict | None = None
    reason: str = ""
    declared: Stage | None = field(default=None, repr=False)  # the stage object, for its notes

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "up to date", "disabled")


@dataclass
class RunResult:
    recipe: Recipe
    root: Path
    stages: list[StageResult] = field(default_factory=list)
    seconds: float = 0.0
    # the report's line on the recipe's task and its gate (the runner's ``Checks.task_note``)
    task_note: str | None = None

    @property
    def passed(self) -> bool:
        return all(s.ok for s in self.stages)

    @property
    def failed_stage(self) -> StageResult | None:
        return next((s for s in self.stages if s.status == "failed"), None)


def raise_for(result: RunResult) -> None:
    """Raise what a run that did not pass means for its caller: ``CheckFailed`` naming the failed
    stage, its folder and how to localize it, or ``NotCheckable`` with where the evidence is."""
    failed = result.failed_stage
    if failed is not None and "reference output has" in failed.reason:
        raise CheckFailed(
            f"stage {failed.stage!r} failed: PyTorch's own output is not finite on the sample inputs"
            f" ({failed.reason}); no conversion can be checked against it",
            hint="fix the model, its weights (model.checkpoint) or the sample data (inputs[].data)"
            " so that PyTorch gives finite outputs",
        )
    unsure = next((s for s in result.stages if s.status == proof.NOT_CHECKABLE), None)
    if failed is None and unsure is not None:
        raise NotCheckable(
            f"stage {unsure.stage!r}: the model is not checkable at these inputs: {unsure.reason}",
            hint=f"stage.json in {result.root / unsure.stage} records the evidence sought ('evidence')",
        )
    if failed is not None:
        where = result.root / failed.stage
        hint = f"its artifacts and record stay in {where}"
        if (where / "diff.md").is_file():
            hint += f"; every tensor's error against onnxruntime is in {where / 'diff.md'}"
        elif failed.declared is not None and failed.declared.localize:
            hint += f"; `torch2ms diff --stage {failed.stage}` localizes the first diverging node"
        raise CheckFailed(f"stage {failed.stage!r} is out of tolerance against PyTorch: {failed.reason}", hint=hint)
