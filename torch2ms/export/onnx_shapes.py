"""An ONNX source's open dimensions (a ``dim_param``, or ``dim_value`` -1 or 0 as PaddlePaddle's
exporter writes a batch) made the recipe's, so ``model.onnx`` declares what the run checked.

Graph inputs take the recipe's ``inputs[].shape``; outputs take the sizes onnxruntime produced on
the samples. Two dimensions stay open, named as the PyTorch export names them
(``export.exporters``): dimension 0 as ``batch`` when a recipe input serves several batch sizes
(``inputs[].batch``), and, when an input has a ``sequence`` profile, its dimension 1 as
``sequence`` and every open output dimension but the batch, whose sizes follow the sequence. The
board tools then see static shapes (ATC and MindSpore Lite compile a fixed shape, or the batch
profiles the bundle writes) and the bundle's compatibility check finds no dynamic output.
"""

from __future__ import annotations

import numpy as np


def _open(d) -> bool:
    return bool(d.dim_param) or not d.HasField("dim_value") or d.dim_value <= 0


def _shown(dims) -> list:
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in dims]


def fix_dimensions(model, recipe, outputs: dict[str, np.ndarray]) -> list[str]:
    """Sets ``model``'s open input and output dimensions in place (module docstring) from the
    recipe and ``outputs`` (one sample's, by output name); returns one line per value changed."""
    batched = any(len(i.batch_sizes()) > 1 for i in recipe.inputs)
    sequence = any(i.sequence for i in recipe.inputs)
    specs = {i.name: i for i in recipe.inputs}
    changed = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            if v.name not in (specs if kind == "input" else outputs):
                continue  # an initializer listed among the inputs
            shape = tuple(specs[v.name].shape) if kind == "input" else np.shape(outputs[v.name])
            dims = v.type.tensor_type.shape.dim
            before = _shown(dims)
            if len(dims) != len(shape):  # no rank declared: every dimension open
                v.type.tensor_type.shape.ClearField("dim")
                for _ in shape:
                    dims.add()
            seq_input = kind == "input" and specs[v.name].sequence
            for k, d in enumerate(dims):
                if not _open(d):
                    continue
                if k == 0 and batched:
                    d.dim_param = "batch"
                elif (seq_input and k == 1) or (kind == "output" and sequence):
                    d.dim_param = d.dim_param or "sequence"
                else:
                    d.dim_value = int(shape[k])
            if _shown(dims) != before:
                changed.append(f"{kind} {v.name!r}: {before} -> {_shown(dims)}")
    return changed
