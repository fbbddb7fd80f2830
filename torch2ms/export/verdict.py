"""Why an export failed past ``check.ceiling``: the other exporter and the float64 evidence, tried
before the export stage fails.

onnxruntime's outputs outside even the widened bound (``check.noise_factor`` times the float32
floor) and beyond the ceiling, while float32 PyTorch is close to float64 (its floor within the
ceiling), leave two explanations the float32 comparison cannot tell apart: the exported graph
computes something else (a trace that turned tensors into Python numbers), or onnxruntime's float32
run of a right graph drifts where PyTorch's does not. So, in order:

1. ``model.onnx`` in float64 against PyTorch in float64 (``for_export``, below): within
   the replay's local bound the graph is right, and the stage passes on that evidence (``by:
   float64``); ``by: none`` (the float64 run cannot run) leaves it not checkable (exit 3);
2. the graph is wrong (``by: wrong``): the other exporter of ``export.exporter: auto``'s chain writes
   ``model.onnx`` again; within the bound, or right by its own float64 run, it replaces the first;
3. otherwise the export is wrong, and the record names the worst output of each exporter's try
   and the first module where the first exporter's ``model.onnx`` departs from PyTorch in float64
   (``export.first_diverging``; ``first_diverging`` in the verdict).

The verdict goes to ``stage.json`` ``extra.export_verdict`` (``decided`` by which try) and the
runner's check of the export stage follows it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch2ms.pipeline.context import VERDICT_KEY
from torch2ms.pipeline.evidence import none

CACHE_KEY = VERDICT_KEY


def needs_verdict(recipe, ort_out, reference, floor: dict | None) -> bool:
    """onnxruntime is outside the widened bound and beyond the ceiling, with float32 PyTorch within the
    ceiling of float64 (``floor``: the export record's ``float32_floor``)."""
    from torch2ms.bounds import ceiling
    from torch2ms.compare import compare_outputs

    if not floor:
        return False
    check = recipe.check
    rel, _ = ceiling(check)
    if max(f[0] for f in floor.values()) > rel:
        return False  # float32 PyTorch itself drifts from float64: the widened bound already says so
    metrics = compare_outputs(ort_out, reference)
    widened = {n: max(check.rel_error, check.noise_factor * f[0]) for n, f in floor.items()}
    return any(m.rel_error > rel and m.rel_error > widened.get(m.name, rel) for m in metrics)


def decide(ctx, onnx_path: Path, redo_export, check_ort) -> dict:
    """The verdict (see the module's docstring). ``redo_export(path, exporter)`` writes the model with
    ``exporter`` to ``path`` (returns the attempt, or None when that exporter fails);
    ``check_ort(path)`` returns onnxruntime's outputs on the samples and whether they meet the bound."""
    needed = ["onnxruntime beyond check.ceiling, float32 PyTorch within it of float64"]
    first = for_export(ctx, onnx_path, needed)
    used = ctx.cache.get("export_exporter", "torchscript")
    tries = [{"exporter": used, "float64": first["by"], **_why(first)}]
    if first["by"] in ("float64", "none"):
        return {**first, "decided": f"{used}'s model.onnx in float64", "tries": tries}
    other = "dynamo" if used == "torchscript" else "torchscript"
    trial = onnx_path.with_name(f"model_{other}.onnx")
    attempt = redo_export(trial, other)
    if attempt is None:
        tries.append({"exporter": other, "error": "it cannot export the model"})
        return _wrong(first, tries)
    outputs, within = check_ort(trial)
    second = None if within else for_export(ctx, trial, needed)
    tries.append({"exporter": other, "within_bound": within, **({"float64": second["by"]} if second else {})})
    if within or second["by"] == "float64":
        shutil.move(trial, onnx_path)
        found = {"by": "float64", **{k: v for k, v in second.items() if k != "by"}} if second else {"by": "export"}
        return {**found, "needed": needed, "decided": f"{other}'s export", "tries": tries, "outputs": outputs}
    trial.unlink(missing_ok=True)
    return _wrong(first, tries)


def _why(found: dict) -> dict:
    return {k: found[k] for k in ("why", "output", "max_rel_error") if k in found}


def _wrong(first: dict, tries: list[dict]) -> dict:
    names = " and ".join(t["exporter"] for t in tries)
    return {
        **first,
        "by": "wrong",
        "decided": "model.onnx in float64 against PyTorch in float64",
        "why": f"the export is wrong ({names}): {first['why']}",
        "tries": tries,
    }


def settle(ctx, model, onnx_path: Path, names: list[str], produced, floor: dict, ort: tuple) -> tuple:
    """The export stage's hook: when ``needs_verdict``, ``decide`` with the live PyTorch ``model``.
    ``ort``: onnxruntime's (outputs, batch outputs). Returns them (another exporter's, when its file
    replaced model.onnx) and the verdict for ``extra.export_verdict`` (None when not needed)."""
    import torch

    from torch2ms.bounds import ceiling
    from torch2ms.compare import Tolerance, compare_outputs
    from torch2ms.errors import ModelError
    from torch2ms.export.exporters import export_model
    from torch2ms.export.pytorch import onnx_counts
    from torch2ms.graph.onnxrt import run_reference

    recipe, check = ctx.recipe, ctx.recipe.check
    samples, reference = ctx.cache["reference"]
    if not needs_verdict(recipe, ort[0], reference, floor.get("float32_floor")):
        return ort, None
    batch_in = ctx.cache["batch_reference"]
    example = tuple(torch.from_numpy(v) for v in samples[0].values())
    inputs = [i.name for i in recipe.inputs]

    def redo(path: Path, exporter: str):
        spec = recipe.model_copy(update={"export": recipe.export.model_copy(update={"exporter": exporter})})
        try:
            return export_model(model, example, path, inputs, names, spec, ctx.log)[0]
        except ModelError as err:
            ctx.log(f"export: {exporter} cannot export the model ({err.message})")
            return None

    def check_ort(path: Path):
        counts, _ = onnx_counts(path)
        every = [*samples, *(s for s, _ in batch_in.values())]
        outs = run_reference(path, counts["onnx_ops"], every, names)[0]
        wide = {k: tuple(v) for k, v in floor["float32_floor"].items()}
        tol = Tolerance(
            check.rel_error, check.cosine, check.argmax_agreement, check.noise_factor, wide, ceiling=ceiling(check)
        )
        metrics = compare_outputs(outs[: len(samples)], reference)
        return outs, not any(tol.violations(m) or tol.beyond_ceiling(m) for m in metrics)

    ctx.cache["export_exporter"] = produced.exporter
    verdict = decide(ctx, onnx_path, redo, check_ort)
    if verdict["by"] == "wrong":
        _locate(model, onnx_path, samples, check, verdict)
    outputs = verdict.pop("outputs", None)
    ctx.log(f"export: {verdict['by']} (decided by {verdict['decided']})")
    if outputs is None:
        return ort, verdict
    return (outputs[: len(samples)], dict(zip(batch_in, outputs[len(samples) :]))), verdict


def _locate(model, onnx_path: Path, samples: list[dict], check, verdict: dict) -> None:
    """Adds the first diverging module of the wrong ``model.onnx`` (``export.first_diverging``, on
    the first sample that shows the error) to ``verdict`` and its ``why``."""
    from torch2ms.bounds import LOCAL_SHARE, widen
    from torch2ms.export.first_diverging import first_diverging, summary

    bound = widen(check.rel_error, check.cosine, LOCAL_SHARE)[0]
    for k, sample in enumerate(samples):
        try:
            found = first_diverging(model, onnx_path, sample, bound)
        except Exception as err:  # noqa: BLE001 - an op the float64 evaluator cannot run: nothing located
            verdict["first_diverging"] = {"error": f"{type(err).__name__}: {str(err).strip()[:200]}"}
            return
        if found is not None:
            verdict["first_diverging"] = {"sample": k, "bound": bound, **found}
            verdict["why"] += f"; {summary(found)} (sample {k})"
            return


def for_export(ctx, onnx_path, needed: list[str]) -> dict:
    """The export stage: ``model.onnx`` in float64 (onnx's reference evaluator) against PyTorch in
    float64 on the same inputs, within the replay's local bound (``export.float64``)."""
    import time

    from torch2ms.bounds import LOCAL_SHARE, widen
    from torch2ms.compare import Tolerance, compare_outputs, worst
    from torch2ms.export import float64

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
