"""State shared by the stages of one run: the recipe, the run folder, the PyTorch reference,
and an in-process cache so that no stage redoes a previous one's work (the ONNX graph is loaded
and shape-inferred once, ``graph.cache.onnx_graph``). The torch
model is not kept: only the export stage needs it, and it would hold a copy of the weights through
every later stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torch2ms.pipeline.stage import writer_of
from torch2ms.pipeline.workspace import RunDir, load_npz, split_batches, split_lengths, split_reference
from torch2ms.recipe import Recipe

# the cache key under which a stage hands the runner the verdict it reached on its own tensor bounds
# (the export's float64 arbitration, ``export.verdict``)
VERDICT_KEY = "export_verdict"
# the first item of the cache keys under which the run's loaded ONNX graphs are held (``graph.cache``)
GRAPHS = "graph"


@dataclass
class RunContext:
    recipe: Recipe
    run: RunDir
    log: Callable[[str], None] = print
    cache: dict[str, Any] = field(default_factory=dict)
    stages: list | None = None  # the pipeline's Stage objects (the runner's; torch2ms.stages.pipeline_stages())
    # the bound the running stage's outputs are held to (compare.Tolerance), set by the runner before
    # its run when it does not depend on the outputs (every stage but the noise floor's): a stage with
    # several candidate outputs (compile's variants) keeps one that passes
    tolerance: Any = None
    # the task's gate on the running stage's outputs (outputs per sample -> the violation or None), set
    # with ``tolerance``: compile holds each variant to the task (detection boxes, text) as to the bound
    task_gate: Callable[[list[dict]], str | None] | None = None

    def stage_dir(self, stage: str) -> Path:
        return self.run.stage_dir(stage)

    def pipeline(self) -> list:
        """The run's Stage objects, as the runner or the caller that made this context gave them."""
        if self.stages is None:
            raise TypeError(
                "RunContext.stages is not set: pass the run's stages (torch2ms.stages.pipeline_stages()) to find "
                "which stage writes an artifact"
            )
        return self.stages

    def artifact(self, name: str, first: bool = False) -> Path:
        """Where the stage that writes ``name`` keeps it (model.onnx, reference.npz, network.py...):
        the last enabled stage of the pipeline that declares it in ``writes`` (``first``: the first,
        e.g. the unfolded network.py)."""
        return self.stage_dir(writer_of(name, self.recipe, self.pipeline(), first)) / name

    # --- the reference data (sample inputs and PyTorch's outputs) ---
    def reference(self) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """(inputs, outputs) per sample, from reference.npz."""
        if "reference" not in self.cache:
            arrays = load_npz(self.artifact("reference.npz"))
            self.cache["reference"] = split_reference(arrays)
        return self.cache["reference"]

    def batch_reference(self) -> dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        """Batch size -> (inputs, PyTorch's outputs) of one sample per extra ``inputs[].batch`` size."""
        if "batch_reference" not in self.cache:
            self.cache["batch_reference"] = split_batches(load_npz(self.artifact("reference.npz")))
        return self.cache["batch_reference"]

    def sequence_reference(self) -> dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        """Sequence length -> (inputs, PyTorch's outputs) of one sample per extra ``inputs[].sequence`` length."""
        if "sequence_reference" not in self.cache:
            self.cache["sequence_reference"] = split_lengths(load_npz(self.artifact("reference.npz")))
        return self.cache["sequence_reference"]

    def reference_inputs(self) -> list[dict[str, np.ndarray]]:
        return self.reference()[0]

    def drop_graphs(self) -> None:
        """Forget the loaded ONNX graphs (their weights are a copy of the model's), once no later
        stage generates code from them."""
        for key in [k for k in self.cache if isinstance(k, tuple) and k[:1] == (GRAPHS,)]:
            del self.cache[key]
