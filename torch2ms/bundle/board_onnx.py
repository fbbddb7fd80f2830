"""The ONNX the board tools read, at an opset they document: ``model/model_opset11.onnx``.

CANN 8.0's ATC takes ONNX opsets 11 to 15 (ATC docs, ``--framework``, atlasatcparam_16_0014:
"ai.onnx operators of opset v11 to v15"), and AMCT's ``create_quant_config`` a model "generated
on ONNX opset 11" that runs in onnxruntime (AMCT docs, atlasamct_16_0153). The export stage
writes ``model.onnx`` at ``export.opset`` (17 by default), so ``package`` exports the PyTorch
model again at opset 11 (the TorchScript exporter, whose opset-11 symbolics exist; no newer
fallback) and checks it like ``model.onnx``: onnxruntime on the reference samples (and on the
sample of every other ``inputs[].batch`` size) against PyTorch's outputs in ``reference.npz``,
within the bound the MindIR passed (``build.bundle_tolerance``). ``atc.sh``, the fp16 plan's
``keep_dtype.cfg`` and the INT8 plan's ``amct_quant.cfg`` then name this file's nodes, and the
plans are emulated on it.

A model.onnx already at opset 11 is used as is. An ONNX source at another opset, or a model with
an operator no opset-11 symbolic exports, keeps ``model.onnx`` for ATC, with a warning naming the
opset. The file is cached in ``<run>/board/`` under the sha256 of model.onnx and reference.npz.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from torch2ms.errors import CheckFailed

OPSET = 11
NAME = f"model_opset{OPSET}.onnx"


def opset_of(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def board_onnx(recipe, run_root: Path, onnx_path: Path, ref_path: Path, tolerance: dict, log: Callable = print):
    """(the ONNX the board tools read, a warning for the bundle or None)."""
    from torch2ms.pipeline.workspace import sha256_file

    opset = opset_of(onnx_path)
    if opset == OPSET:
        return onnx_path, None
    lost = (
        f"model.onnx is opset {opset}: ATC (CANN 8.0) documents ONNX opsets 11-15 and AMCT opset 11; atc.sh and "
        "amct_quant.cfg use it anyway"
    )
    if recipe.model.onnx:
        return onnx_path, f"{lost} (an ONNX source is not exported again)"
    out = run_root / "board" / NAME
    key = {"onnx": sha256_file(onnx_path), "reference": sha256_file(ref_path), "opset": OPSET}
    stamp = out.with_suffix(".json")
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        return out, None
    log(f"exporting the model again at opset {OPSET} for ATC and AMCT, checked against PyTorch")
    out.parent.mkdir(parents=True, exist_ok=True)
    produced = _export(recipe, out, ref_path, log)
    if produced != OPSET:
        out.unlink(missing_ok=True)
        why = f"it needs opset {produced}" if produced else "no exporter path wrote it"
        return onnx_path, f"{lost} (the model does not export at opset {OPSET}: {why})"
    figures = check(out, ref_path, tolerance)
    stamp.write_text(json.dumps({"key": key, "metrics": figures}, indent=2) + "\n")
    return out, None


def _export(recipe, out: Path, ref_path: Path, log: Callable) -> int:
    """Exports at ``OPSET`` (TorchScript, falling back to newer opsets as the export stage does);
    returns the opset it wrote, or 0 when no opset exported it."""
    import torch

    from torch2ms.errors import ModelError
    from torch2ms.export.exporters import export_model
    from torch2ms.model_loader import build_model
    from torch2ms.pipeline.workspace import load_npz, split_reference

    inputs, reference = split_reference(load_npz(ref_path))
    spec = recipe.model_copy(
        update={"export": recipe.export.model_copy(update={"opset": OPSET, "exporter": "torchscript"})}
    )
    example = tuple(torch.from_numpy(v) for v in inputs[0].values())
    try:
        produced, _, _ = export_model(build_model(recipe), example, out, list(inputs[0]), list(reference[0]), spec, log)
    except ModelError:
        return 0
    return produced.opset


def check(path: Path, ref_path: Path, tolerance: dict) -> dict:
    """onnxruntime on ``path`` against PyTorch's outputs (the samples, and one per other batch
    size); ``CheckFailed`` naming the output and the figures outside ``tolerance``."""
    import onnx

    from torch2ms.compare import Tolerance, compare_outputs
    from torch2ms.graph.onnxrt import REFERENCE, session
    from torch2ms.pipeline.workspace import load_npz, split_batches, split_reference

    arrays = load_npz(ref_path)
    inputs, reference = split_reference(arrays)
    batches = split_batches(arrays)
    op_types = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    sess = session(str(path), REFERENCE, op_types)
    names = list(reference[0])
    run = lambda s: dict(zip(names, sess.run(names, s)))  # noqa: E731
    tol = Tolerance(tolerance["rel_error"], tolerance["cosine"], 0.0)
    figures, bad = {}, []
    for label, ins, refs in [("samples", inputs, reference)] + [
        (f"batch {n}", [i], [o]) for n, (i, o) in sorted(batches.items())
    ]:
        for m in compare_outputs([run(s) for s in ins], refs):
            figures[f"{label}: {m.name}"] = {"rel_error": m.rel_error, "cosine": m.cosine}
            bad += [f"{label}, output {m.name!r}: {v}" for v in tol.violations(m)]
    if bad:
        raise CheckFailed(
            f"{path.name} (the opset-{OPSET} ONNX for ATC and AMCT) does not match PyTorch: {'; '.join(bad)}",
            hint="the opset-11 export differs from the checked model.onnx; report it with the recipe",
        )
    return figures
