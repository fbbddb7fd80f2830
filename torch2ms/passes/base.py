"""A pass: ``match(graph, node)`` finds a candidate rooted at ``node``, ``check`` returns a
reason it must not fire (or None), ``rewrite`` changes the graph. ``apply`` repeats until no
candidate is left and returns the fire count; the reasons it did not fire are kept in
``skipped`` so a test (or a curious user) can see why."""

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
            for node in list(graph.nodes):
                if node.name in rejected or node not in graph.nodes:
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
                fired += 1
                progress = True
        return fired


def run_passes(graph: Graph, passes: list[Pass]) -> dict[str, int]:
    return {p.name: p.apply(graph) for p in passes}
