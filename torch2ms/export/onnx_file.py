"""An ONNX file as the source (recipe ``model: {onnx: path}``): the export stage imports it
instead of exporting a PyTorch model.

The file is validated before anything is written: readable (not truncated), its external data
present, ``onnx.checker`` clean, an opset, domains and dtypes torch2ms takes (``graph.load.
check_model``), and graph inputs matching the recipe's ``inputs`` by name, dtype and shape (a
symbolic dimension takes the recipe's size). onnxruntime's outputs on the seeded samples are then
the reference every later stage is checked against, in place of PyTorch's; the stage records
what the export stage records (ONNX op counts, BatchNorm nodes kept), with ``export_path``
``{"exporter": "onnx file", "opset": ...}``. The model, external data included, is written as one
``model.onnx``, its open dimensions made the recipe's (``export.onnx_shapes``, listed in the
stage's ``extra.dimensions_fixed``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torch2ms.errors import OnnxError, RecipeError
from torch2ms.pipeline.stage import StageOutput
from torch2ms.pipeline.workspace import pack_batches, pack_reference, save_npz

PACKAGE_PREFIX = "package:"


def source_path(recipe) -> Path:
    """The recipe's ``model.onnx`` resolved (relative to the recipe's folder, or
    ``package:<module>/<path>`` inside an installed package, e.g. the models rapidocr ships); it must
    exist."""
    entry = recipe.model.onnx
    path = _in_package(entry) if entry.startswith(PACKAGE_PREFIX) else recipe.resolve(entry)
    if not path.is_file():
        raise RecipeError(
            f"model.onnx: {path}: file not found",
            hint="give the path of an .onnx file, relative to the recipe's folder; build output such as another "
            "run's export/model.onnx must be written first (recipes/deeplabv3plus_onnx.yaml: make convert)",
        )
    return path


def _in_package(entry: str) -> Path:
    """``package:<module>/<path>``: ``<path>`` in the folder of the installed module ``<module>``."""
    import importlib.util

    module, _, inner = entry[len(PACKAGE_PREFIX) :].partition("/")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise RecipeError(
            f"model.onnx: {entry}: no installed package {module!r}",
            hint="install it (the fixtures' packages: requirements.txt), or give a file path",
        )
    return Path(next(iter(spec.submodule_search_locations))) / inner


def read_source(recipe):
    """The validated ``model.onnx`` file of the recipe, loaded with its external data."""
    import onnx

    from torch2ms.graph.load import read_onnx
    from torch2ms.graph.validate import check_model

    path = source_path(recipe)
    _external_data_present(path)
    try:
        model = read_onnx(path)
    except OnnxError as err:
        raise OnnxError(f"model.onnx: {err.message}", hint=err.hint) from None
    from torch2ms.graph.custom import embed_references

    embed_references(model)  # a plugin's custom op, as onnxruntime can run it: the reference (graph.custom)
    check_model(model, f"model.onnx: {path}")  # opset, domains, dtypes first: the clearest reasons
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise OnnxError(f"model.onnx: {path} fails onnx.checker: {first}", hint="fix or re-export the model") from None
    _match_inputs(model, recipe, path)
    return model


def _external_data_present(path: Path) -> None:
    """Every external data file the model's tensors name exists beside it."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    try:
        bare = onnx.load(str(path), load_external_data=False)
    except Exception:
        return  # not readable at all: read_onnx names it
    for t in _get_all_tensors(bare):
        if uses_external_data(t):
            location = path.parent / ExternalDataInfo(t).location
            if not location.is_file():
                raise OnnxError(
                    f"model.onnx: {path}: external data missing: tensor {t.name!r} is stored in {location}, "
                    "which does not exist",
                    hint="keep the external data files beside the .onnx file (their names are in the model)",
                )


def _match_inputs(model, recipe, path: Path) -> None:
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    wanted = [i.name for i in recipe.inputs]
    if sorted(graph_inputs) != sorted(wanted):
        raise RecipeError(
            f"inputs: {path} takes {sorted(graph_inputs)}, the recipe lists {wanted}",
            hint="name the recipe's inputs after the ONNX graph inputs",
        )
    for k, spec in enumerate(recipe.inputs):
        t = graph_inputs[spec.name].type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype != np.dtype(spec.dtype):
            raise RecipeError(f"inputs.{k}.dtype: {path} input {spec.name!r} is {dtype}, the recipe says {spec.dtype}")
        # a dim_value of -1 (PaddlePaddle's exporter: rapidocr's cls model) is a dynamic dimension too
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]
        if len(dims) != len(spec.shape) or any(d is not None and d != s for d, s in zip(dims, spec.shape)):
            shown = ["?" if d is None else d for d in dims]
            raise RecipeError(
                f"inputs.{k}.shape: {path} input {spec.name!r} is {shown}, the recipe says {list(spec.shape)}"
            )


def import_onnx(ctx, out: Path) -> StageOutput:
    """The export stage for an ONNX source: validate, write model.onnx, reference = onnxruntime
    under the reference policy (``graph.onnxrt.run_reference``), recorded as the export stage's."""
    import onnx

    from torch2ms.export.onnx_shapes import fix_dimensions
    from torch2ms.graph.onnxrt import run_reference
    from torch2ms.graph.validate import model_opset
    from torch2ms.samples import batch_samples, sample_inputs

    recipe = ctx.recipe
    model = read_source(recipe)
    onnx_path = out / "model.onnx"
    onnx.save(model, str(onnx_path))  # external data, loaded above, now inside the one file
    names = [o.name for o in model.graph.output]
    samples = sample_inputs(recipe)
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    extra_in = batch_samples(recipe)
    ort_all, policy = run_reference(onnx_path, ops, [*samples, *extra_in.values()], names)
    outputs, extra_out = ort_all[: len(samples)], dict(zip(extra_in, ort_all[len(samples) :]))
    save_npz(
        out / "reference.npz",
        {**pack_reference(samples, outputs), **pack_batches({n: (extra_in[n], extra_out[n]) for n in extra_in})},
    )
    fixed = fix_dimensions(model, recipe, outputs[0])
    if fixed:  # the shapes the run checked, declared (export.onnx_shapes)
        onnx.save(model, str(onnx_path))
    ctx.cache["reference"] = (samples, outputs)
    ctx.cache["batch_reference"] = {n: (extra_in[n], extra_out[n]) for n in sorted(extra_in)}
    counts = {
        "onnx_nodes": len(model.graph.node),
        "batchnorm_nodes": ops.get("BatchNormalization", 0),
        "onnx_ops": dict(sorted(ops.items())),
    }
    extra = {"init": "onnx file", "export_path": {"exporter": "onnx file", "opset": model_opset(model)}}
    extra["onnxruntime"] = policy
    if fixed:
        extra["dimensions_fixed"] = fixed
    return StageOutput(outputs, counts=counts, extra=extra, batches=extra_out or None)
