"""What a stage is. A stage class declares everything about itself; the runner, the reports,
the CLI help, ``diff`` and the zoo derive what they need from the classes in
``torch2ms.stages.PIPELINE`` (the one list that orders them).

A stage declares:
- ``name``, and ``summary`` (one line, for ``--help``);
- ``section``: the recipe section holding its options (its fingerprint input, with the checks);
- ``reads``: the artifacts it takes from earlier stages, and ``writes``: the artifacts it leaves in
  its folder. Which stage a read artifact comes from is derived: the last enabled earlier stage
  that writes it (network.py comes from fold, or from rebuild when folding is off);
- ``localize``: a failed check runs ``torch2ms.divergence`` on its ``network.py``;
- ``own_process``: it runs in a fresh process (``torch2ms.pipeline.own_process``);
- ``notes(record)``: the report's notes column for a passed run.

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
    # the stage's outputs on the reference's extra batch sizes (``inputs[].batch``): size -> one sample
    batches: dict[int, dict[str, np.ndarray]] | None = None
    # and on its extra sequence lengths (``inputs[].sequence``): length -> one sample
    lengths: dict[int, dict[str, np.ndarray]] | None = None


class Stage:
    name: str = "stage"
    summary: str = ""
    #: the recipe section with this stage's options (None: it has none)
    section: str | None = None
    #: the artifacts this stage reads from earlier stages
    reads: tuple[str, ...] = ()
    #: the artifacts this stage writes into its folder
    writes: tuple[str, ...] = ()
    #: a failed check localizes the first diverging node of its network.py (torch2ms diff)
    localize: bool = False
    #: its check compares onnxruntime with PyTorch: the network's float32 noise floor, which later
    #: stages' tolerance may widen to (``check.noise_factor``)
    noise_floor: bool = False
    #: it runs in a process of its own when the runner is asked to (``pipeline.own_process``): what it
    #: imports and allocates (torch, for the export) does not stay resident through the later stages
    own_process: bool = False
    #: checks beyond the outputs' comparison, set on a stage object by what runs it (a generation recipe's
    #: decode graph: ``generation.check.GenerationCheck``): ``check(ctx, stage, out, produced, measured)``
    #: returns (violations, its record, kept in ``extra[check.name]``)
    checks: tuple = ()

    def enabled(self, recipe: Recipe) -> bool:
        return True

    def config(self, recipe: Recipe) -> dict[str, Any]:
        """The part of the recipe this stage depends on: its fingerprint input."""
        common = {
            "check": recipe.check.model_dump(mode="json"),
            "inputs": [i.model_dump(mode="json") for i in recipe.inputs],
        }
        if self.section:
            common[self.section] = getattr(recipe, self.section).model_dump(mode="json")
        if recipe.postprocess is not None:  # the task check (detection) of every stage depends on it
            common["postprocess"] = recipe.postprocess.model_dump(mode="json")
        return common

    def notes(self, record: dict) -> str:
        """The report's notes for a passed run of this stage, from its record."""
        return ""

    def run(self, ctx, out: Path) -> StageOutput:
        raise NotImplementedError


def writer_of(artifact: str, recipe: Recipe, stages: list[Stage], first: bool = False) -> str:
    """The stage whose folder holds ``artifact`` for ``recipe`` (model.onnx -> export): the last
    enabled stage of ``stages`` that writes it, or with ``first`` the first one (network.py: the
    plain rebuild, before any folding). The one answer to "which stage writes X": the runner, the
    run context, the commands and the package ask it. Raises ``KeyError`` when none does."""
    writers = [st.name for st in stages if artifact in st.writes and st.enabled(recipe)]
    if not writers:
        raise KeyError(f"no enabled stage writes {artifact!r}")
    return writers[0] if first else writers[-1]
