"""The float32 noise floor: what float32 arithmetic itself costs a network, measured as PyTorch's
float32 outputs against the same model run in float64.

The export stage's check (onnxruntime, another float32 implementation, against PyTorch) may widen
its bound to ``check.noise_factor`` times this floor (``Tolerance.bound``, ``tasks.bound``). A
floor can only widen a bound, so it is measured only when onnxruntime misses the recipe's own
bound (``misses_recipe_bound``).
"""

from __future__ import annotations

import numpy as np


def float64_outputs(model, samples) -> list[dict[str, np.ndarray]] | None:
    """The same model's outputs in float64 on ``samples``: what float32 arithmetic is measured
    against (``float32_floor``, ``float32_task_floor``). None when the model does not run in float64."""
    import copy

    import torch

    from torch2ms.model_loader import flatten_outputs

    # A float32 model is widened in place and narrowed back afterwards (exact: every value came from
    # float32), so the float64 weights never sit beside a float32 copy; other dtypes take a copy.
    tensors = [*model.parameters(), *model.buffers()]
    in_place = all(t.dtype == torch.float32 for t in tensors if t.is_floating_point())
    try:
        wide = model.double() if in_place else copy.deepcopy(model).double()
        with torch.no_grad():
            return [
                {
                    k: v.detach().numpy()
                    for k, v in flatten_outputs(wide(*[_widen(torch.from_numpy(a)) for a in s.values()])).items()
                }
                for s in samples
            ]
    except Exception:
        return None
    finally:
        if in_place:
            model.float()


def _ort_metrics(outputs, reference, batches=None, batch_reference=None) -> list | None:
    """onnxruntime's metrics against PyTorch's ``reference``, at the samples and the extra batch
    sizes; None when they cannot be compared (the runner reports it)."""
    from torch2ms.compare import compare_outputs

    try:
        metrics = compare_outputs(outputs, reference)
        for size, outs in (batches or {}).items():
            metrics += compare_outputs([outs], [batch_reference[size][1]])
    except (ValueError, KeyError):
        return None
    return metrics


def misses_recipe_bound(recipe, outputs, reference, metrics) -> bool:
    """Whether onnxruntime's ``outputs`` (per sample; ``metrics`` from ``_ort_metrics``) miss the
    recipe's own bounds against PyTorch's ``reference``: tensor bound, argmax agreement or task
    gate, also at the extra batch sizes. Only then can the float32 noise floor (which only widens a
    bound) decide the export stage's check."""
    from torch2ms.compare import Tolerance
    from torch2ms.tasks import gate, task_for

    if metrics is None:
        return True  # the floor is measured as before
    check = recipe.check
    tol = Tolerance(check.rel_error, check.cosine, check.argmax_agreement)
    if any(tol.violations(m) for m in metrics):
        return True
    t = task_for(recipe)
    result = t.measure(recipe, outputs, reference) if t else None
    return result is not None and result.agreement < gate(recipe, t)


def _widen(t):
    """A float input in float64; token ids and masks as they are."""
    return t.double() if t.is_floating_point() else t


def float32_floor(outputs, wide) -> dict[str, list[float]] | None:
    """Per output, (relative error, cosine) of PyTorch's float32 outputs against the same model in
    float64 (``wide``): what float32 arithmetic itself costs this network. The export stage's check
    (onnxruntime, another float32 implementation, against PyTorch) may widen to
    ``check.noise_factor`` times it."""
    from torch2ms.compare import compare_outputs

    if wide is None:
        return None
    metrics = compare_outputs([{k: v.astype(np.float64) for k, v in o.items()} for o in outputs], wide)
    return {m.name: [float(m.rel_error), float(m.cosine)] for m in metrics if m.nonfinite is None}


def float32_task_floor(recipe, outputs, wide) -> dict | None:
    """The recipe task's agreement of PyTorch's float32 outputs with float64's (``wide``), e.g. the
    share of float64's boxes float32 keeps: the export stage's task gate may widen to
    ``check.noise_factor`` times its disagreement (``tasks.bound``). None without a task."""
    from torch2ms.tasks import task_for

    t = task_for(recipe)
    if wide is None or t is None:
        return None
    result = t.measure(recipe, outputs, wide)
    return {"metric": result.metric, "agreement": result.agreement} if result else None


def floor_fields(recipe, model, samples, outputs, ort_out, ort_batches, batch_reference) -> tuple[dict, dict | None]:
    """The export record's floor fields: ``float32_floor_needed`` (false: onnxruntime met the
    recipe's bound, so float64 was not run, no floor could matter), and when it was needed the
    ``float32_floor`` and ``float32_task_floor`` measured. ``outputs``: PyTorch's float32 outputs
    per sample; ``ort_out``/``ort_batches``: onnxruntime's, checked against them.

    Also returns PyTorch's float64 outputs when they were run (``{"samples": [...], "batches":
    {size: [...]}}``, else None): what ``model.onnx`` in float64 is held to when the check lies
    beyond ``check.ceiling`` (``export.verdict.for_export``)."""
    metrics = _ort_metrics(ort_out, outputs, ort_batches, batch_reference)  # once, for both questions
    fields: dict = {"float32_floor_needed": misses_recipe_bound(recipe, ort_out, outputs, metrics)}
    if not fields["float32_floor_needed"]:
        return fields, None
    wide = float64_outputs(model, samples)
    floor, task_floor = float32_floor(outputs, wide), float32_task_floor(recipe, outputs, wide)
    if floor:
        fields["float32_floor"] = floor
    if task_floor:
        fields["float32_task_floor"] = task_floor
    if wide is None:
        return fields, None
    # the extra batch sizes in float64 only when the float64 evidence may be asked for
    past = _past_ceiling(recipe, metrics)
    batches = {n: float64_outputs(model, [sample]) for n, (sample, _) in (batch_reference or {}).items() if past}
    return fields, {"samples": wide, "batches": batches}


def _past_ceiling(recipe, metrics) -> bool:
    """Whether onnxruntime lies beyond ``check.ceiling`` somewhere (samples or extra batch sizes;
    ``metrics`` from ``_ort_metrics``): only then does the runner ask for the export's float64
    evidence (``pipeline.evidence``)."""
    from torch2ms.bounds import ceiling

    if metrics is None:
        return True
    rel, cos = ceiling(recipe.check)
    return any(not (m.rel_error <= rel and m.cosine >= cos) for m in metrics)
