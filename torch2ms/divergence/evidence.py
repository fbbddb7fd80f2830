"""The evidence past ``check.ceiling`` that runs generated code or re-runs the graph in float64
(``pipeline.evidence`` says what each stage needs): compile and mindir prove the network.py they
were built from by its replay and their outputs within the recipe's bound of that code in PyNative
(``for_compiled``); a localized stage whose replay finds no node wrong while onnxruntime itself is
off float64 is held to ``model.onnx`` in float64 (``for_reference_off``)."""

from __future__ import annotations

from torch2ms.compare import Tolerance, compare_outputs
from torch2ms.pipeline.evidence import from_replay, none, proves


def for_compiled(ctx, stage, needed: list[str], outputs) -> dict:
    """compile/mindir: the network.py they were built from, replayed (the replay its own stage
    recorded, or one run now), and their outputs against that code's PyNative outputs within the
    recipe's bound."""
    src = ctx.artifact("network.py").parent
    check = ctx.recipe.check
    tol = Tolerance(check.rel_error, check.cosine)
    replayed = (ctx.run.read_record(src.name) or {}).get("evidence") or {}
    if replayed.get("by") == "replay" and replayed.get("stage") == src.name:
        evidence = {**replayed, "needed": needed}
    else:
        evidence = _replay(ctx, src, tol, needed)
        if evidence["by"] != "replay":
            return evidence
    pynative, ran = pynative_outputs(ctx, src, list(outputs[0]), f"evidence_{stage.name}")
    same = compare_outputs(outputs, pynative)
    apart = [f"output {m.name!r}: {v}" for m in same for v in tol.violations(m)]
    if apart:
        return none(needed, f"its outputs differ from {src.name}'s network.py in PyNative: {'; '.join(apart)}")
    return {**evidence, "pynative_rel_error": max(m.rel_error for m in same), "pynative_ran": ran}


_RAN = "pynative_ran"  # where a PYNATIVE_OUTPUTS entry was computed, when not by its own stage's check


def pynative_outputs(ctx, src, names: list[str], tag: str) -> tuple[list[dict], str]:
    """``src``'s network.py in PyNative on the reference inputs, and where that ran: its own stage's
    check in this process when it ran (a second network beside the compiled graph was compile's peak
    for RT-DETR), else here, kept for the run's later callers."""
    from torch2ms.codegen.convert import PYNATIVE_OUTPUTS
    from torch2ms.runtime import msutil

    pynative = ctx.cache.get(PYNATIVE_OUTPUTS, {}).get(src.name)
    if pynative is not None:
        return pynative, ctx.cache.get(_RAN, {}).get(src.name, f"{src.name}'s check, this run")
    ms = msutil.mindspore()
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        network = msutil.build_network(src, tag)
        pynative = msutil.run_cell(network, ctx.reference_inputs(), names)
        del network
    finally:
        ms.set_context(mode=mode)
    ctx.cache.setdefault(PYNATIVE_OUTPUTS, {})[src.name] = pynative
    ctx.cache.setdefault(_RAN, {})[src.name] = "here"
    return pynative, "here"


def _replay(ctx, src, tol: Tolerance, needed: list[str]) -> dict:
    from torch2ms.divergence.localize import localize

    try:
        diff = localize(ctx.artifact("model.onnx"), src, ctx.reference_inputs(), tol, src.name)
    except Exception as err:
        return none(needed, f"the replay of {src.name}'s network.py failed ({type(err).__name__}: {err})")
    if not proves(diff):
        why = diff.local_summary() if diff.wrong is not None else "its replay compared no statement"
        return none(needed, f"{src.name}'s network.py: {why}")
    return from_replay(diff, src.name, needed)


def for_reference_off(ctx, diff, stage: str, outputs, needed: list[str]) -> dict | None:
    """A localized stage out of its bound, where diff's replay finds no statement wrong and
    onnxruntime itself off float64 at some (``divergence.arbitration``): its outputs against
    ``model.onnx`` in float64 (``export.float64``) on the same samples. Within the recipe's own bound
    there, the reference's error put them out, not the code's: the replay's evidence with the float64
    comparison (``reference``). None when float64 cannot run or the outputs are off it too."""
    from torch2ms.export import float64

    check = ctx.recipe.check
    tol = Tolerance(check.rel_error, check.cosine)
    wide = ctx.cache.get("onnx_float64")
    if wide is None:
        try:
            wide = float64.run(ctx.artifact("model.onnx"), ctx.reference_inputs(), list(outputs[0]))
        except Exception as err:  # noqa: BLE001 - any op the reference evaluator cannot run in float64
            ctx.log(f"{stage}: model.onnx does not run in float64 ({type(err).__name__}: {err})")
            return None
        ctx.cache["onnx_float64"] = wide
    same = compare_outputs(outputs, wide)
    if any(tol.violations(m) for m in same):
        return None
    ort = compare_outputs(ctx.reference()[1], wide)
    off = diff.reference_off[0]
    return {
        **from_replay(diff, stage, needed),
        "reference": {
            "evaluator": float64.EVALUATOR,
            "max_rel_error": max(m.rel_error for m in same),
            "onnxruntime_rel_error": max(m.rel_error for m in ort),
            "node": off.node,
            "op": off.op,
            "why": off.reference_off,
        },
    }
