"""Stage 1, export: PyTorch model -> ONNX with BatchNorm kept, plus the reference data.

Writes ``model.onnx`` (TorchScript exporter, ``training=PRESERVE`` in eval mode, so BatchNorm
stays a node; the dynamo exporter would fold it) and ``reference.npz`` (the seeded sample
inputs and PyTorch's outputs for them). Checked: onnxruntime on the ONNX vs PyTorch.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np

from torch2ms.errors import ModelError, RecipeError
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import pack_batches, pack_reference, save_npz, sha256_file


def sample_inputs(recipe) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(recipe.check.seed)
    samples = []
    for k in range(recipe.check.samples):
        sample = {}
        for spec in recipe.inputs:
            sources = spec.data_sources()
            if k < len(sources):
                arr = _load_sample(recipe, sources[k], spec)
            else:
                arr = rng.standard_normal(spec.shape).astype(np.float32)
            sample[spec.name] = arr
        samples.append(sample)
    return samples


def batch_samples(recipe) -> dict[int, dict[str, np.ndarray]]:
    """One seeded sample per size of ``inputs[].batch`` other than shape[0] (the reference's):
    dimension 0 of the inputs that list the sizes is that size, the other inputs keep their shape."""
    batched = [i for i in recipe.inputs if len(i.batch_sizes()) > 1]
    out = {}
    for n in batched[0].batch_sizes() if batched else ():
        if n == batched[0].shape[0]:
            continue
        rng = np.random.default_rng([recipe.check.seed, n])
        out[n] = {
            i.name: rng.standard_normal((n, *i.shape[1:]) if len(i.batch_sizes()) > 1 else i.shape).astype(np.float32)
            for i in recipe.inputs
        }
    return out


def _load_sample(recipe, entry: str, spec) -> np.ndarray:
    path = recipe.resolve_data(entry)
    if not entry.endswith(".npy"):
        from torch2ms.postprocess.image import image_sample

        return image_sample(path, spec.shape, recipe, f"inputs.{spec.name}.data")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise RecipeError(f"inputs.{spec.name}.data: cannot read {path} as .npy ({err})") from None
    if tuple(arr.shape) != tuple(spec.shape):
        raise RecipeError(
            f"inputs.{spec.name}.data: {path} has shape {list(arr.shape)}, the recipe says {list(spec.shape)}"
        )
    return arr.astype(np.float32)


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
        return f"{c.get('onnx_nodes')} ONNX nodes, {c.get('batchnorm_nodes')} BatchNorm{scale}"

    def run(self, ctx, out: Path) -> StageOutput:
        import torch

        from torch2ms.model_loader import build_model, flatten_outputs

        recipe = ctx.recipe
        model = ctx.cache.get("torch_model")
        if model is None:
            model = ctx.cache["torch_model"] = build_model(recipe)
        samples = sample_inputs(recipe)
        try:
            with torch.no_grad(), activation_range(model) as reached:
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
        floor = float32_floor(model, samples, outputs)

        class Wrapped(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return tuple(flatten_outputs(self.inner(*args)).values())

        wrapped = Wrapped(model).eval()
        onnx_path = out / "model.onnx"
        example = tuple(torch.from_numpy(v) for v in samples[0].values())
        log = io.StringIO()
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(log):
                warnings.simplefilter("always", torch.jit.TracerWarning)
                torch.onnx.export(
                    wrapped,
                    example,
                    str(onnx_path),
                    dynamo=False,
                    opset_version=recipe.export.opset,
                    training=torch.onnx.TrainingMode.PRESERVE,
                    do_constant_folding=True,
                    input_names=[i.name for i in recipe.inputs],
                    output_names=names,
                    # the board tools serve inputs[].batch from one model whose dimension 0 is -1
                    dynamic_axes={i.name: {0: "batch"} for i in recipe.inputs if len(i.batch_sizes()) > 1} or None,
                )
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelError(
                f"torch.onnx.export failed for {recipe.model.factory}: {type(err).__name__}: {first}",
                hint="the exporter's reason is above; a model must be traceable with fixed input shapes",
            ) from None
        # A TracerWarning means the trace may only hold for these inputs (a Python branch on a
        # tensor value, a tensor turned into a number): say so, the check may pass by luck.
        tracer = sorted(
            {
                f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}"
                for w in caught
                if issubclass(w.category, torch.jit.TracerWarning)
            }
        )
        for t in tracer:
            ctx.log(f"export: the trace may not generalize to other inputs: {t}")
        _strip_wrapper_names(onnx_path)
        import onnx

        onnx.checker.check_model(str(onnx_path))
        save_npz(
            out / "reference.npz",
            {**pack_reference(samples, outputs), **pack_batches({n: (extra_in[n], extra_out[n]) for n in extra_in})},
        )
        ctx.cache["reference"] = (samples, outputs)
        ctx.cache["batch_reference"] = {n: (extra_in[n], extra_out[n]) for n in sorted(extra_in)}
        ort_out = run_onnxruntime(onnx_path, samples, names)
        ort_batches = {n: o for n, o in zip(extra_in, run_onnxruntime(onnx_path, list(extra_in.values()), names))}
        model_proto = onnx.load(str(onnx_path), load_external_data=False)
        ops: dict[str, int] = {}
        for n in model_proto.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        counts = {
            "onnx_nodes": len(model_proto.graph.node),
            "batchnorm_nodes": ops.get("BatchNormalization", 0),
            "onnx_ops": dict(sorted(ops.items())),
        }
        extra = {"init": recipe.model.init if not recipe.model.checkpoint else "checkpoint", **reached}
        if floor:
            extra["float32_floor"] = floor
        if tracer:
            extra["tracer_warnings"] = tracer
        return StageOutput(ort_out, counts=counts, extra=extra, batches=ort_batches or None)


def float32_floor(model, samples, outputs) -> dict[str, list[float]] | None:
    """Per output, (relative error, cosine) of PyTorch's float32 outputs against the same model in
    float64: what float32 arithmetic itself costs this network. The export stage's check (onnxruntime,
    another float32 implementation, against PyTorch) may widen to ``check.noise_factor`` times it.
    None when the model does not run in float64."""
    import copy

    import torch

    from torch2ms.compare import compare_outputs
    from torch2ms.model_loader import flatten_outputs

    try:
        wide = copy.deepcopy(model).double()
        with torch.no_grad():
            ref = [
                {
                    k: v.detach().numpy()
                    for k, v in flatten_outputs(wide(*[torch.from_numpy(a).double() for a in s.values()])).items()
                }
                for s in samples
            ]
    except Exception:
        return None
    metrics = compare_outputs([{k: v.astype(np.float64) for k, v in o.items()} for o in outputs], ref)
    return {m.name: [float(m.rel_error), float(m.cosine)] for m in metrics if m.nonfinite is None}


@contextlib.contextmanager
def activation_range(model):
    """Track the largest |value| any module of ``model`` outputs while the block runs (what random
    init reaches: trained-like after calibration, up to ~1e12 without it). Yields a dict that holds
    ``max_abs_activation`` and the module reaching it once the block ends."""
    import torch

    found = {"max_abs_activation": 0.0, "max_abs_activation_at": ""}

    def hook(module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel():
            value = float(output.detach().abs().max())
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


def run_onnxruntime(path: Path, samples, names) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    results = []
    for s in samples:
        res = sess.run(names, s)
        results.append(dict(zip(names, res)))
    return results
