"""Stage 1, export: PyTorch model -> ONNX with BatchNorm kept, plus the reference data.

Writes ``model.onnx`` and ``reference.npz`` (the seeded sample inputs and PyTorch's outputs for
them). Checked: onnxruntime on the ONNX vs PyTorch.

The export does not give up at the first exporter error. It tries these paths in order
(``export.exporter`` pins one; ``auto`` tries both):

1. the TorchScript exporter (``training=PRESERVE`` in eval mode, so BatchNorm stays a node and
   the rebuild makes ``nn.Conv2dBnAct`` blocks) at ``export.opset``, then at each newer opset up to
   ``TORCHSCRIPT_NEWEST`` when the error is the exporter's own (a symbolic missing or refusing at
   that opset: ``aten::col2im`` needs 18). An operator with no symbolic at any opset, or an error
   of the tracing itself, ends this path at once;
2. the dynamo exporter (``torch.export`` + onnxscript's torchlib) at ``max(export.opset, 18)``.
   It needs the onnxscript package. It decomposes what TorchScript has no symbolic for, and it
   folds BatchNorm into the conv before it in eval mode: the record says so.

``stage.json`` ``extra`` has ``export_path`` (exporter and opset that wrote model.onnx),
``export_attempts`` (each earlier path and why it failed) and ``exporter_changes`` (what the
path changed in the graph); the report's notes show them. When no path exports the model, the
error lists every path's reason and nothing is written.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from torch2ms.errors import ModelError, RecipeError
from torch2ms.graph.load import SUPPORTED_OPSETS, model_opset
from torch2ms.graph.onnxrt import run_reference
from torch2ms.module_record import record_modules
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import pack_batches, pack_reference, save_npz, sha256_file
from torch2ms.samples import batch_samples, sample_inputs


class ExportStage(Stage):
    name = "export"
    summary = "PyTorch -> ONNX with BatchNorm kept, plus seeded sample inputs and PyTorch's outputs"
    section = "export"
    writes = ("model.onnx", "reference.npz")
    noise_floor = True

    def config(self, recipe) -> dict:
        """The export section, the model spec, and the bytes behind it: the factory's source file,
        the checkpoint and the sample data (new data in the same file is a new reference)."""
        from torch2ms.model_loader import factory_source_sha256

        model = recipe.model.model_dump(mode="json")
        if recipe.model.onnx:
            model["onnx_sha256"] = _existing_file_sha256(recipe, recipe.model.onnx, "model.onnx")
            source = None
        else:
            source = factory_source_sha256(recipe.model.factory, [Path.cwd(), Path(recipe.base_dir).resolve()])
        if source:
            model["factory_source_sha256"] = source
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

        from torch2ms.model_loader import build_model, flatten_outputs

        recipe = ctx.recipe
        if recipe.model.onnx:  # an ONNX file as the source: imported, onnxruntime is the reference
            from torch2ms.onnx_source import import_onnx

            return import_onnx(ctx, out)
        model = build_model(recipe)  # not cached: a copy of the weights no later stage needs
        samples = sample_inputs(recipe)
        try:
            with torch.no_grad(), activation_range(model) as reached, batchnorm_layers_run(model) as batchnorm_run:
                raw_out = [model(*[torch.from_numpy(v) for v in s.values()]) for s in samples]
        except Exception as err:
            shapes = ", ".join(f"{i.name} {list(i.shape)}" for i in recipe.inputs)
            raise ModelError(
                f"{recipe.model.factory}: the model raised on the recipe's inputs ({shapes}): {type(err).__name__}: "
                f"{err}",
                hint="check inputs[].shape against what the model expects",
            ) from None
        torch_out = [flatten_outputs(o) for o in raw_out]
        if not torch_out[0]:
            raise ModelError(f"{recipe.model.factory}: the model returned no tensors ({type(raw_out[0]).__name__})")
        names = list(torch_out[0])
        outputs = [{k: v.detach().numpy().copy() for k, v in o.items()} for o in torch_out]
        extra_in = batch_samples(recipe)
        with torch.no_grad():
            extra_out = {
                n: {
                    k: v.detach().numpy().copy()
                    for k, v in flatten_outputs(model(*[torch.from_numpy(v) for v in s.values()])).items()
                }
                for n, s in extra_in.items()
            }

        class Wrapped(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return tuple(flatten_outputs(self.inner(*args)).values())

        wrapped = Wrapped(model).eval()
        onnx_path = out / "model.onnx"
        example = tuple(torch.from_numpy(v) for v in samples[0].values())
        # the board tools serve inputs[].batch from one model whose dimension 0 is -1
        dynamic = {i.name: {0: "batch"} for i in recipe.inputs if len(i.batch_sizes()) > 1} or None
        names_io = ([i.name for i in recipe.inputs], names, dynamic)
        attempts, tracer = export_onnx(wrapped, example, onnx_path, names_io, recipe)
        produced, failed = attempts[-1], attempts[:-1]
        for t in tracer:
            ctx.log(f"export: the trace may not generalize to other inputs: {t}")
        if failed:
            ctx.log(
                f"export: {produced.exporter} at opset {produced.opset} wrote model.onnx after "
                + "; ".join(describe_attempts(failed))
            )
        _strip_wrapper_names(onnx_path)
        record_modules(model, out)  # module tree + state_dict keys for the rebuild's classes and weight map
        import onnx

        onnx.checker.check_model(str(onnx_path))
        save_npz(
            out / "reference.npz",
            {**pack_reference(samples, outputs), **pack_batches({n: (extra_in[n], extra_out[n]) for n in extra_in})},
        )
        ctx.cache["reference"] = (samples, outputs)
        ctx.cache["batch_reference"] = {n: (extra_in[n], extra_out[n]) for n in sorted(extra_in)}
        del wrapped, raw_out, torch_out, example
        gc.collect()
        model_proto = onnx.load(str(onnx_path), load_external_data=False)
        ops: dict[str, int] = {}
        for n in model_proto.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        counts = {
            "onnx_nodes": len(model_proto.graph.node),
            "batchnorm_nodes": ops.get("BatchNormalization", 0),
            "onnx_ops": dict(sorted(ops.items())),
        }
        opset = model_opset(model_proto)
        del model_proto
        # one session for the samples and the extra batch sizes
        ort_all, ort_policy = run_reference(onnx_path, ops, [*samples, *extra_in.values()], names)
        ort_out, ort_batches = ort_all[: len(samples)], dict(zip(extra_in, ort_all[len(samples) :]))
        # float32 PyTorch against float64, which may widen this stage's bound (Tolerance.bound): measured
        # only when onnxruntime misses the recipe's own bound, since a floor can only widen it; so the
        # PyTorch model is kept until here
        floor = task_floor = None
        floor_needed = misses_recipe_bound(recipe, ort_out, outputs, ort_batches, ctx.cache["batch_reference"])
        if floor_needed:
            wide = float64_outputs(model, samples)
            floor, task_floor = float32_floor(outputs, wide), float32_task_floor(recipe, outputs, wide)
            del wide
        del model
        gc.collect()
        extra = {"init": recipe.model.init if not recipe.model.checkpoint else "checkpoint", **reached}
        extra["onnxruntime"] = ort_policy  # the reference is PyTorch; how onnxruntime ran to be checked against it
        # the dynamo exporter may keep opset 18 when asked for a lower one: the model says which
        extra["export_path"] = {"exporter": produced.exporter, "opset": opset}
        if failed:
            extra["export_attempts"] = [asdict(a) for a in failed]
        changes = exporter_changes(int(batchnorm_run), ops.get("BatchNormalization", 0))
        if changes:
            extra["exporter_changes"] = changes
        # false: onnxruntime met the recipe's bound, so float64 was not run (no floor could matter)
        extra["float32_floor_needed"] = floor_needed
        if floor:
            extra["float32_floor"] = floor
        if task_floor:
            extra["float32_task_floor"] = task_floor
        if tracer:
            extra["tracer_warnings"] = tracer
        return StageOutput(ort_out, counts=counts, extra=extra, batches=ort_batches or None)


# The newest opset the TorchScript exporter has symbolics for (torch.onnx declares 20 its highest;
# it writes 21-23 with a warning but no new symbolic, so they cannot export anything 20 cannot),
# within what the loader takes. onnxruntime 1.32 runs every opset up to 23 (tests check it).
TORCHSCRIPT_NEWEST = 20
# The dynamo exporter's torchlib is written for opset 18; a lower one goes through a version
# converter, which torch warns "may not be successful".
DYNAMO_OLDEST = 18
_NEEDS_OPSET = re.compile(r"Support for this operator was added in version (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY_LINE = re.compile(r"<class '([\w.]+)'>: (.*)")


@dataclass
class Attempt:
    """One try of an exporter at an opset; ``error`` says why it failed (None: it wrote model.onnx)."""

    exporter: str
    opset: int
    error: str | None = None


def export_plan(spec) -> list[tuple[str, list[int]]]:
    """The exporters ``export`` tries for the recipe's export section, each with its opsets in order."""
    newest = min(max(TORCHSCRIPT_NEWEST, spec.opset), SUPPORTED_OPSETS.stop - 1)
    torchscript = ("torchscript", list(range(spec.opset, newest + 1)))
    dynamo = ("dynamo", [max(spec.opset, DYNAMO_OLDEST)])
    return {"torchscript": [torchscript], "dynamo": [dynamo], "auto": [torchscript, dynamo]}[spec.exporter]


