"""Stage 1, export: PyTorch model -> ONNX with BatchNorm kept, plus the reference data.

Writes ``model.onnx`` and ``reference.npz`` (the seeded sample inputs and PyTorch's outputs for
them). Checked: onnxruntime on the ONNX vs PyTorch. How, one concern per module of
``torch2ms.export``: PyTorch's outputs (``pytorch``, with the ``hooks``), the exporter fallback
chain (``exporters``), the float32 noise floor (``floor``).

``stage.json`` ``extra`` has ``export_path`` (exporter and opset that wrote model.onnx),
``export_attempts`` (each earlier path and why it failed) and ``exporter_changes`` (what the
path changed in the graph); the report's notes show them. When no path exports the model, the
error lists every path's reason and nothing is written.
"""

from __future__ import annotations

import gc
from dataclasses import asdict
from pathlib import Path

from torch2ms.errors import RecipeError
from torch2ms.export.exporters import Attempt, describe_attempts, export_model
from torch2ms.export.floor import floor_fields
from torch2ms.export.hooks import exporter_changes
from torch2ms.export.modules import record_modules
from torch2ms.export.pytorch import onnx_counts, outputs_of, run_samples
from torch2ms.export.verdict import CACHE_KEY as VERDICT
from torch2ms.export.verdict import settle
from torch2ms.graph.onnxrt import run_reference
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import pack_batches, pack_lengths, pack_reference, save_npz, sha256_file
from torch2ms.samples import batch_samples, sample_inputs, sequence_samples


