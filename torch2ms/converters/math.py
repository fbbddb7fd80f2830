"""Math that is not one MindSpore call as is: Sign, IsInf, BitShift, Trilu, EyeLike, Det, Einsum.

- Sign: ``ops.sign`` has CPU kernels for float, int32 and int64 only; int8/int16 go through int32,
  unsigned integers are ``x != 0``.
- BitShift: ONNX (opset 28 spells it out) defines shifts by a negative amount or by the width or
  more: 0, or -1 for a right shift of a negative number. MindSpore shifts modulo the width, like
  the CPU; shift amounts that are not a constant known to be in range are guarded.
- Trilu: an input with a dimension of 0 is returned as is (MindSpore's CPU ``tril`` kernel refuses
  a width of 0; the result is empty anyway).
- EyeLike: ``ops.eye``; with ``k != 0`` the (constant) matrix is stored.
- Einsum: ``ops.einsum`` runs on GPU/Ascend only, so the equation is lowered. Each operand first
  takes its diagonals (a letter repeated in one term, ``ops.diagonal``) and sums the letters no
  other term needs; then operands are contracted pairwise, left to right: letters in both and
  still needed are batch axes, letters in both and no longer needed are contracted with
  ``ops.matmul`` on ``(batch, free_a, contracted) @ (batch, contracted, free_b)`` (a plain product
  when nothing is contracted); a final transpose puts the axes in the output's order. Ellipses
  become axes of their own, aligned from the right.
"""

from __future__ import annotations

import numpy as np

from torch2ms.converters.api import Unsupported, converter, ms_dtype


@converter("Sign", since=9)
def sign(em):
    """Sign(input) -> output"""
    dtype = em.dtype(0)
    if dtype.kind == "u":
        return f"ops.cast(ops.cast({em.x(0)}, ms.bool_), {ms_dtype(dtype)})"
    if dtype in (np.int8, np.int16):
        return f"ops.cast(ops.sign(ops.cast({em.x(0)}, ms.int32)), {ms_dtype(dtype)})"
    return f"ops.sign({em.x(0)})"


@converter("IsInf", since=10)
def is_inf(em, *, detect_negative=1, detect_positive=1):
    """IsInf(X) -> Y   attrs: detect_negative, detect_positive"""
    if detect_negative and detect_positive:
        return f"ops.isinf({em.x(0)})"
    if detect_positive:
        return f'{em.x(0)} == float("inf")'
    if detect_negative:
        return f'{em.x(0)} == float("-inf")'
    return f"ops.zeros({em.out_shape_code()}, ms.bool_)"


@converter("BitShift", since=11)
def bit_shift(em, *, direction):
    """BitShift(X, Y) -> Z   attrs: direction ('LEFT' | 'RIGHT'); out-of-range shifts give 0 (or -1: see above)"""
    if direction not in ("LEFT", "RIGHT"):
        raise Unsupported(f"direction={direction!r} not supported (LEFT or RIGHT)")
    fn = "ops.bitwise_left_shift" if direction == "LEFT" else "ops.bitwise_right_shift"
    dtype = em.dtype(0)
    bits = dtype.itemsize * 8
    x, y = em.x(0), em.operand(1)
    shifts = em.const(1)
    if shifts is not None and ((shifts >= 0) & (shifts < bits)).all():
        return f"{fn}({x}, {y})"
    if dtype.kind == "u":  # MindSpore compares unsigned tensors with Python ints poorly: compare in int64
        amount = f"ops.cast({y}, ms.int64)"
        in_range = f"({amount} >= 0) & ({amount} < {bits})" if dtype == np.uint64 else f"{amount} < {bits}"
    else:
        in_range = f"({y} >= 0) & ({y} < {bits})"
    if direction == "RIGHT" and dtype.kind == "i":  # fill with the sign bit: shift by width - 1
        return f"{fn}({x}, ops.where({in_range}, {y}, {bits - 1}))"
    return f"ops.where({in_range}, {fn}({x}, {y}), ops.zeros_like({x}))"


@converter("Trilu", since=14)
def trilu(em, *, upper=1):
    """Trilu(input, k?) -> output   attrs: upper (k constant)"""
    k = int(em.require_const(1, "k").reshape(-1)[0]) if em.has_input(1) else 0
    if 0 in em.shape(0):  # empty: nothing to mask (MindSpore's CPU tril refuses a width of 0)
        return em.x(0)
    fn = "ops.triu" if upper else "ops.tril"
    return f"{fn}({em.x(0)}, {k})" if k else f"{fn}({em.x(0)})"


@converter("EyeLike", since=9)
def eye_like(em, *, dtype=None, k=0):
    """EyeLike(input) -> output   attrs: dtype (default: the input's), k (diagonal offset)"""
    if em.rank(0) != 2:
        raise Unsupported(f"input rank {em.rank(0)} not supported (EyeLike is 2-D)")
    np_dtype = em.out_dtype(0) if dtype is not None else em.dtype(0)
    n, m = em.shape(0)
    if k:
        return em.tensor(np.eye(n, m, int(k), dtype=np_dtype), "eye")
    return f"ops.eye({n}, {m}, {ms_dtype(np_dtype)})"


@converter("Det", since=11)
def det(em):
    """Det(X) -> Y   (determinants of the last two axes)"""
    if em.shape(0)[-1] == 1:  # ops.det refuses 1x1 matrices: their determinant is the element
        return f"ops.reshape({em.x(0)}, {em.out_shape_code()})"
    return f"ops.det({em.x(0)})"


# --- Einsum ---