def export_onnx(wrapped, example, onnx_path: Path, names_io, recipe) -> tuple[list[Attempt], list[str]]:
    """Export ``wrapped`` to ``onnx_path`` by the first path of ``export_plan`` that works.

    Returns every attempt (the last one wrote the file) and the TracerWarnings of the TorchScript
    trace that did. Raises ``ModelError`` listing each path's reason when none works."""
    attempts: list[Attempt] = []
    for exporter, opsets in export_plan(recipe.export):
        queue = list(opsets)
        while queue:
            opset = queue.pop(0)
            try:
                if exporter == "torchscript":
                    tracer = _torchscript(wrapped, example, onnx_path, names_io, opset)
                else:
                    tracer = _dynamo(wrapped, example, onnx_path, names_io, opset)
                _loadable(onnx_path)
            except _PathFailed as failed:
                attempts.append(Attempt(exporter, opset, failed.reason))
                if failed.final:
                    queue = []
                    if opset != opsets[-1]:
                        attempts[-1].error += f" ({_span(opset + 1, opsets[-1])} not tried: {failed.final})"
                elif failed.needs and failed.needs > opset:
                    later = [o for o in queue if o >= failed.needs]
                    if len(later) != len(queue):
                        attempts[-1].error += f" ({_span(opset + 1, failed.needs - 1)} skipped)"
                    queue = later
                continue
            attempts.append(Attempt(exporter, opset))
            return attempts, tracer
    onnx_path.unlink(missing_ok=True)
    lines = "\n".join(f"  {line}" for line in describe_attempts(attempts))
    pinned = recipe.export.exporter != "auto"
    raise ModelError(
        f"torch.onnx.export failed for {recipe.model.factory} on every path "
        f"(export.exporter: {recipe.export.exporter}):\n{lines}",
        hint=(
            "export.exporter: auto also tries the other exporter; " if pinned else "the exporters' reasons are above; "
        )
        + "a model must be traceable with fixed input shapes",
    )


