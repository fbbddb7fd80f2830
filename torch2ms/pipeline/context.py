"""State shared by the stages of one run: the recipe, the run folder, the PyTorch reference,
and an in-process cache so that no stage redoes a previous one's work (the torch model is built
once; the ONNX graph is loaded and shape-inferred once)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torch2ms.pipeline.workspace import RunDir, load_npz
from torch2ms.recipe import Recipe


@dataclass
class RunContext:
    recipe: Recipe
    run: RunDir
    log: Callable[[str], None] = print
    cache: dict[str, Any] = field(default_factory=dict)

    def stage_dir(self, stage: str) -> Path:
        return self.run.stage_dir(stage)

    # --- reference data written by the export stage ---
    def reference(self) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """(inputs, outputs) per sample, from export/reference.npz."""
        if "reference" not in self.cache:
            arrays = load_npz(self.stage_dir("export") / "reference.npz")
            self.cache["reference"] = split_reference(arrays)
        return self.cache["reference"]

    def reference_inputs(self) -> list[dict[str, np.ndarray]]:
        return self.reference()[0]

    def onnx_graph(self, path: Path):
        """A fresh copy of the loaded, shape-inferred ONNX graph (loaded once per run)."""
        from torch2ms.graph import load_onnx
        from torch2ms.pipeline.workspace import sha256_file

        key = ("graph", str(path), sha256_file(path))
        if key not in self.cache:
            shapes = {i.name: tuple(i.shape) for i in self.recipe.inputs}
            self.cache[key] = load_onnx(path, shapes)
        return copy.deepcopy(self.cache[key])


def split_reference(arrays: dict[str, np.ndarray]):
    ins = {k[len("input.") :]: v for k, v in arrays.items() if k.startswith("input.")}
    outs = {k[len("output.") :]: v for k, v in arrays.items() if k.startswith("output.")}
    order = arrays.get("meta.output_order")
    if order is not None:
        outs = {str(n): outs[str(n)] for n in order}
    n = len(next(iter(ins.values())))
    return [{k: v[s] for k, v in ins.items()} for s in range(n)], [{k: v[s] for k, v in outs.items()} for s in range(n)]


def pack_reference(inputs: list[dict[str, np.ndarray]], outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    arrays = {f"input.{k}": np.stack([s[k] for s in inputs]) for k in inputs[0]}
    arrays.update({f"output.{k}": np.stack([s[k] for s in outputs]) for k in outputs[0]})
    arrays["meta.output_order"] = np.array(list(outputs[0]))
    return arrays
