"""Turn ``MatMul(x, W)`` (+ ``Add(b)``) with a constant 2-D ``W`` into one ``torch2ms.Linear``
node, which the code generator writes as ``nn.Dense`` named after the PyTorch module.

The TorchScript exporter writes ``nn.Linear`` on a tensor of rank > 2 (every transformer MLP
and attention projection) as ``MatMul`` by the transposed weight followed by ``Add`` of the
bias, instead of ``Gemm``. Without this pass the generated code holds ``ops.matmul(x,
self.const_mat_mul_600)`` and a separate ``self.<...>_bias + ...``; with it, ``self.mlp_0(x)``
with ``nn.Dense(768, 3072)``. ``nn.Dense`` flattens the leading dimensions itself, so it runs
one 2-D matmul (no broadcast copy of the weight in GRAPH_MODE).

Pattern: ``MatMul`` whose second input is a constant 2-D matrix and whose first input has rank
>= 2; if its output's only consumer is an ``Add`` of a constant with one value per output
feature (shape ``(N,)`` or ``(1, ..., N)``), the bias is taken in too. It does not fire on a
runtime weight (attention's ``q @ k^T``), or when ``x`` is 1-D.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass, remove_node, replace_node


@dataclass
class LinearMatch:
    matmul: Node
    add: Node | None
    bias: str  # the bias value's name, or ""


def _bias_of(graph: Graph, add: Node, matmul_out: str, n: int) -> str:
    others = [i for i in add.inputs if i != matmul_out]
    if len(add.inputs) != 2 or len(others) != 1:
        return ""
    c = graph.const(others[0])
    if c is None or c.dtype.kind != "f" or c.size != n or (c.ndim and c.shape[-1] != n):
        return ""
    return others[0]


class MatMulToLinear(Pass):
    name = "matmul_to_linear"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            return None
        w = graph.const(node.inputs[1])
        if w is None or w.ndim != 2:
            return None
        out = node.outputs[0]
        users = graph.consumers(out)
        add, bias = None, ""
        if len(users) == 1 and users[0].op_type == "Add" and out not in graph.outputs:
            bias = _bias_of(graph, users[0], out, w.shape[1])
            add = users[0] if bias else None
        return LinearMatch(node, add, bias)

    def check(self, graph: Graph, m: LinearMatch) -> str | None:
        if len(graph.values[m.matmul.inputs[0]].shape or ()) < 2:
            return "input is 1-D (a vector-matrix product, not a layer)"
        if graph.const(m.matmul.inputs[1]).dtype != np.float32:
            return "weight is not float32"
        if m.add is not None:
            out_rank = len(graph.values[m.add.outputs[0]].shape or ())
            if out_rank != len(graph.values[m.matmul.outputs[0]].shape or ()):
                return "the bias broadcasts to a higher rank"
        return None

    def rewrite(self, graph: Graph, m: LinearMatch) -> None:
        last = m.add or m.matmul
        fused = Node(
            name=m.matmul.name,
            op_type="Linear",
            domain="torch2ms",
            inputs=[m.matmul.inputs[0], m.matmul.inputs[1]] + ([m.bias] if m.bias else []),
            outputs=[last.outputs[0]],
            attrs={},
            origin=[n.name for n in (m.matmul, m.add) if n is not None],
        )
        replace_node(graph, m.matmul, fused)
        if m.add is not None:
            remove_node(graph, m.add)