def describe_attempts(attempts: list[Attempt]) -> list[str]:
    """One line per failed path, consecutive opsets of one exporter failing alike merged:
    ``torchscript opsets 17-20: SymbolicValueError: ...``."""
    groups: list[list[Attempt]] = []
    for a in attempts:
        if a.error is None:
            continue
        last = groups[-1][-1] if groups else None
        same = last and last.exporter == a.exporter and _strip_opset(last) == _strip_opset(a)
        if same and a.opset == last.opset + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    lines = []
    for g in groups:
        lines.append(f"{g[0].exporter} {_span(g[0].opset, g[-1].opset)}: {g[0].error}")
    return lines


def _span(first: int, last: int) -> str:
    return f"opset {first}" if first == last else f"opsets {first}-{last}"


def _strip_opset(a: Attempt) -> str:
    return (a.error or "").replace(f"opset version {a.opset}", "opset version N")


class _PathFailed(Exception):
    """An exporter failed: ``reason`` for the record; ``final`` (why) when newer opsets cannot help,
    ``needs`` when the exporter names the opset that can."""

    def __init__(self, reason: str, final: str | None = None, needs: int | None = None):
        super().__init__(reason)
        self.reason, self.final, self.needs = reason, final, needs


def _reason(err: BaseException) -> str:
    """The first line of an exporter's error, or for the dynamo exporter the root cause from its
    "Exception summary" (its first line only says which of its three steps failed)."""
    text = _ANSI.sub("", str(err)).strip()
    lines = [line.strip() for line in text.splitlines()]
    if "## Exception summary" in lines:
        rest = [line for line in lines[lines.index("## Exception summary") + 1 :] if line]
        cause = _SUMMARY_LINE.match(rest[0]) if rest else None
        if cause:
            return f"{cause.group(1).rsplit('.', 1)[-1]}: {cause.group(2)}"
    if not lines or not lines[0]:
        return type(err).__name__
    # the TorchScript exporter's first line goes on with a plea for a pull request and IR dumps
    first = re.split(r"\s+Please feel free to request support|\s+\[Caused by", lines[0])[0]
    return f"{type(err).__name__}: {first}"


