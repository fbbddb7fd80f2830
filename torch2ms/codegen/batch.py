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

A folded integer constant whose values move with the batch is an index grid when each element is
affine in its coordinates (transformers' padding mask gathers ``flatten(mask)`` at
``b * seq + s``, folded from ``arange(batch)``)::

    C[i0, i1, ...] = offset + sum_k coef_k * i_k

It is computed in the code (``index_grid(shape, coefs, offset, dtype)``), whose literal shape and
coefficients then follow the batch like any other size.

Anything else that differs between the two conversions (a layer argument, a stored constant, a
float, the graph itself) means the network's code depends on the batch in a way a symbol cannot
express: ``BatchDependent`` says where.
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass

import numpy as np

from torch2ms.converters.api import literal, ms_dtype
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


def affine_grid(array: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """``(offset, coefs)`` when every element of the integer ``array`` is ``offset + sum_k coefs[k]
    * i_k`` at coordinates ``(i_0, i_1, ...)``, else None."""
    if array.dtype.kind not in "iu" or array.size == 0 or array.ndim == 0:
        return None
    offset = int(array.flat[0])
    coefs = tuple(
        int(array[(0,) * k + (1,) + (0,) * (array.ndim - k - 1)]) - offset if n > 1 else 0
        for k, n in enumerate(array.shape)
    )
    grid = np.full(array.shape, offset, np.int64)
    for k, (n, a) in enumerate(zip(array.shape, coefs)):
        if a:
            view = [1] * array.ndim
            view[k] = n
            grid = grid + np.arange(n, dtype=np.int64).reshape(view) * a
    return (offset, coefs) if np.array_equal(grid, array) else None


INDEX_GRID = '''def index_grid(shape, coefs, offset, dtype):
    """The integer tensor of ``shape`` whose element (i0, i1, ...) is offset + sum(coefs[k] * ik):
    an index constant computed here, so that it follows the input's sizes."""
    out = ops.zeros((), dtype) + offset
    for k in range(len(shape)):
        if coefs[k] != 0:
            view = [1] * len(shape)
            view[k] = -1
            out = out + ops.reshape(ops.arange(0, shape[k], 1, dtype=dtype), tuple(view)) * coefs[k]
    return ops.broadcast_to(out, shape)
'''


def grid_expr(sink, array: np.ndarray) -> str:
    """``index_grid(...)`` code for ``array``, an affine index grid."""
    offset, coefs = affine_grid(array)
    name = sink.define("index_grid", INDEX_GRID)
    return f"{name}({tuple(array.shape)!r}, {coefs!r}, {offset}, {ms_dtype(array.dtype)})"


class Recorder:
    """Wraps the code builder during the first conversion of a node and logs what the emitter
    declared (stored tensors, layers, helper definitions) with the names it got back. A stored
    tensor gets a placeholder name until the other conversion has declared its own (``Replay``,
    then ``resolve_tensors``)."""

    def __init__(self, inner, other: Graph):
        self.inner = inner
        self.other = other
        self.log: list[tuple] = []

    def var(self, value: str) -> str:
        return self.inner.var(value)

    def const_expr(self, value: Value) -> str:
        if _scalar(value):
            return literal(value.const.item())
        return self.tensor(value.const, value.name)

    def add_layer(self, node, callee, args, kwargs, params) -> str:
        out = self.inner.add_layer(node, callee, args, kwargs, params)
        self.log.append(("layer", (callee, args, kwargs, params), out))
        return out

    def tensor(self, array, hint) -> str:
        out = f"{_PLACEHOLDER}{len(self.log)}"
        self.log.append(("tensor", (np.asarray(array), hint), out))
        return out

    def define(self, name: str, source: str) -> str:
        out = self.inner.define(name, source)
        self.log.append(("define", source, out))
        return out


class Replay:
    """The sink of the second conversion of a node (at the other batch): hands back the names the
    first conversion got, after checking it declared the same things; ``tensors`` pairs each
    stored tensor's placeholder with both arrays."""

    def __init__(self, inner, log: list[tuple], where: str, batches: tuple[int, int]):
        self.inner = inner
        self.log = list(log)
        self.where = where
        self.batches = batches
        self.tensors: list[tuple[str, str, np.ndarray, np.ndarray]] = []  # placeholder, hint, first, other

    def _next(self, kind: str, what: str):
        if not self.log or self.log[0][0] != kind:
            raise BatchDependent(f"{self.where}: declares {what} only at batch {self.batches[1]}")
        return self.log.pop(0)[1:]

    def var(self, value: str) -> str:
        return self.inner.var(value)

    def const_expr(self, value: Value) -> str:
        if _scalar(value):
            return literal(value.const.item())
        return self.tensor(value.const, value.name)

    def tensor(self, array, hint) -> str:
        (first, first_hint), out = self._next("tensor", f"a constant ({hint})")
        self.tensors.append((out, first_hint, first, np.asarray(array)))
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

    def resolve_tensors(self, expr: str, other_expr: str) -> tuple[str, str]:
        """Both conversions' code with each stored tensor's placeholder replaced: the same array at
        both sizes is stored once; one that moves with the batch is stored as a repeated slice and
        broadcast (``batch_row``), or computed (``affine_grid``); anything else is refused."""
        for placeholder, hint, first, other in reversed(self.tensors):  # placeholder 1 is a prefix of 10
            if first.shape == other.shape and first.dtype == other.dtype and np.array_equal(first, other):
                a = b = self.inner.tensor(first, hint)
            elif (row := batch_row(first, other)) is not None:
                name = self.inner.tensor(row, hint)
                a, b = (f"ops.broadcast_to({name}, {tuple(x.shape)!r})" for x in (first, other))
            elif first.ndim == other.ndim and affine_grid(first) and affine_grid(other):
                a, b = grid_expr(self.inner, first), grid_expr(self.inner, other)
            else:
                size, other_size = self.batches
                raise BatchDependent(
                    f"{self.where}: the constant {hint!r} depends on the batch (shape {list(first.shape)} at batch "
                    f"{size}, {list(other.shape)} at batch {other_size}); it is stored, not computed, so it cannot "
                    "follow the input"
                )
            expr, other_expr = expr.replace(placeholder, a), other_expr.replace(placeholder, b)
        return expr, other_expr


_PLACEHOLDER = "self.__t2ms_batch_tensor_"  # a stored tensor is "self.<name>" (Emitter.tensor)


def _scalar(value: Value) -> bool:
    return value.const.ndim == 0 and value.const.dtype.kind in "fiub"
