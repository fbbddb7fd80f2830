"""The prefill and decode graphs to ONNX, and onnxruntime running them as a generation runner.

Each graph goes through the export stage's exporter chain (``export.exporters.export_onnx``) at
static shapes: batch ``B``, prompt length ``P``, cache length ``L``. The example inputs only fix
those shapes (the trace has no branch on their values). onnxruntime runs the files as a
REFERENCE session (``graph.onnxrt``), the one every check compares with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from torch2ms.generation.loop import DECODE_INPUTS, OUTPUTS, PREFILL_INPUTS, Runner

if TYPE_CHECKING:
    from torch2ms.generation.geometry import Geometry
    from torch2ms.generation.graphs import Decode, Prefill


@dataclass(frozen=True)
class Exported:
    prefill: Path
    decode: Path
    attempts: dict  # graph -> "exporter at opset N"


def example_inputs(geometry: Geometry, batch: int, prompt_length: int, cache_length: int):
    """Inputs of the static shapes for tracing: ``(prefill inputs, decode inputs)`` as torch tensors."""
    import torch

    ids = torch.zeros(batch, prompt_length, dtype=torch.int32)
    mask = torch.ones(batch, prompt_length, dtype=torch.int32)
    cache = torch.zeros(geometry.cache_shape(batch, cache_length))
    decode = (
        torch.zeros(batch, 1, dtype=torch.int32),
        torch.full((batch,), prompt_length, dtype=torch.int32),
        torch.tensor([prompt_length], dtype=torch.int32),
        torch.ones(batch, cache_length, dtype=torch.int32),
        cache,
        cache.clone(),
    )
    return (ids, mask), decode


def export_graphs(
    prefill: Prefill,
    decode: Decode,
    geometry: Geometry,
    batch: int,
    prompt_length: int,
    folder: Path,
    export_spec=None,
) -> Exported:
    """Write ``prefill.onnx`` and ``decode.onnx`` into ``folder``; ``export_spec``: a recipe's
    ``export`` section (default: the recipe default, TorchScript first)."""
    from torch2ms.export.exporters import export_onnx
    from torch2ms.recipe import ExportSpec

    spec = SimpleNamespace(
        export=export_spec or ExportSpec(), model=SimpleNamespace(factory=type(prefill.model).__name__)
    )
    pre_in, dec_in = example_inputs(geometry, batch, prompt_length, decode.cache_length)
    folder.mkdir(parents=True, exist_ok=True)
    paths, attempts = {}, {}
    for name, module, example, names in (
        ("prefill", prefill, pre_in, PREFILL_INPUTS),
        ("decode", decode, dec_in, DECODE_INPUTS),
    ):
        paths[name] = folder / f"{name}.onnx"
        tried, _ = export_onnx(module.eval(), example, paths[name], (list(names), list(OUTPUTS), None), spec)
        attempts[name] = f"{tried[-1].exporter} at opset {tried[-1].opset}"
    return Exported(paths["prefill"], paths["decode"], attempts)


def onnx_runner(exported: Exported) -> Runner:
    """A runner of the two ONNX files in onnxruntime (``onnx_call`` each)."""
    return Runner(onnx_call(exported.prefill, "prefill"), onnx_call(exported.decode, "decode"))


def onnx_call(path: Path, graph: str):
    """The ``graph`` ("prefill", "decode") exported at ``path`` in onnxruntime (a REFERENCE session),
    a function of numpy arrays in the graph's input order; torch is not imported."""
    import onnx

    from torch2ms.graph.onnxrt import REFERENCE, session

    names = PREFILL_INPUTS if graph == "prefill" else DECODE_INPUTS
    op_types = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    sess = session(path, REFERENCE, op_types)

    def call(*arrays):
        return tuple(sess.run(list(OUTPUTS), {n: np.ascontiguousarray(a) for n, a in zip(names, arrays)}))

    return call
