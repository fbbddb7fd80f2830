"""Which of several compiled variants of a network is faster, from as few timed calls as decide it.

The compile stage's ``graph_kernel: auto`` used to time each variant ``runs`` times one after the
other (2 x 10 calls of ~1 s for DeepLabV3+ at 512x512). Here the variants are timed in rounds,
one call of each per round, the order alternating so that a drift of the machine's load falls on
both. After ``min_rounds`` rounds and after each further one, the exact one-sided Mann-Whitney test
asks whether the variant with the lower median is faster: ``p`` is the probability that its calls
rank at least this far below the other's if both were equally fast,

    U = #{(i, j): a_i < b_j},   p = P(U' >= U) for U' of two equally fast variants,

counted exactly (``mann_whitney_p``). Timing stops once ``p <= alpha`` or after ``max_rounds``; the
record keeps ``p`` and the rounds run, and says when the difference stayed within the noise (then
either variant is as fast, and the lower median is kept). Three rounds whose calls all rank one way
give p = 1/20 = 0.05.
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
    u = sum(1.0 if a < b else 0.5 if a == b else 0.0 for a in faster for b in slower)
    u = int(u)
    total = sum(_arrangements(m, n, k) for k in range(m * n + 1))
    return sum(_arrangements(m, n, k) for k in range(u, m * n + 1)) / total


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
    rounds, p = 0, 1.0
    best = keys[0]
    while True:
        order = keys if rounds % 2 == 0 else keys[::-1]
        for k in order:
            times[k].append(time_call(calls[k]))
        rounds += 1
        best = min(keys, key=lambda k: statistics.median(times[k]))
        if len(keys) == 1:
            return best, times, {"rounds": rounds, "p_value": None, "alpha": alpha, "decided": True}
        p = max(mann_whitney_p(times[best], times[k]) for k in keys if k != best)
        if rounds >= max_rounds or (rounds >= min(min_rounds, max_rounds) and p <= alpha):
            break
    return best, times, {"rounds": rounds, "p_value": round(p, 4), "alpha": alpha, "decided": p <= alpha}


def summary(first_call_s: float, times: list[float]) -> dict:
    """The record of one variant: first call (compilation included), median and p90 of the rest."""
    ordered = sorted(times)
    return {
        "first_call_s": round(first_call_s, 4),
        "median_ms": round(statistics.median(ordered) * 1e3, 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 3),
        "runs": len(ordered),
    }