class ExportStage(Stage):
    name = "export"
    summary = "PyTorch -> ONNX with BatchNorm kept, plus seeded sample inputs and PyTorch's outputs"
    section = "export"
    writes = ("model.onnx", "reference.npz", "modules.json")  # modules.json: from a PyTorch source only
    noise_floor = True
    # torch, the traced graph and PyTorch's float64 copy of the model leave with its process: in one
    # process they stayed resident through the four MindSpore stages (design_measurements.md)
    own_process = True

    def config(self, recipe) -> dict:
        """The export section, the model spec, and the bytes behind it: the factory's source file,
        the checkpoint and the sample data (new data in the same file is a new reference)."""
        from torch2ms.model_loader import factory_source

        model = recipe.model.model_dump(mode="json")
        if recipe.model.onnx:
            from torch2ms.export.onnx_file import source_path

            model["onnx_sha256"] = sha256_file(source_path(recipe))
            source = None
        else:
            source = factory_source(recipe.model.factory, [Path.cwd(), Path(recipe.base_dir).resolve()])
        if source:
            model["factory_source_sha256"] = sha256_file(source)
        if recipe.model.checkpoint:
            model["checkpoint_sha256"] = _existing_file_sha256(recipe, recipe.model.checkpoint, "model.checkpoint")
        data = {}
        for i in recipe.inputs:
            hashes = [_existing_file_sha256(recipe, e, f"inputs.{i.name}.data") for e in i.data_sources()]
            if hashes:
                data[i.name] = hashes[0] if isinstance(i.data, str) else hashes
        # photos become sample tensors through the preprocessing (and the letterbox of a yolo postprocess)
        images = any(not e.endswith(".npy") for i in recipe.inputs for e in i.data_sources())
        return {
            **super().config(recipe),
            "model": model,
            **({"inputs_data_sha256": data} if data else {}),
            **({"preprocess": recipe.preprocess.model_dump(mode="json")} if images else {}),
        }

    def notes(self, record: dict) -> str:
        c, e = record.get("counts", {}), record.get("extra", {})
        reached = e.get("max_abs_activation")
        scale = f", activations up to {reached:.3g}" if reached is not None else ""
        notes = f"{c.get('onnx_nodes')} ONNX nodes, {c.get('batchnorm_nodes')} BatchNorm{scale}"
        attempts = [Attempt(**a) for a in e.get("export_attempts", [])]
        path = e.get("export_path")
        if attempts and path:
            notes += f"; exported by {path['exporter']} at opset {path['opset']} after " + "; ".join(
                describe_attempts(attempts)
            )
        for change in e.get("exporter_changes", []):
            notes += f"; {change}"
        return notes

    def run(self, ctx, out: Path) -> StageOutput:
        import torch

        from torch2ms.model_loader import build_model

        recipe = ctx.recipe
        if recipe.model.onnx:  # an ONNX file as the source: imported, onnxruntime is the reference
            from torch2ms.export.onnx_file import import_onnx

            return import_onnx(ctx, out)
        model = build_model(recipe)  # not cached: a copy of the weights no later stage needs
        samples = sample_inputs(recipe)
        torch_run = run_samples(recipe, model, samples)
        lengths = check_sequence_lengths(recipe, model)
        extra_in = batch_samples(recipe)
        batches = {n: (extra_in[n], outputs_of(model, s)) for n, s in extra_in.items()}
        onnx_path = out / "model.onnx"
        example = tuple(torch.from_numpy(v) for v in samples[0].values())
        inputs = [i.name for i in recipe.inputs]
        produced, failed, tracer = export_model(model, example, onnx_path, inputs, torch_run.names, recipe, ctx.log)
        record_modules(model, out)  # module tree + state_dict keys for the rebuild's classes and weight map
        save_npz(
            out / "reference.npz",
            {**pack_reference(samples, torch_run.outputs), **pack_batches(batches), **pack_lengths(lengths)},
        )
        ctx.cache["sequence_reference"] = dict(sorted(lengths.items()))
        ctx.cache["reference"] = (samples, torch_run.outputs)
        ctx.cache["batch_reference"] = {n: batches[n] for n in sorted(extra_in)}
        del example
        gc.collect()
        counts, opset = onnx_counts(onnx_path)
        # one session for the samples and the extra batch sizes
        ort_all, ort_policy = run_reference(
            onnx_path, counts["onnx_ops"], [*samples, *extra_in.values()], torch_run.names
        )
        ort_out, ort_batches = ort_all[: len(samples)], dict(zip(extra_in, ort_all[len(samples) :]))
        # the float32 noise floor needs the PyTorch model, so it is kept until here
        floor, ctx.cache["float64_reference"] = floor_fields(
            recipe, model, samples, torch_run.outputs, ort_out, ort_batches, ctx.cache["batch_reference"]
        )
        (ort_out, ort_batches), verdict = settle(
            ctx, model, onnx_path, torch_run.names, produced, floor, (ort_out, ort_batches)
        )
        del model
        gc.collect()
        if verdict and verdict["decided"].endswith("export"):  # the other exporter's file replaced model.onnx
            counts, opset = onnx_counts(onnx_path)
            produced = Attempt(verdict["tries"][-1]["exporter"], opset)
        extra = {"init": recipe.model.init if not recipe.model.checkpoint else "checkpoint", **torch_run.reached}
        extra["onnxruntime"] = ort_policy  # the reference is PyTorch; how onnxruntime ran to be checked against it
        # the dynamo exporter may keep opset 18 when asked for a lower one: the model says which
        extra["export_path"] = {"exporter": produced.exporter, "opset": opset}
        if failed:
            extra["export_attempts"] = [asdict(a) for a in failed]
        changes = exporter_changes(torch_run.batchnorm_run, counts["batchnorm_nodes"])
        if changes:
            extra["exporter_changes"] = changes
        extra.update(floor)
        if tracer:
            extra["tracer_warnings"] = tracer
        if verdict:
            extra["export_verdict"] = ctx.cache[VERDICT] = verdict
        return StageOutput(ort_out, counts=counts, extra=extra, batches=ort_batches or None)


def _existing_file_sha256(recipe, path: str, field: str) -> str:
    resolved = recipe.resolve_data(path)
    if not resolved.is_file():
        raise RecipeError(
            f"{field}: {resolved}: file not found",
            hint="check the path (a relative path starts at the recipe's folder)",
        )
    return sha256_file(resolved)


def check_sequence_lengths(recipe, model) -> dict:
    """A seeded sample and PyTorch's outputs at every other length of ``inputs[].sequence``;
    a length the model cannot take (above its position embeddings) is a recipe error, raised
    before anything is written."""
    from torch2ms.errors import RecipeError

    out = {}
    for n, sample in sequence_samples(recipe).items():
        try:
            out[n] = (sample, outputs_of(model, sample))
        except Exception as err:  # noqa: BLE001 - any failure of the user's model at that length
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise RecipeError(
                f"inputs[].sequence: the model fails at sequence length {n} ({type(err).__name__}: {first})",
                hint="list only lengths the model takes (at most its position-embedding size, e.g. "
                "max_position_embeddings), or drop the length",
            ) from None
    return out
