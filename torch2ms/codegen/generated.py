"""What code generation hands back: the source, its weights and its maps (``GeneratedNetwork``),
written by ``builder.CodeBuilder`` in the flat layout and by ``modules.ModuleLayout`` in the modules one."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GeneratedNetwork:
    source: str
    class_name: str
    params: dict[str, np.ndarray]
    tensor_map: list[dict]
    layer_counts: dict[str, int]
    # the input whose dimension 0 every batch-carrying size follows (None: the code has no batch size in it)
    batch_source: str | None = None
    batch_note: str | None = None  # why the code keeps the batch as a number (it could not follow the input)
    layout: dict = field(default_factory=lambda: {"layout": "flat"})  # how the code is laid out (modules.py)
    # checkpoint parameter -> the ONNX nodes it was made for (what weight_map.json reports)
    param_origin: dict[str, list[str]] = field(default_factory=dict)


def build_function(class_name: str, has_params: bool) -> list[str]:
    """The generated file's ``build()``: the network in inference mode, its weights from network.ckpt."""
    out = [f"def build(checkpoint: str | None = None) -> {class_name}:"]
    if has_params:
        out += [
            '    """The network in inference mode, weights from `checkpoint` (default: network.ckpt here)."""',
            f"    net = {class_name}()",
            '    path = checkpoint or os.path.join(os.path.dirname(os.path.abspath(__file__)), "network.ckpt")',
            "    missing, _ = ms.load_param_into_net(net, ms.load_checkpoint(path), strict_load=True)",
            "    if missing:",
            '        raise ValueError(f"{path} lacks weights for {missing}")',
        ]
    else:  # MindSpore refuses to load an empty checkpoint
        out += [
            '    """The network in inference mode; it has no weights, so `checkpoint` is not read."""',
            f"    net = {class_name}()",
        ]
    return out + ["    net.set_train(False)", "    return net", ""]
