"""Graph-matching helpers every pass shares: which node consumes or produces a value, and a
value's constant as a number. A pass imports these from here, never another pass's privates."""

from __future__ import annotations

from torch2ms.graph.ir import Graph, Node

# the domains of standard ONNX ops ("" and its long name)
ONNX = ("", "ai.onnx")


def single_consumer(graph: Graph, value: str) -> Node | None:
    """The one node that reads ``value``, once; None when ``value`` is a graph output, unused,
    read by several nodes or twice by one."""
    if value in graph.outputs:
        return None
    users = graph.consumers(value)
    return users[0] if len(users) == 1 and users[0].inputs.count(value) == 1 else None


def producer_of(graph: Graph, value: str, op: str) -> Node | None:
    """The standard ONNX ``op`` node that writes ``value``, else None."""
    n = graph.producer(value) if value else None
    return n if n is not None and n.op_type == op and n.domain in ONNX else None


def float_const(graph: Graph, value: str) -> float | None:
    """A one-element float constant as a Python float, else None."""
    c = graph.const(value) if value else None
    if c is None or c.size != 1 or c.dtype.kind != "f":
        return None
    return float(c.reshape(()))
