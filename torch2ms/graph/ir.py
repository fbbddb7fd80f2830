"""A small, mutable graph IR: values with static shapes (and constant data when known) and
nodes in topological order. Passes rewrite it; converters read it; codegen walks it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Value:
    name: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    # ONNX nodes this one stands for (a fused node lists all it replaced).
    origin: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.origin:
            self.origin = [self.name]


def fresh(base: str, taken) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


class Graph:
    def __init__(
        self,
        nodes: list[Node],
        values: dict[str, Value],
        inputs: list[str],
        outputs: list[str],
        opset: int,
        name: str = "network",
    ):
        self.nodes = nodes
        self.values = values
        self.inputs = inputs
        self.outputs = outputs
        self.opset = opset
        self.name = name
        # ONNX node name -> the PyTorch module path that made it ("backbone.layer1.0.conv1"), where the
        # exporter recorded it in the node's metadata (the dynamo exporter's name_scopes); the
        # TorchScript exporter's node names carry it themselves ("/backbone/layer1/layer1.0/conv1/Conv")
        self.scopes: dict[str, str] = {}

    def producer(self, value: str) -> Node | None:
        for n in self.nodes:
            if value in n.outputs:
                return n
        return None

    def consumers(self, value: str) -> list[Node]:
        return [n for n in self.nodes if value in n.inputs]

    def use_count(self, value: str) -> int:
        return sum(n.inputs.count(value) for n in self.nodes) + self.outputs.count(value)

    def const(self, value: str) -> np.ndarray | None:
        v = self.values.get(value)
        return None if v is None else v.const

    def add_const(self, name: str, array: np.ndarray) -> str:
        name = fresh(name, self.values)
        self.values[name] = Value(name, tuple(array.shape), array.dtype, array)
        return name

    def replace_uses(self, old: str, new: str) -> None:
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove_dead(self) -> int:
        """Drop nodes none of whose outputs is used; return how many went."""
        removed = 0
        while True:
            used = {i for n in self.nodes for i in n.inputs} | set(self.outputs)
            keep = [n for n in self.nodes if any(o in used for o in n.outputs)]
            if len(keep) == len(self.nodes):
                break
            removed += len(self.nodes) - len(keep)
            self.nodes = keep
        live = used | set(self.inputs)
        self.values = {
            k: v for k, v in self.values.items() if k in live or k in {o for n in self.nodes for o in n.outputs}
        }
        return removed

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return dict(sorted(counts.items()))
