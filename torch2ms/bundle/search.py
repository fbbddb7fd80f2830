"""Which layers to keep in high precision: a search over sets of layers that does not cost one
emulation per layer.

The search knows nothing of fp16. It takes ``evaluate(low) -> Verdict``: run the model with the
layers in ``low`` (indices in graph order) in low precision and every other layer in high
precision, and say whether the outputs meet the bound (``ok``) and by how much they miss
(``error``, larger is worse). The planner (``precision.py``) passes its strategy's emulation: fp16
rounding (``fp16.py``) or INT8 QDQ (``int8.py``), each with its own bound. ``screen`` is the same question asked more
cheaply (fewer samples); it only orders the layers, never decides the plan.

**Method.** Layers are *blocks* of consecutive indices; ``error(B)`` is the error with block
``B`` alone in low precision.

1. *rank* (group-wise bisection, on ``screen``): start from one block of every layer and split
   the block with the largest error into halves, measuring both, while the budget lasts and a
   block's error is above ``negligible``. A block never split holds layers that are, together,
   at most that error: each member is scored ``error(B) / sqrt(|B|)`` (rounding errors of
   separate layers add roughly in quadrature). Layers are ranked by score, a block's members
   together in graph order.
2. *prefix* (on ``evaluate``): the shortest prefix of the ranking, cut at block boundaries, that
   kept in high precision meets the bound: doubling, then bisection.
3. *release*: each kept block, least sensitive first, is tried in low precision again; a block
   that breaks the bound is halved and its halves tried, down to single layers, while the
   budget lasts.
4. *verify*: the final set is the last one ``evaluate`` said is ``ok`` (every accepted step is
   a full evaluation), so the plan always meets the bound.

With ``exhaustive=True`` step 1 measures every layer alone and step 3 tries every kept layer:
the one-emulation-per-layer search this replaces, kept as the reference the tests compare with.

Every step is deterministic (ties go to the lower index), so the same ``evaluate`` gives the same
plan.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

RANK_BUDGET = 24  # screening evaluations for the group-wise bisection that ranks the layers
RELEASE_BUDGET = 12  # full evaluations trying kept blocks in low precision again
SCREEN_SAMPLES = 1  # the ranking is measured on this many reference samples; the plan on all of them
NEGLIGIBLE = 0.1  # a block whose error alone is under this fraction of the bound is not split


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: float  # a figure to rank by; larger is worse, inf allowed
    detail: Any = None  # the caller's record of this evaluation (metrics)


class Trials:
    """``evaluate`` with a memory: the same set is never run twice; ``count`` is the runs made."""

    def __init__(self, evaluate: Callable[[frozenset[int]], Verdict]):
        self.evaluate = evaluate
        self.seen: dict[frozenset[int], Verdict] = {}
        self.count = 0

    def __call__(self, low: Iterable[int]) -> Verdict:
        key = frozenset(low)
        if key not in self.seen:
            self.seen[key] = self.evaluate(key)
            self.count += 1
        return self.seen[key]


@dataclass(frozen=True)
class Block:
    start: int
    stop: int
    error: float  # with this block alone in low precision (screening)

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def score(self) -> float:
        return self.error / math.sqrt(self.size)

    def members(self) -> range:
        return range(self.start, self.stop)


@dataclass
class Result:
    keep: list[int]  # kept in high precision, most sensitive first
    verdict: Verdict  # of the plan: every layer but ``keep`` in low precision
    before: Verdict  # every layer in low precision
    blocks: list[Block]  # the ranking's blocks, most sensitive first
    screened: int = 0  # screening evaluations
    evaluated: int = 0  # full evaluations
    steps: dict[str, int] = field(default_factory=dict)  # full evaluations per step


class Unreachable(Exception):
    """Even with every layer in high precision the outputs miss the bound."""

    def __init__(self, verdict: Verdict):
        super().__init__(f"every layer in high precision: error {verdict.error}")
        self.verdict = verdict


def split_priority(b: Block) -> float:
    """Which block step 1 halves next: the one with the largest error alone."""
    return b.error


def rank_blocks(n: int, alone: Trials, budget: int, negligible: float) -> list[Block]:
    """Step 1: blocks by group-wise bisection, most sensitive first."""
    whole = Block(0, n, alone(range(n)).error)
    heap = [(-split_priority(whole), 0, whole)]
    done: list[Block] = []
    spent = 0
    while heap:
        _, _, b = heapq.heappop(heap)
        if b.size == 1 or b.error <= negligible or spent + 2 > budget:
            done.append(b)
            continue
        mid = (b.start + b.stop) // 2
        for lo, hi in ((b.start, mid), (mid, b.stop)):
            half = Block(lo, hi, alone(range(lo, hi)).error)
            heapq.heappush(heap, (-split_priority(half), lo, half))
        spent += 2
    return sorted(done, key=lambda b: (-b.score, b.start))


def each_layer(n: int, alone: Trials) -> list[Block]:
    """Step 1 of the exhaustive search: every layer alone."""
    return sorted((Block(i, i + 1, alone([i]).error) for i in range(n)), key=lambda b: (-b.score, b.start))


def shortest_prefix(n: int, blocks: list[Block], full: Trials) -> int:
    """Step 2: the fewest leading blocks that, kept in high precision, meet the bound."""

    def meets(cut: int) -> bool:
        kept = {i for b in blocks[:cut] for i in b.members()}
        return full(i for i in range(n) if i not in kept).ok

    lo, hi = 0, 1  # lo: a cut known to miss; hi: the one tried next
    while hi < len(blocks) and not meets(hi):
        lo, hi = hi, min(2 * hi, len(blocks))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def release(n: int, kept: list[Block], full: Trials, budget: int) -> set[int]:
    """Step 3: try the kept blocks in low precision again, least sensitive first, halving a
    block that breaks the bound. Returns the layers still kept."""
    keep = {i for b in kept for i in b.members()}
    todo = [(b.start, b.stop) for b in reversed(kept)]
    spent = 0
    while todo and spent < budget:
        lo, hi = todo.pop(0)
        trial = keep - set(range(lo, hi))
        spent += 1
        if full(i for i in range(n) if i not in trial).ok:
            keep = trial
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            todo[:0] = [(lo, mid), (mid, hi)]
    return keep


def search(
    n: int,
    evaluate: Callable[[frozenset[int]], Verdict],
    screen: Callable[[frozenset[int]], Verdict] | None = None,
    *,
    rank_budget: int = RANK_BUDGET,
    release_budget: int = RELEASE_BUDGET,
    negligible: float = 0.0,
    exhaustive: bool = False,
) -> Result:
    """The layers to keep in high precision so that ``evaluate`` of the rest is ok (module
    docstring). ``screen`` (default: ``evaluate``) orders the layers. Raises ``Unreachable``."""
    full = Trials(evaluate)
    cheap = Trials(screen) if screen is not None else full
    before = full(range(n))
    if before.ok:
        return Result([], before, before, [], 0, full.count, {"all low": full.count})
    steps = {"all low": full.count}
    everything = full(())
    if not everything.ok:
        raise Unreachable(everything)
    steps["all high"] = full.count - sum(steps.values())
    if exhaustive:
        blocks = each_layer(n, cheap)
    else:
        blocks = rank_blocks(n, cheap, rank_budget, negligible)
    steps["rank"] = full.count - sum(steps.values()) if cheap is full else 0
    cut = shortest_prefix(n, blocks, full)
    steps["prefix"] = full.count - sum(steps.values())
    kept_blocks = blocks[:cut]
    budget = (sum(b.size for b in kept_blocks) if exhaustive else release_budget) if cut else 0
    keep = release(n, kept_blocks, full, budget)
    steps["release"] = full.count - sum(steps.values())
    verdict = full(i for i in range(n) if i not in keep)
    assert verdict.ok  # every set release keeps was evaluated ok; the prefix's was too
    rank = {i: k for k, i in enumerate(i for b in blocks for i in b.members())}
    return Result(
        sorted(keep, key=rank.__getitem__),
        verdict,
        before,
        blocks,
        cheap.count if cheap is not full else 0,
        full.count,
        steps,
    )


def search_samples(
    n: int,
    evaluate_on: Callable[[int], Callable[[frozenset[int]], Verdict]],
    samples: int,
    negligible: float,
    exhaustive: bool,
) -> Result:
    """``search`` as a plan runs it: ``evaluate_on(samples)`` decides, on every reference sample, and
    ``evaluate_on(SCREEN_SAMPLES)`` ranks the layers when there are more samples than that (and the
    search is not ``exhaustive``, which compares with the reference on every sample)."""
    screen = None if exhaustive or samples <= SCREEN_SAMPLES else evaluate_on(SCREEN_SAMPLES)
    return search(n, evaluate_on(samples), screen, negligible=negligible, exhaustive=exhaustive)