def _torchscript(wrapped, example, onnx_path: Path, names_io, opset: int) -> list[str]:
    import torch

    log = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(log), _native_stdout_dropped():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            torch.onnx.export(
                wrapped,
                example,
                str(onnx_path),
                dynamo=False,
                opset_version=opset,
                training=torch.onnx.TrainingMode.PRESERVE,
                do_constant_folding=True,
                input_names=names_io[0],
                output_names=names_io[1],
                dynamic_axes=names_io[2],
            )
    except Exception as err:
        reason = _reason(err)
        if not isinstance(err, torch.onnx.errors.OnnxExporterError):
            raise _PathFailed(reason, final="the error is the trace's, not an opset's") from None
        needs = _NEEDS_OPSET.search(str(err))
        if needs:
            raise _PathFailed(reason, needs=int(needs.group(1))) from None
        if isinstance(err, torch.onnx.errors.UnsupportedOperatorError):
            raise _PathFailed(reason, final="no opset has a symbolic for it") from None
        raise _PathFailed(reason) from None
    # A TracerWarning means the trace may only hold for these inputs (a Python branch on a
    # tensor value, a tensor turned into a number): say so, the check may pass by luck.
    return sorted(
        {
            f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)
        }
    )


@contextlib.contextmanager
def _native_stdout_dropped():
    """Drop what C++ writes to stdout while the block runs. The TorchScript exporter dumps its whole
    IR graph there on every error (its ONNX log is always on: torch tests the function
    ``_jit_is_onnx_log_enabled`` for truth instead of calling it); the reason is in the exception."""
    import os
    import sys
    import tempfile

    sys.__stdout__.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _dynamo(wrapped, example, onnx_path: Path, names_io, opset: int) -> list[str]:
    import torch

    if names_io[2]:
        # torch.export specializes a dimension whose example size is 1 and takes dynamic_shapes in
        # the structure of forward(*args): not wired up here
        raise _PathFailed("inputs[].batch (a dynamic batch dimension) is exported by the TorchScript exporter only")
    if importlib.util.find_spec("onnxscript") is None:
        raise _PathFailed("the dynamo exporter needs the onnxscript package, which is not installed")
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapped,
                example,
                str(onnx_path),
                dynamo=True,
                opset_version=opset,
                input_names=names_io[0],
                output_names=names_io[1],
                external_data=False,  # one self-contained model.onnx (the weights inline)
            )
    except Exception as err:
        raise _PathFailed(_reason(err)) from None
    return []


