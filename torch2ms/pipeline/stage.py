"""What a stage is: a name, the config it depends on, the earlier stage it reads, and ``run``.

``run(ctx, out)`` writes its artifacts into ``out`` and returns a ``StageOutput``: the stage's
outputs on the reference inputs (the runner compares them with PyTorch's), counts, and extra
metrics (latencies, compile time). Everything else (fingerprints, skipping, atomic commit,
the record, the check) is the runner's job, so a stage file stays short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torch2ms.recipe import Recipe


@dataclass
class StageOutput:
    outputs: list[dict[str, np.ndarray]] | None  # per sample, per output name; None: nothing to check
    counts: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Stage:
    name: str = "stage"
    #: the earlier stage whose artifacts this one reads (None for the first)
    reads: str | None = None

    def enabled(self, recipe: Recipe) -> bool:
        return True

    def source_stage(self, ctx) -> str | None:
        """The stage whose artifacts are this stage's input (may depend on the recipe)."""
        return self.reads

    def config(self, recipe: Recipe) -> dict[str, Any]:
        return recipe.stage_config(self.name)

    def run(self, ctx, out: Path) -> StageOutput:
        raise NotImplementedError
