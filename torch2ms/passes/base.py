"""A pass: ``match(graph, node)`` finds a candidate rooted at ``node``, ``check`` returns a
reason it must not fire (or None), ``rewrite`` changes the graph. ``apply`` repeats until no
candidate is left and returns the fire count; the reasons it did not fire are kept in
``skipped`` so a test (or a curious user) can see why.

Nodes are found in ``graph.nodes`` by identity (``replace_node`` / ``remove_node``): ``Node`` is a
dataclass, so ``list.index`` / ``remove`` / ``in`` would compare every field of every node before
it (most of the passes' time on ViT-B/16: benchmarks/results/design_measurements.md)."""

from __future__ import annotations

from typing import Any

from torch2ms.graph.ir import Graph, Node


class Pass:
    name = "pass"

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []  # (node name, reason)

    def match(self, graph: Graph, node: Node) -> Any | None:
        raise NotImplementedError

    def check(self, graph: Graph, match: Any) -> str | None:
        return None

    def rewrite(self, graph: Graph, match: Any) -> None:
        raise NotImplementedError

    def apply(self, graph: Graph) -> int:
        fired = 0
        self.skipped = []
        rejected: set[str] = set()
        progress = True
        while progress:
            progress = False
            alive = {id(n) for n in graph.nodes}
            for node in list(graph.nodes):
                if node.name in rejected or id(node) not in alive:
                    continue
                m = self.match(graph, node)
                if m is None:
                    continue
                reason = self.check(graph, m)
                if reason:
                    rejected.add(node.name)
                    self.skipped.append((node.name, reason))
                    continue
                self.rewrite(graph, m)
                alive = {id(n) for n in graph.nodes}
                fired += 1
                progress = True
        return fired


def replace_node(graph: Graph, old: Node, new: Node) -> None:
    """Put ``new`` where ``old`` is in ``graph.nodes`` (the topological position of ``old``)."""
    graph.nodes[next(i for i, n in enumerate(graph.nodes) if n is old)] = new


def remove_node(graph: Graph, node: Node) -> None:
    graph.nodes = [n for n in graph.nodes if n is not node]


def topological(graph: Graph, nodes: list[Node]) -> list[Node]:
    """``nodes`` in graph order."""
    ids = {id(n) for n in nodes}
    return [n for n in graph.nodes if id(n) in ids]


def run_passes(graph: Graph, passes: list[Pass]) -> dict[str, int]:
    return {p.name: p.apply(graph) for p in passes}
