"""Forward hooks on the PyTorch model while the export stage runs it on the samples: how many
BatchNorm layers one pass calls (to tell when the exporter folded them away) and the largest
activation any module reaches."""

from __future__ import annotations

import contextlib


def exporter_changes(batchnorm_run: int, batchnorm_nodes: int) -> list[str]:
    """What the exporter changed in the graph, measured: BatchNorm layers that ran in PyTorch but
    are no BatchNormalization node (the dynamo exporter folds them into the conv before them)."""
    if batchnorm_nodes >= batchnorm_run:
        return []
    return [
        f"BatchNorm folded by the exporter ({batchnorm_run - batchnorm_nodes} of {batchnorm_run} layers): "
        "Conv2dBnAct will fuse Conv->Act only"
    ]


@contextlib.contextmanager
def batchnorm_layers_run(model):
    """Count the BatchNorm calls while the block runs, per forward pass: yields a counter whose
    ``int()`` is the number of BatchNorm layer calls in one pass."""
    import torch

    counter = _Counter()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    handles = [m.register_forward_hook(counter.hook) for m in bns]
    handles.append(model.register_forward_hook(counter.end_pass))
    try:
        yield counter
    finally:
        for h in handles:
            h.remove()


class _Counter:
    def __init__(self):
        self.calls = self.passes = 0

    def hook(self, *_):
        self.calls += 1

    def end_pass(self, *_):
        self.passes += 1

    def __int__(self) -> int:
        return self.calls // max(self.passes, 1)


@contextlib.contextmanager
def activation_range(model):
    """Track the largest |value| any module of ``model`` outputs while the block runs (what random
    init reaches: trained-like after calibration, up to ~1e12 without it). Yields a dict that holds
    ``max_abs_activation`` and the module reaching it once the block ends."""
    import torch

    found = {"max_abs_activation": 0.0, "max_abs_activation_at": ""}

    def hook(module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel():
            low, high = torch.aminmax(output.detach())
            value = max(-float(low), float(high))
            if value > found["max_abs_activation"] or value != value:
                found["max_abs_activation"], found["max_abs_activation_at"] = value, names.get(module, "")

    names = {m: n for n, m in model.named_modules() if n}
    handles = [m.register_forward_hook(hook) for m in names]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()
