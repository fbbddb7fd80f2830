"""Batch-agnostic generated code: which integers of the code carry the batch.

ONNX shapes are static here: the loader infers every shape (and folds every ``Shape`` into a
constant) at the recipe's batch ``B``, so a reshape target, a ``broadcast_to`` size, an
``ops.zeros`` shape or a folded ``Shape -> Gather`` scalar holds ``B`` (or ``B * 1024``) as a
plain number. Which numbers those are is found by asking the model itself: the same ONNX is loaded
a second time at batch ``B + 1`` (dimension 0 of the batch inputs), passed through the same passes,
and every node is converted against both graphs. The two expressions are the same text except
for the integers that carry the batch, and each such integer is linear in it::

    n(B) = a * B + c,   a = (n(B + 1) - n(B)),   c = n(B) - a * B

It is written as ``batch``, ``batch * a`` or ``batch * a + c``, where the first statement of
``construct`` is ``batch = <input>.shape[0]``. At ``B`` every rewritten expression has the value
of the literal it replaces, so the code is exact at the recipe's batch whatever happens; other
sizes are checked by running it there (the mindir stage and ``verify`` at every listed batch).

Anything else that differs between the two conversions (a layer argument, a stored constant, a
float, the graph itself) means the network's code depends on the batch in a way a symbol cannot
express: ``BatchDependent`` says where.
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass

import numpy as np

from torch2ms.converters.api import literal
from torch2ms.graph.ir import Graph, Node, Value

# After these tokens (and before the closing ones) a compound ``batch * a + c`` needs no parentheses.
_OPENERS = {"(", "[", "{", ",", "=", ":"}
_CLOSERS = {")", "]", "}", ",", ":"}


class BatchDependent(Exception):
    """The generated code depends on the batch in a way ``batch`` cannot express; says where."""


@dataclass
class BatchVariant:
    """The graph loaded (and passed) at a second batch size, to compare every node against."""

    graph: Graph
    batch: int  # the primary graph's batch (the recipe's shape[0])
    other: int  # this graph's batch
    source: str  # the graph input whose dimension 0 is the batch

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in self.graph.nodes}

    def node_for(self, node: Node) -> Node:
        other = self.nodes.get(node.name)
        if other is None or other.op_type != node.op_type or other.inputs != node.inputs:
            raise BatchDependent(f"{node.op_type} node {node.name!r} is not in the graph at batch {self.other}")
        return other


def same_structure(graph: Graph, other: Graph, batch: int, other_batch: int) -> None:
    """Raise ``BatchDependent`` unless both graphs have the same nodes in the same order."""
    a = [(n.name, n.op_type, n.inputs, n.outputs) for n in graph.nodes]
    b = [(n.name, n.op_type, n.inputs, n.outputs) for n in other.nodes]
    if a == b:
        return
    for x, y in zip(a, b):
        if x != y:
            raise BatchDependent(
                f"the graph differs between batch {batch} and {other_batch} at node {x[0]!r} ({x[1]}) vs {y[0]!r}"
                f" ({y[1]}): the passes or the folding depend on the batch"
            )
    raise BatchDependent(f"the graph has {len(a)} nodes at batch {batch} and {len(b)} at batch {other_batch}")


def batch_expr(a: int, c: int, name: str) -> str:
    """``a * batch + c`` as code: ``batch``, ``batch * 4``, ``batch * 4 + 1``."""
    text = name if a == 1 else f"{name} * {a}"
    if c:
        text += f" + {c}" if c > 0 else f" - {-c}"
    return text


def _tokens(expr: str) -> list[tokenize.TokenInfo]:
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT}
    return [t for t in tokenize.generate_tokens(io.StringIO(expr).readline) if t.type not in skip]


def merge(expr: str, other: str, batch: int, other_batch: int, name: str, where: str) -> tuple[str, bool]:
    """``expr`` with every integer that differs in ``other`` written in terms of ``name``;
    ``(code, whether name was used)``. Anything else that differs raises ``BatchDependent``."""
    if expr == other:
        return expr, False
    mismatch = BatchDependent(
        f"{where}: the code differs beyond its sizes between batch {batch} and {other_batch}: {expr!r} vs {other!r}"
    )
    try:
        ta, tb = _tokens(expr), _tokens(other)
    except (tokenize.TokenError, SyntaxError):
        raise mismatch from None
    if len(ta) != len(tb):
        raise mismatch
    lines = expr.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits = []
    for k, (x, y) in enumerate(zip(ta, tb)):
        if x.type == y.type and x.string == y.string:
            continue
        if x.type != tokenize.NUMBER or y.type != tokenize.NUMBER:
            raise mismatch
        try:
            n, m = int(x.string), int(y.string)
        except ValueError:  # a float that moves with the batch (a scale): not a size
            raise mismatch from None
        a, rest = divmod(m - n, other_batch - batch)
        if rest or a == 0:
            raise mismatch
        text = batch_expr(a, n - a * batch, name)
        before = ta[k - 1].string if k else "("
        after = ta[k + 1].string if k + 1 < len(ta) else ")"
        if " " in text and (before not in _OPENERS or after not in _CLOSERS):
            text = f"({text})"
        (r0, c0), (r1, c1) = x.start, x.end
        edits.append((starts[r0 - 1] + c0, starts[r1 - 1] + c1, text))
    for begin, end, text in reversed(edits):
        expr = expr[:begin] + text + expr[end:]
    return expr, True


def batch_row(first: np.ndarray, other: np.ndarray) -> np.ndarray | None:
    """A folded constant whose shape moves with the batch (``torch.zeros(x.shape[0], 4)``, an
    ``expand`` to the input's batch): its first slice along the axes that move, when the constant
    repeats it along them at both sizes (then ``ops.broadcast_to`` of that slice rebuilds it at
    any batch); else None."""
    if first.ndim != other.ndim or first.dtype != other.dtype:
        return None
    axes = tuple(k for k, (a, b) in enumerate(zip(first.shape, other.shape)) if a != b)
    if not axes or any(first.shape[k] == 0 for k in axes):
        return None
    index = tuple(slice(0, 1) if k in axes else slice(None) for k in range(first.ndim))
    row = first[index]
    if not np.array_equal(row, other[index]):
        return None
    if not (
        np.array_equal(np.broadcast_to(row, first.shape), first)
        and np.array_equal(np.broadcast_to(row, other.shape), other)
    ):
        return None
    return np.ascontiguousarray(row)


class Recorder:
    """Wraps the code builder during the first conversion of a node and logs what the emitter
    declared (stored tensors, layers, helper definitions) with the names it got back. A folded
    constant whose shape moves with the batch is stored as one slice and broadcast (``batch_row``)."""

    def __init__(self, inner, other: Graph):
        self.inner = inner
        self.other = other
        self.log: list[tuple] = []

    def var(self, value: str) -> str:
        return self.inner.var(value)

    def const_expr(self, value: Value) -> str:
        twin = self.other.values.get(value.name)
        if not _scalar(value) and twin is not None and twin.const is not None and twin.const.shape != value.const.shape:
            row = batch_row(value.const, twin.const)
            if row is not None:
                name = self.inner.tensor(row, value.name)
                self.log.append(("broadcast", row, name))
                return f"ops.broadcast_to({name}, {tuple(value.const.shape)!r})"
        out = self.inner.const_expr(value)
        if not _scalar(value):
            self.log.append(("tensor", value.const, out))
        return out

    def add_layer(self, node, callee, args, kwargs, params) -> str:
        out = self.inner.add_layer(node, callee, args, kwargs, params)
        self.log.append(("layer", (callee, args, kwargs, params), out))
        return out

    def tensor(self, array, hint) -> str:
        out = self.inner.tensor(array, hint)
        self.log.append(("tensor", np.asarray(array), out))
        return out

    def define(self, name: str, source: str) -> str:
        out = self.inner.define(name, source)
        self.log.append(("define", source, out))
        return out


class Replay:
    """The sink of the second conversion of a node (at the other batch): hands back the names the
    first conversion got, after checking it declared the same things."""

    def __init__(self, inner, log: list[tuple], where: str, batches: tuple[int, int]):
        self.inner = inner
        self.log = list(log)
        self.where = where
        self.batches = batches

    def _next(self, kind: str, what: str):
        if not self.log or self.log[0][0] != kind:
            raise BatchDependent(f"{self.where}: declares {what} only at batch {self.batches[1]}")
        return self.log.pop(0)[1:]

    def var(self, value: str) -> str:
        return self.inner.var(value)

    def const_expr(self, value: Value) -> str:
        if _scalar(value):
            return literal(value.const.item())
        if self.log and self.log[0][0] == "broadcast":
            row, name = self._next("broadcast", "a constant")
            return f"ops.broadcast_to({name}, {tuple(value.const.shape)!r})"
        return self.tensor(value.const, value.name)

    def tensor(self, array, hint) -> str:
        first, out = self._next("tensor", f"a constant ({hint})")
        array = np.asarray(array)
        if first.shape != array.shape or first.dtype != array.dtype or not np.array_equal(first, array):
            b, o = self.batches
            raise BatchDependent(
                f"{self.where}: the constant {hint!r} depends on the batch (shape {list(first.shape)} at batch {b}, "
                f"{list(array.shape)} at batch {o}); it is stored, not computed, so it cannot follow the input"
            )
        return out

    def add_layer(self, node, callee, args, kwargs, params) -> str:
        (c, a, k, p), out = self._next("layer", f"a layer {callee}")
        same = (c, [literal(x) for x in a], {n: literal(v) for n, v in k.items()}) == (
            callee,
            [literal(x) for x in args],
            {n: literal(v) for n, v in kwargs.items()},
        )
        if not same or {n: np.shape(v) for n, v in p.items()} != {n: np.shape(v) for n, v in params.items()}:
            raise BatchDependent(f"{self.where}: the arguments of layer {callee} depend on the batch")
        return out

    def define(self, name: str, source: str) -> str:
        first, out = self._next("define", f"a helper {name}")
        if first != source:
            raise BatchDependent(f"{self.where}: the helper {name} depends on the batch")
        return out

    def done(self) -> None:
        if self.log:
            raise BatchDependent(f"{self.where}: declares a {self.log[0][0]} only at batch {self.batches[0]}")


def _scalar(value: Value) -> bool:
    return value.const.ndim == 0 and value.const.dtype.kind in "fiub"
