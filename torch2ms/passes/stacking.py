"""``torch.stack`` and its inverse as one node each, as PyTorch writes them: ``torch2ms.Stack``
(``ops.stack``) and ``torch2ms.Unstack`` (``ops.unstack``).

The exporter writes ``torch.stack(xs, a)`` as one ``Unsqueeze(axes=[a])`` per tensor and a
``Concat(axis=a)``, and indexing every position of a tensor in turn (a decode graph's
``keys[layer]`` for each layer of a stacked KV cache, ``boxes[0], boxes[1], ...``) as one ``Gather``
per position with a scalar constant index. In MindSpore each Gather is a ``StridedSlice`` kernel
and each Unsqueeze a ``Reshape`` before the ``Concat``; one ``Unstack`` or ``Stack`` does the same
in a single kernel, and the generated code reads as one would write it (``keys_0, keys_1, ... =
ops.unstack(keys, axis=0)``). On Ascend they are ``Unpack`` and ``Pack``, AI Core ops
(torch2ms/ascend/ascend310.json). What they save on CPU: benchmarks/results/generation_bench.md.

``GathersToUnstack``: a tensor with a static shape whose consumers include, for one axis of ``n``
positions, ``Gather(data, i)`` with a scalar constant ``i`` for every ``i`` in ``0..n-1``; not when a
position is missing or taken twice. ``UnsqueezesToStack``: a ``Concat`` of two or more inputs, each
an ``Unsqueeze`` at the Concat's axis used by nothing else. Neither fires when the nodes belong to
different PyTorch modules (one statement cannot sit in two module classes).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch2ms.graph.ir import Graph, Node
from torch2ms.graph.names import node_module
from torch2ms.passes.base import Pass, remove_node, replace_node, topological

ONNX = ("", "ai.onnx")


@dataclass
class UnstackMatch:
    data: str
    axis: int
    n: int
    picks: dict[int, list[Node]]  # position -> the Gathers that take it


def _position(graph: Graph, node: Node, data: str, rank: int) -> tuple[int, int] | None:
    """(axis, index) of a Gather of ``data`` by a scalar constant, or None."""
    if node.op_type != "Gather" or node.domain not in ONNX or node.inputs[0] != data or len(node.inputs) != 2:
        return None
    index = graph.const(node.inputs[1])
    if index is None or index.ndim != 0 or index.dtype.kind not in "iu":
        return None
    return int(node.attrs.get("axis", 0)) % rank, int(index)


class GathersToUnstack(Pass):
    name = "gathers_to_unstack"

    def match(self, graph: Graph, node: Node):
        value = graph.values.get(node.inputs[0]) if node.inputs else None
        if value is None or not value.shape or value.is_const:
            return None
        data, shape = node.inputs[0], value.shape
        first = _position(graph, node, data, len(shape))
        if first is None:
            return None
        axis, n = first[0], int(shape[first[0]])
        picks: dict[int, list[Node]] = {}
        for user in graph.consumers(data):
            at = _position(graph, user, data, len(shape))
            if at is not None and at[0] == axis:
                picks.setdefault(at[1] % n, []).append(user)
        return UnstackMatch(data, axis, n, picks)

    def check(self, graph: Graph, m: UnstackMatch) -> str | None:
        if m.n < 2:
            return f"axis {m.axis} has {m.n} position"
        if len(m.picks) != m.n:
            return f"the Gathers take {len(m.picks)} of axis {m.axis}'s {m.n} positions"
        if any(len(nodes) > 1 for nodes in m.picks.values()):
            return "a position is taken by more than one Gather"
        modules = _modules(graph, [nodes[0] for nodes in m.picks.values()])
        if len(modules) > 1:
            return f"the Gathers are in {len(modules)} modules ({', '.join(sorted(modules))})"
        return None

    def rewrite(self, graph: Graph, m: UnstackMatch) -> None:
        gathers = [m.picks[i][0] for i in range(m.n)]
        first = topological(graph, gathers)[0]
        unstack = Node(
            name=first.name,
            op_type="Unstack",
            domain="torch2ms",
            inputs=[m.data],
            outputs=[g.outputs[0] for g in gathers],
            attrs={"axis": m.axis},
            origin=[first.name] + [g.name for g in gathers if g is not first],
        )
        replace_node(graph, first, unstack)
        for g in gathers:
            if g is not first:
                remove_node(graph, g)


@dataclass
class StackMatch:
    concat: Node
    unsqueezes: list[Node]
    axis: int


def _unsqueezed_axis(graph: Graph, node: Node) -> int | None:
    """The one axis an Unsqueeze inserts (counted in its output's rank), or None."""
    if node.op_type != "Unsqueeze" or node.domain not in ONNX:
        return None
    axes = graph.const(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    out = graph.values.get(node.outputs[0])
    if axes is None or out is None or not out.shape or len(list(axes)) != 1:
        return None
    return int(list(axes)[0]) % len(out.shape)


def _modules(graph: Graph, nodes) -> set[str]:
    return {".".join(node_module(n, graph.scopes)) for n in nodes}


class UnsqueezesToStack(Pass):
    name = "unsqueezes_to_stack"

    def match(self, graph: Graph, node: Node):
        if node.op_type != "Concat" or node.domain not in ONNX or len(node.inputs) < 2:
            return None
        out = graph.values.get(node.outputs[0])
        if out is None or not out.shape:
            return None
        producers = [graph.producer(i) for i in node.inputs]
        if any(p is None for p in producers):
            return None
        return StackMatch(node, producers, int(node.attrs.get("axis", 0)) % len(out.shape))

    def check(self, graph: Graph, m: StackMatch) -> str | None:
        for p in m.unsqueezes:
            if _unsqueezed_axis(graph, p) != m.axis:
                return f"input {p.outputs[0]!r} is not an Unsqueeze at axis {m.axis}"
            if graph.use_count(p.outputs[0]) != 1 or p.outputs[0] in graph.outputs:
                return f"{p.outputs[0]!r} is used besides the Concat"
        if len({id(p) for p in m.unsqueezes}) != len(m.unsqueezes):
            return "one Unsqueeze feeds the Concat twice"
        modules = _modules(graph, [m.concat, *m.unsqueezes])
        if len(modules) > 1:
            return f"the nodes are in {len(modules)} modules ({', '.join(sorted(modules))})"
        return None

    def rewrite(self, graph: Graph, m: StackMatch) -> None:
        stack = Node(
            name=m.concat.name,
            op_type="Stack",
            domain="torch2ms",
            inputs=[p.inputs[0] for p in m.unsqueezes],
            outputs=[m.concat.outputs[0]],
            attrs={"axis": m.axis},
            origin=[m.concat.name] + [p.name for p in m.unsqueezes],
        )
        replace_node(graph, m.concat, stack)
        for p in m.unsqueezes:
            remove_node(graph, p)
