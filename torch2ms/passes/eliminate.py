"""Remove nodes that compute nothing at inference: Identity and Dropout (its output equals its
input outside training)."""

from __future__ import annotations

from torch2ms.graph.ir import Graph, Node
from torch2ms.passes.base import Pass, remove_node


class EliminateIdentity(Pass):
    name = "eliminate_identity"

    def match(self, graph: Graph, node: Node):
        if node.op_type in ("Identity", "Dropout") and node.domain in ("", "ai.onnx"):
            return node
        return None

    def check(self, graph: Graph, node: Node) -> str | None:
        if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1] and graph.use_count(node.outputs[1]):
            return "the Dropout mask output is used"
        if node.outputs[0] in graph.outputs and node.inputs[0] in graph.inputs:
            return "it connects a graph input straight to a graph output"
        return None

    def rewrite(self, graph: Graph, node: Node) -> None:
        src, dst = node.inputs[0], node.outputs[0]
        remove_node(graph, node)
        if dst in graph.outputs:
            # Keep the graph output's name: rename the producer's output instead.
            producer = graph.producer(src)
            if producer is not None and src not in graph.outputs and graph.use_count(src) == 0:
                producer.outputs = [dst if o == src else o for o in producer.outputs]
                graph.values[dst] = graph.values[src]
                graph.values[dst].name = dst if graph.values[src].name == src else graph.values[dst].name
                return
        graph.replace_uses(dst, src)
