"""The checks the pipeline's runner is handed (``pipeline.checks.Checks``): the recipe's task
(``torch2ms.tasks``), its converter plugins (``torch2ms.custom.plugins``), diff's localisation
(``torch2ms.divergence``) and the evidence past ``check.ceiling``, each from the layer that owns it."""

from __future__ import annotations

from pathlib import Path

from torch2ms import divergence
from torch2ms.compare import Tolerance
from torch2ms.custom import plugins
from torch2ms.divergence.evidence import for_compiled, for_reference_off
from torch2ms.export.verdict import for_export
from torch2ms.pipeline import evidence as proof
from torch2ms.pipeline.checks import Checks
from torch2ms.tasks import bound, gate, task_for


class PipelineChecks(Checks):
    def task_check(self, recipe, outputs, reference, floor: float | None, source: str | None):
        t = task_for(recipe)
        result = t.measure(recipe, outputs, reference) if t else None
        if result is None:
            return None, None
        b = bound(recipe, t, floor, source or "")
        result.gate = b
        if result.agreement < b["agreement"]:
            why = "" if b["by"] == "recipe" else f" ({b['by']})"
            return result, f"{result.metric} {result.agreement:.4f} < {b['agreement']:.4g}{why}"
        return result, None

    def task_note(self, recipe) -> str | None:
        t = task_for(recipe)
        if t is None:
            return None
        need = gate(recipe, t)
        gated = f"a stage fails below {need:g}" if need else "report only"
        return f"Task ({recipe.task}): each stage's outputs vs PyTorch's; {gated} (check.task_agreement)."

    def plugins(self, recipe) -> dict[str, list[str]]:
        return plugins.load_for(recipe)

    def plugin_fingerprint(self, found: dict, kernels: bool) -> dict:
        return plugins.fingerprint(found, kernels=kernels)

    def localize(self, ctx, stage: str, out: Path):
        tol = Tolerance(ctx.recipe.check.rel_error, ctx.recipe.check.cosine)
        inputs = ctx.reference_inputs()
        # divergence.localize is looked up when called: a test replaces it
        report = divergence.localize(
            ctx.artifact("model.onnx"), out, inputs, tol, stage, display_dir=ctx.stage_dir(stage)
        )
        divergence.write_diff(report, out)
        return report

    def evidence(self, ctx, stage, out: Path, beyond: list[str], diff, outputs) -> dict:
        if stage.localize:
            return proof.for_localized(diff, stage.name, beyond)
        if stage.noise_floor:
            return for_export(ctx, out / "model.onnx", beyond)
        return for_compiled(ctx, stage, beyond, outputs)

    def reference_off(self, ctx, diff, stage: str, outputs, needed: list[str]) -> dict | None:
        return for_reference_off(ctx, diff, stage, outputs, needed)
