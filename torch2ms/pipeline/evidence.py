"""Evidence that every node is right, for a stage whose outputs lie beyond ``check.ceiling``.

A widened bound (``check.noise_factor`` times a float32 noise floor, ``bounds``) says how far two
correct float32 implementations drift apart on an ill-conditioned network; it cannot tell that
drift from a bug. An output within its widened bound but beyond the ceiling passes only with
positive evidence that every node is right, recorded in ``stage.json`` ``evidence``:

- rebuild, fold (stages that ``localize``): ``diff``'s replay. Every statement of network.py,
  recomputed from onnxruntime's own inputs, stays within ``LOCAL_SHARE`` of the tolerance (1e-5):
  ``by: replay`` with the worst local error and its node. A node beyond that fails the stage.
- compile, mindir: they run the network.py of an earlier stage in another mode. Evidence is that
  code's replay plus the stage's outputs within the recipe's bound of the same code in PyNative.
- export: ``by: float64``. Its check is onnxruntime against PyTorch: there is no generated code to
  replay, and an ONNX node has no PyTorch statement to recompute. Instead ``model.onnx`` widened to
  float64 runs on onnx's reference evaluator (``export.float64``; onnxruntime's CPU Conv has no
  float64 kernel) against the PyTorch model in float64, which the float32 floor already ran. In
  float64 the arithmetic's drift shrinks by ~1e9 and a wrong node does not; the graph's float32
  attributes and scalars take back the numbers they were rounded from (``export.float64.exact``).
  So every output, at the samples and the extra batch sizes, must agree within ``LOCAL_SHARE`` of
  the tolerance (1e-5), as a replayed statement must; beyond it the exported graph computes
  something else (``by: wrong``: failed).
  Later stages' replay proves the converter's nodes against onnxruntime, not the graph against
  PyTorch, so they cannot vouch for it.

Without evidence (``by: none``) the stage is ``not checkable`` at these inputs: the run goes on
(its artifacts are sound, only the check cannot decide) but does not pass. A float64 run of the
generated network against float64 PyTorch is not tried: MindSpore 2.x's CPU Conv2D refuses
float64 (it takes float16/32, bfloat16 and integers), so no convolutional network runs in float64.
"""

from __future__ import annotations

from torch2ms.compare import Tolerance, compare_outputs

NOT_CHECKABLE = "not checkable"

WHAT_TO_DO = (
    "give real samples in inputs[].data (or trained weights in model.checkpoint), on which float32 "
    "decides the outputs, or accept the risk explicitly with a wider check.ceiling"
)


def proves(diff) -> bool:
    """The replay ran, compared something, and found no node wrong."""
    return diff is not None and diff.replayed and diff.wrong is None and diff.worst_local is not None


def from_replay(diff, stage: str, needed: list[str]) -> dict:
    worst = diff.worst_local
    return {
        "by": "replay",
        "needed": needed,
        "stage": stage,
        "local_bound": diff.local_bound,
        "max_local_error": worst.local.rel_error,
        "node": worst.node,
        "op": worst.op,
        "compared": len(diff.tensors),
    }


def none(needed: list[str], why: str) -> dict:
    return {"by": "none", "needed": needed, "why": why}


def for_localized(diff, stage: str, needed: list[str]) -> dict:
    """A rebuild/fold stage: its own replay decides (``by: wrong`` when it finds a node wrong)."""
    if proves(diff):
        return from_replay(diff, stage, needed)
    if diff is not None and diff.wrong is not None:
        return {"by": "wrong", "needed": needed, "stage": stage, "node": diff.wrong.node, "op": diff.wrong.op}
    return none(needed, "diff's replay of network.py could not run (see the log)")


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


def pynative_outputs(ctx, src, names: list[str], tag: str) -> tuple[list[dict], str]:
    """``src``'s network.py in PyNative on the reference inputs, and where that ran: its own stage's
    check in this process when it ran (a second network beside the compiled graph was compile's peak
    for RT-DETR), else here, kept for the run's later callers."""
    from torch2ms.conversion import PYNATIVE_OUTPUTS
    from torch2ms.runtime import msutil

    pynative = ctx.cache.get(PYNATIVE_OUTPUTS, {}).get(src.name)
    if pynative is not None:
        return pynative, f"{src.name}'s check, this run"
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
    return pynative, "here"


def _replay(ctx, src, tol: Tolerance, needed: list[str]) -> dict:
    from torch2ms.pipeline.divergence import localize

    try:
        diff = localize(ctx.artifact("model.onnx"), src, ctx.reference_inputs(), tol, src.name)
    except Exception as err:
        return none(needed, f"the replay of {src.name}'s network.py failed ({type(err).__name__}: {err})")
    if not proves(diff):
        why = diff.local_summary() if diff.wrong is not None else "its replay compared no statement"
        return none(needed, f"{src.name}'s network.py: {why}")
    return from_replay(diff, src.name, needed)


def for_export(ctx, onnx_path, needed: list[str]) -> dict:
    """The export stage: ``model.onnx`` in float64 (onnx's reference evaluator) against PyTorch in
    float64 on the same inputs, within the replay's local bound (``export.float64``)."""
    import time

    from torch2ms.bounds import widen
    from torch2ms.compare import worst
    from torch2ms.export import float64
    from torch2ms.pipeline.divergence import LOCAL_SHARE

    wide = ctx.cache.get("float64_reference")
    if wide is None:
        return none(needed, "the PyTorch model does not run in float64, so nothing can hold model.onnx to it")
    samples, outputs = ctx.cache["reference"]
    runs = [("the samples", len(samples), wide["samples"])]
    runs += [(f"batch {n}", 1, w) for n, w in wide["batches"].items()]
    inputs = [*samples, *(ctx.cache["batch_reference"][n][0] for n in wide["batches"])]
    check = ctx.recipe.check
    tol = Tolerance(*widen(check.rel_error, check.cosine, LOCAL_SHARE))
    start = time.perf_counter()
    try:  # one evaluator for the samples and the extra batch sizes
        got = float64.run(onnx_path, inputs, list(outputs[0]))
    except Exception as err:  # noqa: BLE001 - any op the reference evaluator cannot run in float64
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return none(needed, f"{float64.EVALUATOR} cannot run model.onnx in float64 ({type(err).__name__}: {first})")
    metrics, apart, at = [], [], 0
    for where, count, reference in runs:
        same = compare_outputs(got[at : at + count], reference)
        at += count
        metrics += same
        apart += [f"{where}, output {m.name!r}: {v}" for m in same for v in tol.violations(m)]
    found = {
        "needed": needed,
        "evaluator": float64.EVALUATOR,
        "local_bound": tol.rel_error,
        "max_rel_error": max(m.rel_error for m in metrics),
        "min_cosine": min(m.cosine for m in metrics),
        "compared": len(metrics),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if apart:
        why = f"model.onnx in float64 differs from PyTorch in float64: {'; '.join(apart)}"
        return {"by": "wrong", **found, "node": None, "why": why, "output": worst(metrics).name}
    return {"by": "float64", **found}


def for_reference_off(ctx, diff, stage: str, outputs, needed: list[str]) -> dict | None:
    """A localized stage out of its bound, where diff's replay finds no statement wrong and
    onnxruntime itself off float64 at some (``pipeline.divergence.arbitration``): its outputs against
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


def reason(evidence: dict) -> str:
    """Why a stage without evidence is not checkable, and what the user can do."""
    return (
        f"{'; '.join(evidence['needed'])}: beyond the ceiling only evidence that every node is right passes, "
        f"and there is none ({evidence['why']}); {WHAT_TO_DO}"
    )
