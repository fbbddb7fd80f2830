"""The precision planner: which layers an Ascend board must keep in high precision so that the rest,
run in a lower one, still meets the recipe's bound; and the cache of its plans.

A plan has one strategy, which says what it plans:

* ``fp16.FP16`` (``fp16.py``): fp16 rounding per node (``emulate.Fp16Emulator``) judged on
  ``precision.fp16_rel_error``; the layers kept in fp32 go to ATC's ``--keep_dtype`` and the mixlist.
* ``int8.INT8`` (``int8.py``): the Cube ops as QDQ (``emulate_int8.Int8Emulator``) judged on
  ``precision.int8_task_agreement`` and ``int8_rel_error``; the layers kept in float go to AMCT's
  ``skip_layers``.

The planner hands "emulate this set of layers in low precision -> verdict" to
``search.search_samples`` (group-wise bisection ranks the layers on the first sample, the shortest
ranked prefix kept in high precision that meets the bound, kept blocks tried in low precision
again). Every plan it accepts was emulated as a whole on every sample; those are the figures
shipped. A plan is cached under a key of everything that decides it (``plan_key``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch2ms.bundle import search
from torch2ms.bundle.emulate import json_error, sig
from torch2ms.bundle.search import RANK_BUDGET, RELEASE_BUDGET, SCREEN_SAMPLES, Verdict
from torch2ms.errors import RecipeError


@dataclass(frozen=True)
class Strategy:
    """What one kind of plan emulates and how it judges a run."""

    name: str  # the plan in logs: "fp16 plan", "int8 plan"
    high: str  # what a kept layer runs in: "fp32", "float"
    low: str  # what the other layers run in: "fp16", "int8"
    figure: str  # the judged figure the search ranks by, and the sensitivity rows' field: "error", "score"
    judge: Callable[[Any, list[dict], list[dict]], dict]  # (recipe, outputs, reference) -> {"ok", figure, ...}
    run: Callable[[Any, list[int], int], list[dict]]  # (emulator, layers in low precision, samples) -> outputs
    negligible: Callable[[Any], float]  # recipe -> a block whose figure is under it is not split
    unreachable: Callable[[Any, dict], RecipeError]  # (recipe, the all-high run's judgement) -> the error


def search_how(strategy: Strategy) -> str:
    """How ``search_layers`` finds a plan, for the plan record and precision.md."""
    hi, lo = strategy.high, strategy.low
    return (
        f"group-wise bisection over blocks of consecutive layers (up to {RANK_BUDGET} emulations on the first "
        f"{SCREEN_SAMPLES} sample(s)) ranks the layers; the shortest ranked prefix kept in {hi} that meets the bound "
        f"(doubling, bisection); kept blocks tried in {lo} again, halved when they break it (up to {RELEASE_BUDGET}); "
        "every accepted plan emulated on all samples"
    )


def search_layers(strategy: Strategy, recipe, emu, reference: list[dict], exhaustive: bool) -> search.Result:
    """``search.search_samples`` over the emulator's layers: the fewest kept in high precision that
    meet the strategy's bound (screened on ``SCREEN_SAMPLES`` samples first unless ``exhaustive``).
    Raises the strategy's ``RecipeError`` when even every layer in high precision misses it."""

    def emulate_on(samples: int) -> Callable[[frozenset[int]], Verdict]:
        def evaluate(low: frozenset[int]) -> Verdict:
            j = strategy.judge(recipe, strategy.run(emu, sorted(low), samples), reference[:samples])
            return Verdict(j["ok"], json_error(j[strategy.figure]), j)

        return evaluate

    try:
        return search.search_samples(
            len(emu.names), emulate_on, len(reference), strategy.negligible(recipe), exhaustive
        )
    except search.Unreachable as err:
        raise strategy.unreachable(recipe, err.verdict.detail) from None


def search_record(strategy: Strategy, found: search.Result, exhaustive: bool) -> dict:
    """The plan record's ``search``: how, and how many emulations each step took."""
    return {
        "how": "exhaustive: every layer alone" if exhaustive else search_how(strategy),
        "emulations": found.evaluated,
        "screening_emulations": found.screened,
        "steps": found.steps,
        "blocks": len(found.blocks),
    }


def sensitivity(
    strategy: Strategy, found: search.Result, emu, extra: Callable[[int], dict] | None = None
) -> list[dict]:
    """Every ranked layer with the figure of the block it was measured in (``extra(i)``: the
    strategy's own fields for layer ``i``, placed before the figure)."""
    rows = []
    for b in found.blocks:
        measured = "alone" if b.size == 1 else f"{b.size} layers {emu.labels[b.start]} .. {emu.labels[b.stop - 1]}"
        figure = sig(b.score) if math.isfinite(b.score) else "inf"
        for i in b.members():
            rows.append(
                {
                    "label": emu.labels[i],
                    "name": emu.names[i],
                    "op": emu.op_types[i],
                    **(extra(i) if extra else {}),
                    strategy.figure: figure,
                    "measured": measured,
                }
            )
    return rows


SENSITIVITY_ROWS = 30  # sensitivity rows in precision.md (precision.json has every layer)


def more_rows(plan: dict, columns: int) -> list[list[str]]:
    """The sensitivity table's last row when precision.json has more layers than it shows."""
    more = len(plan["sensitivity"]) - SENSITIVITY_ROWS
    return [[f"... {more} more in precision.json"] + [""] * (columns - 1)] if more > 0 else []


def fmt(v) -> str:
    """A recorded figure in precision.md: three significant digits, or the string it was ('inf')."""
    return v if isinstance(v, str) else f"{v:.3g}"


def task_text(judged: dict) -> str:
    """A run's task figure in a table cell, '-' without one."""
    t = judged["task"]
    return f"{t['metric']} {t['agreement']:.4f}" if t else "-"


# --- the cache: a plan is reused while what decides it is the same --------------------------------


def plan_key(recipe, onnx_path, ref_path, strategy_file: str, **decides) -> str:
    """The key a plan is cached under: the ONNX, the reference samples, the recipe's task and
    post-processing, the conversion code, and the planning code (the search, this planner, the
    emulators, the strategy's module ``strategy_file``), plus what else ``decides`` the plan (its
    bound, calibration, ...)."""
    import hashlib
    import json

    from torch2ms.bundle import emulate, emulate_int8
    from torch2ms.pipeline.fingerprint import source_hash
    from torch2ms.pipeline.workspace import sha256_file

    code = (search.__file__, __file__, emulate.__file__, emulate_int8.__file__, strategy_file)
    payload = {
        "onnx": sha256_file(onnx_path),
        "reference": sha256_file(ref_path),
        "task": recipe.task,
        "postprocess": recipe.postprocess.model_dump(mode="json") if recipe.postprocess else None,
        "source": source_hash(),  # leaves the package layer out: the planning code is hashed here
        "code": [sha256_file(Path(f)) for f in code],
        **decides,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cached_plan(path: Path, key: str, make: Callable[[], dict], what: str, log: Callable) -> dict:
    """The plan at ``path`` when its ``key`` matches, else ``make()``'s, written there with the key."""
    import json

    from torch2ms.pipeline.workspace import write_json

    if path.is_file():
        try:
            plan = json.loads(path.read_text())
            if plan.get("key") == key:
                log(f"{what}: up to date ({path})")
                return plan
        except (OSError, json.JSONDecodeError):
            pass
    plan = {"key": key, **make()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, plan)
    return plan
