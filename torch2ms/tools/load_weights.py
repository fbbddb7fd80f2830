"""New weights for an already converted network, without converting again (``torch2ms load-weights``).

The state_dict's keys and shapes must be the converted model's (``export/modules.json``): a key
missing, extra or of another shape is named and nothing is written. Its values go into the
exported graph's initializers (by name, or for a weight the exporter renamed, such as a Linear
weight written transposed for a MatMul, by the values the export recorded), and each stage
that generates code (rebuild, fold) runs its own passes and code generation again on that graph:
transposes, BatchNorm folding and fusion happen exactly as in the conversion. The code must come
out identical (the weights only change the checkpoint); the new checkpoint is then checked like
a stage: the network's outputs against PyTorch's with the same state_dict, within the recipe's
bounds. Only when every stage passes are ``<stage>/network.<name>.ckpt`` written.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch2ms.errors import CheckFailed, Torch2msError
from torch2ms.pipeline.workspace import array_hash


def code_stages(ctx) -> list[str]:
    """The run's stages that generate code (write network.py), in pipeline order: rebuild, fold."""
    return [st.name for st in ctx.pipeline() if "network.py" in st.writes]


@dataclass
class StageWeights:
    stage: str
    checkpoint: Path
    metrics: list  # OutputMetrics per output


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise Torch2msError(
            f"{path}: not readable with torch.load(weights_only=True): {type(err).__name__}: {err}",
            hint="save the weights with torch.save(model.state_dict(), path)",
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise Torch2msError(
            f"{path}: not a state_dict (a dict of tensors): {type(state).__name__}",
            hint="save the weights with torch.save(model.state_dict(), path)",
        )
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def check_keys(state: dict[str, np.ndarray], record: dict, path: Path) -> None:
    """Every key of the converted model, none more, each of its shape; else one error naming them."""
    expected = record["state_dict"]
    problems = [f"missing: {k} {e['shape']}" for k, e in expected.items() if k not in state]
    problems += [f"extra: {k} {list(v.shape)}" for k, v in state.items() if k not in expected]
    problems += [
        f"shape: {k} is {list(state[k].shape)}, the converted model's is {e['shape']}"
        for k, e in expected.items()
        if k in state and list(state[k].shape) != e["shape"]
    ]
    if problems:
        raise Torch2msError(
            f"{path}: {len(problems)} key(s) do not fit the converted model:\n  " + "\n  ".join(problems),
            hint="a state_dict of the same architecture (model.state_dict()); another architecture needs "
            "`torch2ms convert`",
        )


def substitute(onnx_path: Path, record: dict, state: dict[str, np.ndarray], out: Path) -> None:
    """``onnx_path`` with the initializers holding ``state``'s values, written to ``out``."""
    import onnx
    from onnx import numpy_helper

    expected = record["state_dict"]
    by_hash: dict[str, list[tuple[str, bool]]] = {}
    for k, e in expected.items():
        by_hash.setdefault(e["sha1"], []).append((k, False))
        if "sha1_t" in e:
            by_hash.setdefault(e["sha1_t"], []).append((k, True))
    model = onnx.load(str(onnx_path))
    placed = set()
    for t in model.graph.initializer:
        if t.name in state:
            key, transposed = t.name, False
        else:
            old = numpy_helper.to_array(t)
            found = by_hash.get(array_hash(old), [])
            # equal old values (zero-initialised buffers): only if the new values agree too
            if not found or len({array_hash(state[k].T if tr else state[k]) for k, tr in found}) != 1:
                continue
            key, transposed = found[0]
        new = state[key].T if transposed else state[key]
        dtype = numpy_helper.to_array(t).dtype
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(new.astype(dtype, copy=False)), t.name))
        placed.add(key)
    lost = [
        k
        for k in state
        if k not in placed and not k.endswith("num_batches_tracked") and array_hash(state[k]) != expected[k]["sha1"]
    ]
    if lost:
        raise Torch2msError(
            f"{len(lost)} key(s) changed but the exported graph holds them only inside other constants "
            f"(the exporter folded them): {', '.join(lost[:8])}{' ...' if len(lost) > 8 else ''}",
            hint="convert again with these weights (model.checkpoint in the recipe)",
        )
    onnx.save(model, str(out))


