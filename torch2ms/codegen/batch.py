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

    # a sequence-length profile (``inputs[].sequence``): the graph at (batch, seq_other) and at
    # (other, seq_other), dimension 1 of ``seq_source`` being the length (seq_other = seq + 1, or
    # seq - 1 when seq is the longest listed: a model may take no longer input); sizes then fit
    # n = d + a * batch + c * seq + e * batch * seq (a token axis flattened for a Dense is batch * seq)
    seq: int | None = None
    seq_source: str | None = None
    seq_graphs: tuple[Graph, ...] = ()
    batch_moves: bool = True  # False: only the length is a symbol (no inputs[].batch list)
    # the graph at the longest listed length: a folded table lookup (position embeddings) is stored
    # at that length and sliced to ``seq``
    longest: Graph | None = None
    seq_other: int | None = None

    def __post_init__(self) -> None:
        self.nodes = [{n.name: n for n in g.nodes} for g in self.graphs()]

    def graphs(self) -> list[Graph]:
        """The other graphs, in the order of ``points()[1:]``."""
        if self.seq is None:
            return [self.graph]
        return [self.graph, *self.seq_graphs] if self.batch_moves else list(self.seq_graphs[:1])

    def points(self) -> list[tuple[int, ...]]:
        """The sizes of the primary graph and of each other graph: (batch,), (seq,) or (batch, seq)."""
        b, o, s = self.batch, self.other, self.seq
        if s is None:
            return [(b,), (o,)]
        if not self.batch_moves:
            return [(s,), (self.seq_other,)]
        return [(b, s), (o, s), (b, self.seq_other), (o, self.seq_other)]

    def describe(self, k: int) -> str:
        """The sizes of point ``k`` in words."""
        names = ("seq",) if self.seq is not None and not self.batch_moves else ("batch", "seq")
        return ", ".join(f"{n} {v}" for n, v in zip(names, self.points()[k]))

    def node_for(self, node: Node, k: int = 0) -> Node:
        other = self.nodes[k].get(node.name)
        if other is None or other.op_type != node.op_type or other.inputs != node.inputs:
            raise BatchDependent(f"{node.op_type} node {node.name!r} is not in the graph at {self.describe(k + 1)}")
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


def fit_expr(values: list[int], points: list[tuple[int, ...]], names: list[str]) -> str | None:
    """The integers ``values`` at ``points`` as code in the symbols ``names``: one symbol from two
    points (``a * x + c``), two from the rectangle (b, s), (b', s), (b, s'), (b', s')
    (``d + a * x + c * y + e * x * y``); None when a symbol's step does not divide the change."""
    if len(names) == 1:
        (p0,), (p1,) = points
        a, rest = divmod(values[1] - values[0], p1 - p0)
        if rest or a == 0:
            return None
        return batch_expr(a, values[0] - a * p0, names[0])
    (b, s), (b1, _), (_, s1) = points[0], points[1], points[2]
    n00, n10, n01, n11 = values
    db, ds = b1 - b, s1 - s
    e, r0 = divmod(n11 - n10 - n01 + n00, db * ds)
    a, r1 = divmod(n10 - n00 - e * s * db, db)
    c, r2 = divmod(n01 - n00 - e * b * ds, ds)
    if r0 or r1 or r2:
        return None
    d = n00 - a * b - c * s - e * b * s
    terms = [(e, f"{names[0]} * {names[1]}"), (a, names[0]), (c, names[1]), (d, "")]
    text = ""
    for k, t in terms:
        if k == 0:
            continue
        body = t if abs(k) == 1 and t else f"{t} * {abs(k)}" if t else str(abs(k))
        text += (" - " if k < 0 else " + ") + body if text else ("-" if k < 0 else "") + body
    return text


