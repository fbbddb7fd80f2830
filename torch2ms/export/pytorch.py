"""PyTorch's outputs on the sample inputs: the reference every later stage is checked against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch2ms.errors import ModelError
from torch2ms.export.hooks import activation_range, batchnorm_layers_run


@dataclass
class PyTorchRun:
    """PyTorch's outputs per sample (output name -> array, in the model's order) and what the hooks
    saw while it ran: ``reached`` (``hooks.activation_range``), ``batchnorm_run`` (BatchNorm layer
    calls in one pass)."""

    outputs: list[dict[str, np.ndarray]]
    reached: dict
    batchnorm_run: int

    @property
    def names(self) -> list[str]:
        return list(self.outputs[0])


def run_samples(recipe, model, samples) -> PyTorchRun:
    """``model`` on every sample, hooked; a model that raises or returns no tensor is a
    ``ModelError`` naming the recipe's input shapes."""
    import torch

    from torch2ms.model_loader import flatten_outputs

    try:
        with torch.no_grad(), activation_range(model) as reached, batchnorm_layers_run(model) as batchnorm_run:
            raw_out = [model(*[torch.from_numpy(v) for v in s.values()]) for s in samples]
    except Exception as err:
        shapes = ", ".join(f"{i.name} {list(i.shape)}" for i in recipe.inputs)
        raise ModelError(
            f"{recipe.model.factory}: the model raised on the recipe's inputs ({shapes}): {type(err).__name__}: {err}",
            hint="check inputs[].shape against what the model expects",
        ) from None
    torch_out = [flatten_outputs(o) for o in raw_out]
    if not torch_out[0]:
        raise ModelError(f"{recipe.model.factory}: the model returned no tensors ({type(raw_out[0]).__name__})")
    outputs = [{k: v.detach().numpy().copy() for k, v in o.items()} for o in torch_out]
    return PyTorchRun(outputs, reached, int(batchnorm_run))


def outputs_of(model, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model``'s flattened outputs on one sample, unhooked (the extra batch sizes)."""
    import torch

    from torch2ms.model_loader import flatten_outputs

    with torch.no_grad():
        out = flatten_outputs(model(*[torch.from_numpy(v) for v in sample.values()]))
    return {k: v.detach().numpy().copy() for k, v in out.items()}


def onnx_counts(path) -> tuple[dict, int]:
    """The record's counts of ``model.onnx`` (nodes, BatchNorm nodes, nodes per op type) and its opset."""
    import onnx

    from torch2ms.graph.validate import model_opset

    model_proto = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for n in model_proto.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    counts = {
        "onnx_nodes": len(model_proto.graph.node),
        "batchnorm_nodes": ops.get("BatchNormalization", 0),
        "onnx_ops": dict(sorted(ops.items())),
    }
    return counts, model_opset(model_proto)
