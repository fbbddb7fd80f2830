"""State shared by the stages of one run: the recipe, the run folder, the PyTorch reference,
and an in-process cache so that no stage redoes a previous one's work (the ONNX graph is loaded
and shape-inferred once, and its weights are held once: every stage's copy shares them). The torch
model is not kept: only the export stage needs it, and it would hold a copy of the weights through
every later stage."""

from __future__ import annotations

import copy
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

    def onnx_graph(self, path: Path, batch: dict[str, int] | None = None, seq: dict[str, int] | None = None):
        """A fresh copy of the loaded, shape-inferred ONNX graph (loaded once per run); ``batch``
        overrides dimension 0 of the inputs it names, ``seq`` dimension 1. A load that failed
        (``OnnxError``: the same file at the same sizes fails the same way) is not tried again: a
        later stage gets the same error at once. A ViT traced with its batch as a constant fails at
        batch 2 in the rebuild stage, and loading it again in fold would cost the memory and time
        of a second load."""
        from torch2ms.errors import OnnxError
        from torch2ms.graph import load_onnx
        from torch2ms.pipeline.workspace import sha256_file

        batch, seq = batch or {}, seq or {}
        key = ("graph", str(path), sha256_file(path), tuple(sorted(batch.items())), tuple(sorted(seq.items())))
        if key not in self.cache:
            shapes = {
                i.name: (batch.get(i.name, i.shape[0]), *((seq.get(i.name, i.shape[1]),) if len(i.shape) > 1 else ()))
                + tuple(i.shape[2:])
                if i.shape
                else ()  # a scalar
                for i in self.recipe.inputs
            }
            try:
                graph = load_onnx(path, shapes)
            except OnnxError as err:
                self.cache[key] = copy.copy(err)  # without its traceback, whose frames hold the model
                raise
            shared = [g for k, g in self.cache.items() if isinstance(k, tuple) and k[:3] == key[:3] and not _failed(g)]
            self.cache[key] = freeze_constants(graph, shared[0] if shared else None)
        if _failed(self.cache[key]):
            raise copy.copy(self.cache[key]) from None
        return shared_copy(self.cache[key])

    def drop_graphs(self) -> None:
        """Forget the loaded ONNX graphs (their weights are a copy of the model's), once no later
        stage generates code from them."""
        for key in [k for k in self.cache if isinstance(k, tuple) and k[:1] == ("graph",)]:
            del self.cache[key]


def _failed(cached) -> bool:
    return isinstance(cached, BaseException)


def freeze_constants(graph, like=None):
    """``graph`` with its constants read-only, so that copies can share them (``shared_copy``): a
    pass that wrote into a weight in place would now raise instead of changing every copy. With
    ``like`` (the same ONNX loaded at another batch size), each constant equal to ``like``'s of the
    same name is replaced by that one: the weights are held once, not once per batch size."""
    for name, v in graph.values.items():
        if v.const is None:
            continue
        other = like.values.get(name) if like is not None else None
        if other is not None and other.const is not None and _same(other.const, v.const):
            v.const = other.const
        else:
            v.const.flags.writeable = False
    return graph


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def shared_copy(graph):
    """A deep copy of ``graph`` that shares its (read-only) constant arrays: nodes, values and
    attributes are the copy's own, the weights are not copied again."""
    memo = {id(v.const): v.const for v in graph.values.values() if v.const is not None and not v.const.flags.writeable}
    return copy.deepcopy(graph, memo)