def merge_all(exprs: list[str], points: list[tuple[int, ...]], names: list[str], where: str) -> tuple[str, set[str]]:
    """``exprs[0]`` with every integer that differs between the conversions at ``points`` written
    in the symbols ``names`` (``fit_expr``); ``(code, the symbols used)``. Anything else that
    differs raises ``BatchDependent``."""
    if all(e == exprs[0] for e in exprs[1:]):
        return exprs[0], set()
    expr = exprs[0]

    def mismatch(k: int) -> BatchDependent:
        return BatchDependent(
            f"{where}: the code differs beyond its sizes between {points[0]} and {points[k]} ({', '.join(names)}): "
            f"{expr!r} vs {exprs[k]!r}"
        )

    try:
        toks = [_tokens(e) for e in exprs]
    except (tokenize.TokenError, SyntaxError):
        raise mismatch(1) from None
    for k, t in enumerate(toks[1:], 1):
        if len(t) != len(toks[0]):
            raise mismatch(k)
    lines = expr.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits, used = [], set()
    ta = toks[0]
    for j, x in enumerate(ta):
        column = [t[j] for t in toks]
        if all(y.type == x.type and y.string == x.string for y in column):
            continue
        for k, y in enumerate(column):
            if x.type != tokenize.NUMBER or y.type != tokenize.NUMBER:
                raise mismatch(k)
        try:
            values = [int(y.string) for y in column]
        except ValueError:  # a float that moves with the sizes (a scale): not a size
            raise mismatch(1) from None
        text = fit_expr(values, points, names)
        if text is None:
            raise mismatch(1)
        used.update(n for n in names if n in text.replace("*", " ").replace("-", " ").split())
        before = ta[j - 1].string if j else "("
        after = ta[j + 1].string if j + 1 < len(ta) else ")"
        if (" " in text or text.startswith("-")) and (before not in _OPENERS or after not in _CLOSERS):
            text = f"({text})"
        (r0, c0), (r1, c1) = x.start, x.end
        edits.append((starts[r0 - 1] + c0, starts[r1 - 1] + c1, text))
    for begin, end, text in reversed(edits):
        expr = expr[:begin] + text + expr[end:]
    return expr, used


def _tokens(expr: str) -> list[tokenize.TokenInfo]:
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT}
    return [t for t in tokenize.generate_tokens(io.StringIO(expr).readline) if t.type not in skip]


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


def repeated_row(arrays: list[np.ndarray]) -> np.ndarray | None:
    """``batch_row`` over the arrays at every point: the first slice along the axes whose size
    moves, when every array repeats it along them."""
    first = arrays[0]
    if any(a.ndim != first.ndim or a.dtype != first.dtype for a in arrays):
        return None
    axes = tuple(k for k in range(first.ndim) if len({a.shape[k] for a in arrays}) > 1)
    if not axes or any(a.shape[k] == 0 for a in arrays for k in axes):
        return None
    index = tuple(slice(0, 1) if k in axes else slice(None) for k in range(first.ndim))
    row = first[index]
    for a in arrays:
        if not np.array_equal(a[index], row) or not np.array_equal(np.broadcast_to(row, a.shape), a):
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
    for k in range(len(shape)):  # no branch on coefs: one may be a size (seq), a run-time value in a MindIR
        view = [1] * len(shape)
        view[k] = -1
        out = out + ops.reshape(ops.arange(0, shape[k], 1, dtype=dtype), tuple(view)) * coefs[k]
    return ops.broadcast_to(out, shape)
