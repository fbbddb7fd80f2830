"""``CopyReshapesIntoModules``: a cheap shape or dtype op that the exporter shares between two
modules becomes one copy in each module that reads it.

The TorchScript exporter merges equal subexpressions across the whole graph. In a decoder, every
layer's attention computes ``cos.unsqueeze(1)``, ``sin.unsqueeze(1)`` and a cast of the positions;
after the merge only layer 0's attention computes them, and layers 1..N read layer 0's results.
The generated layer 0 then returns tensors that are not its own outputs in PyTorch, the other
layers take them as arguments, and the decoder layer splits into two classes
(``Qwen2DecoderLayer`` and ``Qwen2DecoderLayer2``) where PyTorch has one. Giving each reading module
its own copy puts the statement back where PyTorch's ``forward`` has it.

Only ops that move no data through arithmetic (``COPIED``), whose inputs after the first are
constants and which their own module reads too; only into modules neither of which contains
theirs. A parent reading its child's result, or a module reading the result of the one before it
(the rotary embedding's ``cos.to(dtype)``, read by every layer), is the module structure itself.
Node names must carry the module path (TorchScript export); a dynamo export's nodes keep their
merge. The copy's ``origin`` is the node it copies, so provenance and ``diff`` lead back to the
ONNX node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch2ms.graph.ir import Graph, Node, fresh
from torch2ms.graph.names import module_path
from torch2ms.passes.base import Pass, remove_node

ONNX = ("", "ai.onnx")
COPIED = {"Unsqueeze", "Squeeze", "Reshape", "Cast", "Transpose", "Flatten"}


def _module(node: Node) -> tuple[str, ...] | None:
    return tuple(module_path(node.name)) if node.name.startswith("/") else None


def _within(path: tuple[str, ...], module: tuple[str, ...]) -> bool:
    """``path`` is ``module`` or inside it."""
    return path[: len(module)] == module


@dataclass
class CopyMatch:
    node: Node
    readers: dict[tuple[str, ...], list[Node]]  # module -> its consumers of the node's output


class CopyReshapesIntoModules(Pass):
    name = "copy_reshapes_into_modules"

    def match(self, graph: Graph, node: Node) -> CopyMatch | None:
        if node.op_type not in COPIED or node.domain not in ONNX or len(node.outputs) != 1:
            return None
        own = _module(node)
        if own is None or not node.inputs or any(graph.const(i) is None for i in node.inputs[1:]):
            return None
        readers: dict[tuple[str, ...], list[Node]] = {}
        inside = False
        for user in graph.consumers(node.outputs[0]):
            theirs = _module(user)
            if theirs is None:
                continue
            inside |= _within(theirs, own)
            if not _within(theirs, own) and not _within(own, theirs):
                readers.setdefault(theirs, []).append(user)
        # read in its own module too: an intermediate the exporter let others reuse, not the module's result
        return CopyMatch(node, readers) if readers and inside else None

    def apply(self, graph: Graph) -> int:
        self.copies: dict[tuple[str, str], str] = {}  # (node, the reading module's scope) -> its copy
        return super().apply(graph)

    def rewrite(self, graph: Graph, m: CopyMatch) -> None:
        node, out = m.node, m.node.outputs[0]
        names = {n.name for n in graph.nodes}
        for users in m.readers.values():
            scope = users[0].name.rsplit("/", 1)[0]
            name = fresh(f"{scope}/{node.op_type}", names)
            copy_out = fresh(f"{out}_{len(names)}", graph.values)
            graph.values[copy_out] = replace(graph.values[out], name=copy_out)
            copy = Node(name, node.op_type, list(node.inputs), [copy_out], dict(node.attrs), node.domain, [node.name])
            graph.nodes.insert(self._position(graph, node, scope, users), copy)
            names.add(name)
            self.copies[(node.name, scope)] = name
            for u in users:
                u.inputs = [copy_out if i == out else i for i in u.inputs]
        if not graph.consumers(out) and out not in graph.outputs:
            remove_node(graph, node)

    def _position(self, graph: Graph, node: Node, scope: str, users: list[Node]) -> int:
        """Where the copy goes in ``graph.nodes``: after the twin of the node before ``node`` in its own
        module (the node of the same name in the reading module, or that node's copy there), or first
        in the reading module where ``node`` is first in its own, so that two instances of one class
        list their statements in one order; else before the first reader. Never after the first
        reader nor before an input's producer."""
        own = node.name.rsplit("/", 1)[0]
        at = {n.name: i for i, n in enumerate(graph.nodes)}
        here = next(i for i, n in enumerate(graph.nodes) if n is node)
        readers = {id(u) for u in users}
        first = min(i for i, n in enumerate(graph.nodes) if id(n) in readers)
        before = next((n for n in reversed(graph.nodes[:here]) if n.name.startswith(own + "/")), None)
        if before is None:  # the first of its module: first in the reading module too
            target = next((i for i, n in enumerate(graph.nodes) if n.name.startswith(scope + "/")), first)
        else:
            twin = self.copies.get((before.name, scope), scope + before.name[len(own) :])
            target = at[twin] + 1 if twin in at else first
        made = {o: i for i, n in enumerate(graph.nodes[:here]) for o in n.outputs}
        low = max((made[i] + 1 for i in node.inputs if i in made), default=0)
        return max(low, min(target, first))