def pytorch_outputs(recipe, state: dict[str, np.ndarray], samples: list[dict]) -> list[dict[str, np.ndarray]]:
    import torch

    from torch2ms.model_loader import build_model, flatten_outputs

    model = build_model(recipe)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    model.eval()
    out = []
    with torch.no_grad():
        for s in samples:
            result = flatten_outputs(model(*map(torch.from_numpy, s.values())))
            out.append({k: v.detach().numpy().copy() for k, v in result.items()})
    return out


def load_weights(recipe, run_dir, state_path: Path, log=print) -> list[StageWeights]:
    """Check ``state_path`` against every code-generating stage of the run; write the checkpoints
    only when all pass (see the module docstring)."""
    from torch2ms.codegen.convert import generate, module_record
    from torch2ms.compare import Tolerance, compare_outputs
    from torch2ms.passes import ascend_passes, fold_passes, rebuild_passes
    from torch2ms.pipeline.context import RunContext
    from torch2ms.pipeline.workspace import sha256_file
    from torch2ms.runtime import msutil
    from torch2ms.stages import pipeline_stages

    ctx = RunContext(recipe, run_dir, log=log, stages=pipeline_stages())
    record = module_record(ctx)
    onnx_path = ctx.artifact("model.onnx")
    stages = [s for s in code_stages(ctx) if (ctx.stage_dir(s) / "network.py").is_file()]
    if not record.get("state_dict") or not onnx_path.is_file() or not stages:
        raise Torch2msError(
            f"{run_dir.root}: no converted network with a recorded state_dict (export/modules.json, network.py)",
            hint="run `torch2ms convert` first (a run converted before modules.json existed needs --force)",
        )
    state = read_state_dict(state_path)
    check_keys(state, record, state_path)
    samples = ctx.reference_inputs()
    names = list(ctx.reference()[1][0])
    reference = pytorch_outputs(recipe, state, samples)
    tol = Tolerance(recipe.check.rel_error, recipe.check.cosine)
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    done: list[tuple[StageWeights, Path]] = []
    with tempfile.TemporaryDirectory(prefix="torch2ms-weights-") as tmp:
        new_onnx = Path(tmp) / "model.onnx"
        substitute(onnx_path, record, state, new_onnx)
        for stage in stages:
            fuse = recipe.rebuild.fuse_conv_bn_act
            passes = rebuild_passes(fuse) if stage == "rebuild" else fold_passes(fuse)
            if stage == "fold" and recipe.fold.ascend_rewrites:
                passes += ascend_passes()
            _, _, net, _ = generate(ctx, new_onnx, passes, sha=sha256_file(onnx_path))
            stage_dir = ctx.stage_dir(stage)
            if net.source != (stage_dir / "network.py").read_text():
                raise Torch2msError(
                    f"{stage}: these weights change the generated code, not only its checkpoint (a weight written "
                    "into the code as a constant, or a fusion that depends on the values)",
                    hint="convert again with these weights (model.checkpoint in the recipe)",
                )
            ckpt = Path(tmp) / f"{stage}.ckpt"
            ms.save_checkpoint([{"name": k, "data": ms.Tensor.from_numpy(v)} for k, v in net.params.items()], str(ckpt))
            module = msutil.load_network_module(stage_dir / "network.py", f"weights_{stage}")
            outputs = msutil.run_cell(module.build(str(ckpt)), samples, names)
            metrics = compare_outputs(outputs, reference)
            bad = [f"{m.name}: {'; '.join(tol.violations(m))}" for m in metrics if tol.violations(m)]
            if bad:
                raise CheckFailed(
                    f"{stage}: the network with {state_path.name}'s weights leaves PyTorch's outputs: " + "; ".join(bad)
                )
            errors = ", ".join(f"{m.name} rel {m.rel_error:.2g}" for m in metrics)
            log(f"load-weights: {stage} matches PyTorch ({errors})")
            done.append((StageWeights(stage, stage_dir / f"network.{state_path.stem}.ckpt", metrics), ckpt))
        for weights, ckpt in done:  # every stage passed: now write
            os.replace(ckpt, weights.checkpoint) if _same_device(ckpt, weights.checkpoint) else _copy(ckpt, weights)
    return [w for w, _ in done]


def _same_device(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b.parent).st_dev


def _copy(src: Path, weights: StageWeights) -> None:
    import shutil

    part = weights.checkpoint.with_suffix(".ckpt.part")
    shutil.copyfile(src, part)
    os.replace(part, weights.checkpoint)