class _Operand:
    """An expression, its einsum term (one letter per axis) and its static shape."""

    def __init__(self, expr: str, term: str, shape: tuple[int, ...]):
        self.expr, self.term, self.shape = expr, term, tuple(int(d) for d in shape)

    def transpose(self, term: str) -> _Operand:
        if term == self.term:
            return self
        perm = tuple(self.term.index(c) for c in term)
        return _Operand(f"ops.transpose({self.expr}, {perm!r})", term, tuple(self.shape[p] for p in perm))

    def reshape(self, shape: tuple[int, ...], term: str) -> _Operand:
        if tuple(shape) == self.shape:
            return _Operand(self.expr, term, shape)
        return _Operand(f"ops.reshape({self.expr}, {tuple(int(d) for d in shape)!r})", term, shape)

    def dims(self, letters: str) -> tuple[int, ...]:
        return tuple(self.shape[self.term.index(c)] for c in letters)


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Terms and output with every ellipsis replaced by axes of its own (aligned from the right)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"equation={equation!r} has {len(terms)} terms for {len(ranks)} inputs")
    used = set(eq)
    pool = [chr(c) for c in range(0x100, 0x200) if chr(c) not in used]
    n_ellipsis = max([r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t], default=0)
    ellipsis = "".join(pool[:n_ellipsis])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            t = t.replace("...", ellipsis[n_ellipsis - n :])
        if len(t) != r:
            raise Unsupported(f"equation={equation!r}: term {t!r} does not match an input of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:  # implicit output: ellipsis axes, then the letters used once, in alphabetical order
        letters = "".join(out_terms)
        out = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return out_terms, out


def _diagonals(op: _Operand) -> _Operand:
    """Take the diagonal of every letter repeated within the term (it moves to the end)."""
    while True:
        repeated = next((c for c in op.term if op.term.count(c) > 1), None)
        if repeated is None:
            return op
        p = op.term.index(repeated)
        q = op.term.index(repeated, p + 1)
        term = "".join(c for i, c in enumerate(op.term) if i not in (p, q)) + repeated
        shape = tuple(d for i, d in enumerate(op.shape) if i not in (p, q)) + (min(op.shape[p], op.shape[q]),)
        op = _Operand(f"ops.diagonal({op.expr}, 0, {p}, {q})", term, shape)


def _sum_out(op: _Operand, keep: set[str], sum_dtype: str) -> _Operand:
    gone = [i for i, c in enumerate(op.term) if c not in keep]
    if not gone:
        return op
    term = "".join(c for c in op.term if c in keep)
    shape = tuple(d for c, d in zip(op.term, op.shape) if c in keep)
    return _Operand(f"ops.sum({op.expr}, dim={tuple(gone)!r}{sum_dtype})", term, shape)


def _contract(a: _Operand, b: _Operand, keep: set[str], sum_dtype: str) -> _Operand:
    """a * b summed over the letters they share that ``keep`` lacks."""
    batch = "".join(c for c in a.term if c in b.term and c in keep)
    summed = "".join(c for c in a.term if c in b.term and c not in keep)
    free_a = "".join(c for c in a.term if c not in b.term)
    free_b = "".join(c for c in b.term if c not in a.term)
    batch_shape = tuple(max(p, q) for p, q in zip(a.dims(batch), b.dims(batch)))
    term = batch + free_a + free_b
    shape = batch_shape + a.dims(free_a) + b.dims(free_b)
    if not summed or not (free_a or free_b):  # a broadcast product, then the sum over what is contracted
        lead = batch + summed
        a2 = a.transpose(lead + free_a)
        a2 = a2.reshape(a2.shape + (1,) * len(free_b), a2.term + free_b)
        b2 = b.transpose(lead + free_b)
        if lead:  # without one, broadcasting supplies the leading ones
            b2 = b2.reshape(b2.dims(lead) + (1,) * len(free_a) + b2.dims(free_b), lead + free_a + free_b)
        product = f"{a2.expr} * {b2.expr}"
        if summed:
            product = f"ops.sum({product}, dim={tuple(range(len(batch), len(lead)))!r}{sum_dtype})"
        return _Operand(product, term, shape)
    n_a, n_b, n_c = (int(np.prod(d, dtype=np.int64)) for d in (a.dims(free_a), b.dims(free_b), a.dims(summed)))
    a2 = a.transpose(batch + free_a + summed)
    a2 = a2.reshape(a.dims(batch) + (n_a, n_c), "")
    b2 = b.transpose(batch + summed + free_b)
    b2 = b2.reshape(b.dims(batch) + (n_c, n_b), "")
    out = _Operand(f"ops.matmul({a2.expr}, {b2.expr})", "", batch_shape + (n_a, n_b))
    return out.reshape(shape, term)


@converter("Einsum", since=12)
def einsum(em, *, equation):
    """Einsum(Inputs...) -> Output   attrs: equation (lowered to diagonal/sum/transpose/matmul: see above)"""
    dtype = em.dtype(0)
    n = em.n_inputs()
    terms, out = _parse(equation, [em.rank(i) for i in range(n)])
    # ops.sum widens integers to int64; keep the input's dtype
    sum_dtype = f", dtype={ms_dtype(dtype)}" if dtype.kind in "iu" and dtype != np.int64 else ""
    ops_ = [_diagonals(_Operand(em.x(i), t, em.shape(i))) for i, t in enumerate(terms)]
    for i, op in enumerate(ops_):
        others = set(out).union(*(o.term for j, o in enumerate(ops_) if j != i))
        ops_[i] = _sum_out(op, others, sum_dtype)
    result = ops_[0]
    for i in range(1, n):
        keep = set(out).union(*(o.term for o in ops_[i + 1 :]))
        result = _contract(result, ops_[i], keep, sum_dtype)
    if set(result.term) != set(out) or len(out) != len(set(out)):
        raise Unsupported(f"equation={equation!r}: output {out!r} is not a set of input letters")
    return result.transpose(out).expr
