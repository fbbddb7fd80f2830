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