'''


def grid_fits(arrays: list[np.ndarray]) -> list[tuple[int, tuple[int, ...]]] | None:
    """``affine_grid`` of every array, or None. An axis of size 1 gives no coefficient; it takes
    the one of an array where that axis is longer and every other axis the same size (a stride
    depends on the sizes of the other axes, not its own), so the coefficients fit across sizes."""
    fits = [affine_grid(a) if a.ndim == arrays[0].ndim else None for a in arrays]
    if any(f is None for f in fits):
        return None
    out = []
    for a, (offset, coefs) in zip(arrays, fits):
        coefs = list(coefs)
        for k, n in enumerate(a.shape):
            if n != 1:
                continue
            for b, (_, other) in zip(arrays, fits):
                if b.shape[k] > 1 and all(x == y for m, (x, y) in enumerate(zip(a.shape, b.shape)) if m != k):
                    coefs[k] = other[k]
                    break
        out.append((offset, tuple(coefs)))
    return out


def grid_expr(sink, array: np.ndarray, fit: tuple[int, tuple[int, ...]] | None = None) -> str:
    """``index_grid(...)`` code for ``array``, an affine index grid (``fit``: its offset and coefficients)."""
    offset, coefs = fit or affine_grid(array)
    name = sink.define("index_grid", INDEX_GRID)
    return f"{name}({tuple(array.shape)!r}, {coefs!r}, {offset}, {ms_dtype(array.dtype)})"


class _Sink:
    """What the batch conversions' two sinks do alike: variables are the code builder's, a scalar
    constant is a literal, any other constant a stored tensor (``tensor``, each sink its own)."""

    inner: object

    def var(self, value: str) -> str:
        return self.inner.var(value)

    def const_expr(self, value: Value) -> str:
        if _scalar(value):
            return literal(value.const.item())
        return self.tensor(value.const, value.name)


class Recorder(_Sink):
    """Wraps the code builder during the first conversion of a node and logs what the emitter
    declared (stored tensors, layers, helper definitions) with the names it got back. A stored
    tensor gets a placeholder name until the other conversion has declared its own (``Replay``,
    then ``resolve_tensors``)."""

    def __init__(self, inner, other: Graph):
        self.inner = inner
        self.other = other
        self.log: list[tuple] = []

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


class Replay(_Sink):
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
            raise BatchDependent(f"{self.where}: declares {what} only at {_at(self.batches[1])}")
        return self.log.pop(0)[1:]

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
            raise BatchDependent(f"{self.where}: declares a {self.log[0][0]} only at {_at(self.batches[0])}")

    def resolve_tensors(self, expr: str, other_expr: str) -> tuple[str, str]:
        """Both conversions' code with each stored tensor's placeholder replaced (``resolve_tensors``)."""
        return tuple(resolve_tensors(self.inner, [self], [expr, other_expr], self.where, list(self.batches)))


def prefix_of(arrays: list[np.ndarray], big: np.ndarray) -> bool:
    """Whether every array is ``big`` cut short along the axes whose size moves."""
    return all(
        a.ndim == big.ndim
        and a.dtype == big.dtype
        and all(n <= m for n, m in zip(a.shape, big.shape))
        and np.array_equal(big[tuple(slice(0, n) for n in a.shape)], a)
        for a in arrays
    )


def sliced(name: str, shape: tuple[int, ...], axes: list[int]) -> str:
    """``name`` cut to ``shape`` along ``axes`` (those whose size moves): ``self.t[:, :16]``. Every
    conversion writes the same cut, so that only its sizes differ."""
    cuts = [f":{n}" if k in axes else ":" for k, n in enumerate(shape[: max(axes) + 1])]
    return f"{name}[{', '.join(cuts)}]"


def resolve_tensors(
    sink, replays: list[Replay], exprs: list[str], where: str, labels: list, longest: Graph | None = None
) -> list[str]:
    """Every conversion's code (the first, then one per replay) with each stored tensor's
    placeholder replaced: the same array everywhere is stored once; one whose shape moves with
    the sizes is stored as a repeated slice and broadcast (``repeated_row``), or computed
    (``affine_grid``); anything else is refused. ``labels`` name the sizes of each conversion."""
    exprs = list(exprs)
    for j in reversed(range(len(replays[0].tensors))):  # placeholder 1 is a prefix of 10
        placeholder, hint, first, _ = replays[0].tensors[j]
        arrays = [first] + [r.tensors[j][3] for r in replays]
        if all(a.shape == first.shape and a.dtype == first.dtype and np.array_equal(a, first) for a in arrays):
            codes = [sink.tensor(first, hint)] * len(arrays)
        elif (row := repeated_row(arrays)) is not None:
            name = sink.tensor(row, hint)
            codes = [f"ops.broadcast_to({name}, {tuple(a.shape)!r})" for a in arrays]
        elif (fits := grid_fits(arrays)) is not None:
            codes = [grid_expr(sink, a, f) for a, f in zip(arrays, fits)]
        elif (big := _longest(arrays, longest, hint)) is not None and prefix_of(arrays, big):
            name = sink.tensor(big, hint)
            axes = [k for k in range(big.ndim) if len({a.shape[k] for a in arrays} | {big.shape[k]}) > 1]
            codes = [sliced(name, a.shape, axes) for a in arrays]
        else:
            k = next(k for k, a in enumerate(arrays) if a.shape != first.shape or not np.array_equal(a, first))
            at = [_at(x) for x in labels]
            raise BatchDependent(
                f"{where}: the constant {hint!r} depends on the {'batch' if len(at) == 2 else 'sizes'} "
                f"(shape {list(first.shape)} at {at[0]}, {list(arrays[k].shape)} at {at[k]}); it is stored, "
                "not computed, so it cannot follow the input"
            )
        exprs = [e.replace(placeholder, c) for e, c in zip(exprs, codes)]
    return exprs


def _longest(arrays: list[np.ndarray], longest: Graph | None, hint: str) -> np.ndarray | None:
    """The array a folded table lookup is stored at: the value at the longest listed length (its
    own load), else the largest of ``arrays`` (the recipe's length is the longest listed)."""
    value = longest.values.get(hint) if longest is not None else None
    if value is not None and value.const is not None:
        return value.const
    big = max(arrays, key=lambda a: a.size)
    return big if all(a.ndim == big.ndim for a in arrays) else None


def _at(label) -> str:
    """A conversion's sizes in words: a batch size, or ``batch 2, seq 16``."""
    return f"batch {label}" if isinstance(label, int) else str(label)


_PLACEHOLDER = "self.__t2ms_batch_tensor_"  # a stored tensor is "self.<name>" (Emitter.tensor)


def _scalar(value: Value) -> bool:
    return value.const.ndim == 0 and value.const.dtype.kind in "fiub"
