"""Which of several compiled variants of a network is faster, from as few timed calls as decide it.

The compile stage's ``graph_kernel: auto`` compares compiled variants whose calls can each take
a second. The variants are timed in rounds,
one call of each per round, the order alternating so that a drift of the machine's load falls on
both. After ``min_rounds`` rounds and after each further one, the exact one-sided Mann-Whitney test
asks whether the variant with the lower median is faster: ``p`` is the probability that its calls
rank at least this far below the other's if both were equally fast,

    U = #{(i, j): a_i < b_j},   p = P(U' >= U) for U' of two equally fast variants,

counted exactly (``mann_whitney_p``). Timing stops once ``p <= alpha`` or after ``max_rounds``; the
record keeps ``p`` and the rounds run, and says when the difference stayed within the noise (then
either variant is as fast, and the lower median is kept). Three rounds whose calls all rank one way
give p = 1/20 = 0.05.

It also stops, after ``min_rounds``, once no outcome of the rounds left can decide it
(``best_reachable_p``): even if every remaining call of one variant ranked below every call of the
other, p after ``max_rounds`` would stay above ``alpha``. Those rounds could not change what the
record states (undecided at ``alpha`` within ``max_rounds``), so the confidence is the same as
timing them; only which of two equally fast variants has the lower median could change, and the
record says neither is faster. On a loaded machine this ends the search after about half the
rounds (benchmarks/results/design_measurements.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import cache

ALPHA = 0.05
MIN_ROUNDS = 3


@cache
def _arrangements(m: int, n: int, u: int) -> int:
    """How many orderings of m a's and n b's have exactly u pairs with an a before a b."""
    if u < 0 or u > m * n:
        return 0
    if m == 0 or n == 0:
        return 1 if u == 0 else 0
    # the last element is an a (it precedes no b) or a b (every a precedes it)
    return _arrangements(m - 1, n, u) + _arrangements(m, n - 1, u - m)


def mann_whitney_p(faster: list[float], slower: list[float]) -> float:
    """One-sided exact p that ``faster``'s values rank this far below ``slower``'s by chance (ties
    count half a pair, rounded down)."""
    m, n = len(faster), len(slower)
    if not m or not n:
        return 1.0
    return _p_at_least(m, n, _u(faster, slower))


def _u(faster: list[float], slower: list[float]) -> int:
    return int(sum(1.0 if a < b else 0.5 if a == b else 0.0 for a in faster for b in slower))


def _p_at_least(m: int, n: int, u: int) -> float:
    """P(U' >= u) for m and n values of two equally fast variants."""
    total = sum(_arrangements(m, n, k) for k in range(m * n + 1))
    return sum(_arrangements(m, n, k) for k in range(u, m * n + 1)) / total


def best_reachable_p(faster: list[float], slower: list[float], rounds_left: int) -> float:
    """The lowest ``mann_whitney_p(faster, slower)`` that ``rounds_left`` more calls of each can
    reach: every new call of ``faster`` ranks below every call of ``slower`` and every new call of
    ``slower`` above every call of ``faster``, which adds all their pairs to U."""
    m, n, k = len(faster), len(slower), rounds_left
    if not m + k or not n + k:
        return 1.0
    return _p_at_least(m + k, n + k, _u(faster, slower) + m * k + k * n + k * k)


def time_call(call: Callable[[], None]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def faster_variant(
    calls: dict[str, Callable[[], None]],
    max_rounds: int,
    min_rounds: int = MIN_ROUNDS,
    alpha: float = ALPHA,
) -> tuple[str, dict[str, list[float]], dict]:
    """Time ``calls`` (already compiled and warm) in alternating rounds until the one with the lower
    median is faster at ``alpha`` or ``max_rounds`` ran. Returns its key, every call's seconds per
    variant, and the decision record (rounds, p, alpha, whether it was decided)."""
    keys = list(calls)
    times: dict[str, list[float]] = {k: [] for k in keys}
    rounds = 0
    while True:
        order = keys if rounds % 2 == 0 else keys[::-1]
        for k in order:
            times[k].append(time_call(calls[k]))
        rounds += 1
        best = min(keys, key=lambda k: statistics.median(times[k]))
        if len(keys) == 1:
            return best, times, {"rounds": rounds, "p_value": None, "alpha": alpha, "decided": True}
        p = max(mann_whitney_p(times[best], times[k]) for k in keys if k != best)
        record = {"rounds": rounds, "p_value": round(p, 4), "alpha": alpha, "decided": p <= alpha}
        if rounds >= max_rounds or (rounds >= min(min_rounds, max_rounds) and p <= alpha):
            return best, times, record
        # no variant can still be shown faster within max_rounds: the rest cannot change the decision
        left = max_rounds - rounds
        reachable = min(max(best_reachable_p(times[a], times[b], left) for b in keys if b != a) for a in keys)
        if rounds >= min_rounds and reachable > alpha:
            return best, times, {**record, "stopped": f"no {max_rounds} rounds reach p <= {alpha:g}"}


def summary(first_call_s: float, times: list[float]) -> dict:
    """The record of one variant: first call (compilation included), median and p90 of the rest."""
    ordered = sorted(times)
    return {
        "first_call_s": round(first_call_s, 4),
        "median_ms": round(statistics.median(ordered) * 1e3, 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 3),
        "runs": len(ordered),
    }