def _loadable(path: Path) -> None:
    """An exporter can write a model that is not valid ONNX (torch.nn.functional.unfold of an
    unbatched 3-D input: a Pad with 8 pads on a 3-D tensor, from either exporter); then that path
    failed."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path))
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as err:
        reason = re.sub(r"Load model from \S+ failed:", "", _reason(err))
        raise _PathFailed(f"wrote a model that does not load: {reason}") from None


def exporter_changes(batchnorm_run: int, batchnorm_nodes: int) -> list[str]:
    """What the exporter changed in the graph, measured: BatchNorm layers that ran in PyTorch but
    are no BatchNormalization node (the dynamo exporter folds them into the conv before them)."""
    if batchnorm_nodes >= batchnorm_run:
        return []
    return [
        f"BatchNorm folded by the exporter ({batchnorm_run - batchnorm_nodes} of {batchnorm_run} layers): "
        "Conv2dBnAct will fuse Conv->Act only"
    ]


@contextlib.contextmanager
def batchnorm_layers_run(model):
    """Count the BatchNorm calls while the block runs, per forward pass: yields a counter whose
    ``int()`` is the number of BatchNorm layer calls in one pass."""
    import torch

    counter = _Counter()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    handles = [m.register_forward_hook(counter.hook) for m in bns]
    handles.append(model.register_forward_hook(counter.end_pass))
    try:
        yield counter
    finally:
        for h in handles:
            h.remove()


class _Counter:
    def __init__(self):
        self.calls = self.passes = 0

    def hook(self, *_):
        self.calls += 1

    def end_pass(self, *_):
        self.passes += 1

    def __int__(self) -> int:
        return self.calls // max(self.passes, 1)


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


def misses_recipe_bound(recipe, outputs, reference, batches=None, batch_reference=None) -> bool:
    """Whether ``outputs`` (onnxruntime's, per sample) miss the recipe's own bounds against PyTorch's
    ``reference``: tensor bound, argmax agreement or task gate, also at the extra batch sizes. Only
    then can the float32 noise floor (which only widens a bound) decide the export stage's check."""
    from torch2ms.compare import Tolerance, compare_outputs
    from torch2ms.tasks import gate, task_for

    check = recipe.check
    tol = Tolerance(check.rel_error, check.cosine, check.argmax_agreement)
    try:
        metrics = compare_outputs(outputs, reference)
        for size, outs in (batches or {}).items():
            metrics += compare_outputs([outs], [batch_reference[size][1]])
    except (ValueError, KeyError):
        return True  # the runner reports it; the floor is measured as before
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


@contextlib.contextmanager
def activation_range(model):
    """Track the largest |value| any module of ``model`` outputs while the block runs (what random
    init reaches: trained-like after calibration, up to ~1e12 without it). Yields a dict that holds
    ``max_abs_activation`` and the module reaching it once the block ends."""
    import torch

    found = {"max_abs_activation": 0.0, "max_abs_activation_at": ""}

    def hook(module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel():
            low, high = torch.aminmax(output.detach())
            value = max(-float(low), float(high))
            if value > found["max_abs_activation"] or value != value:
                found["max_abs_activation"], found["max_abs_activation_at"] = value, names.get(module, "")

    names = {m: n for n, m in model.named_modules() if n}
    handles = [m.register_forward_hook(hook) for m in names]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def _existing_file_sha256(recipe, path: str, field: str) -> str:
    resolved = recipe.resolve_data(path)
    if not resolved.is_file():
        raise RecipeError(
            f"{field}: {resolved}: file not found",
            hint="check the path (a relative path starts at the recipe's folder)",
        )
    return sha256_file(resolved)


def _strip_wrapper_names(path: Path) -> None:
    """Drop the prefix the export wrapper adds to node names (``/inner/``) and weights (``inner.``)."""
    import onnx

    m = onnx.load(str(path))
    renamed = {t.name: t.name[len("inner.") :] for t in m.graph.initializer if t.name.startswith("inner.")}
    for t in m.graph.initializer:
        t.name = renamed.get(t.name, t.name)
    for n in m.graph.node:
        if n.name.startswith("/inner/"):
            n.name = n.name[len("/inner") :]
        n.input[:] = [renamed.get(i, i) for i in n.input]
    if m.graph.node:
        from torch2ms.pipeline.workspace import atomic_write_bytes

        atomic_write_bytes(path, m.SerializeToString())
