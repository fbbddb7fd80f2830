"""True fp16 execution here, against the fp16 emulation (``emulate.Fp16Emulator``): how honest the
fp16 plan's figures are. PyTorch runs the model with ``.half()`` on CPU; MindSpore runs the generated
network with fp16 parameters and inputs on CPU. A kernel without fp16 support is named, the other
engine still measured. ``torch2ms precision --true-fp16`` writes the result to true_fp16.json and
precision.md."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from torch2ms.bundle.emulate import emulation_metrics, sig
from torch2ms.pipeline.markdown import table


def true_fp16(recipe, reference_in: list[dict], reference_out: list[dict], emulated: list[dict], fold_dir=None) -> dict:
    """Run the model in real fp16 (PyTorch ``.half()`` on CPU; the generated MindSpore network with
    fp16 parameters and inputs on CPU, from ``fold_dir``) and compare each with PyTorch fp32 and
    with the emulation: per output, the true fp16 error, the emulated error, and
    ``max|emulated - true| / max|PyTorch|``."""
    results = {}
    results["pytorch"] = _guard(lambda: _torch_fp16(recipe, reference_in))
    if fold_dir is not None:
        results["mindspore"] = _guard(lambda: _mindspore_fp16(fold_dir, reference_in, list(reference_out[0])))
    out = {}
    for engine, got in results.items():
        if isinstance(got, str):
            out[engine] = {"error": got}
            continue
        out[engine] = {"outputs": _agreement(got, emulated, reference_out)}
    return out


def _guard(fn):
    try:
        return fn()
    except Exception as err:  # a kernel without fp16 support: say which, measure the others
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"


def _torch_fp16(recipe, samples: list[dict]) -> list[dict]:
    import torch

    from torch2ms.model_loader import build_model, flatten_outputs

    model = build_model(recipe).eval().half()
    with torch.no_grad():
        return [
            {
                k: v.float().numpy()
                for k, v in flatten_outputs(model(*[torch.from_numpy(a).half() for a in s.values()])).items()
            }
            for s in samples
        ]


def _mindspore_fp16(fold_dir: Path, samples: list[dict], names: list[str]) -> list[dict]:
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = msutil.build_network(Path(fold_dir), "fp16check")
    for p in net.get_parameters():
        if p.dtype == ms.float32:
            p.set_dtype(ms.float16)
    got = msutil.run_cell(net, [{k: v.astype(np.float16) for k, v in s.items()} for s in samples], names)
    dtypes = {str(v.dtype) for g in got for v in g.values()}
    if dtypes != {"float16"}:
        raise TypeError(f"the network's outputs are {sorted(dtypes)}, not float16: some kernels ran in float32")
    return [{k: v.astype(np.float32) for k, v in g.items()} for g in got]


def _agreement(true: list[dict], emulated: list[dict], reference: list[dict]) -> dict:
    t, e = emulation_metrics(true, reference), emulation_metrics(emulated, reference)
    out = {}
    for name in reference[0]:
        scale = max(float(np.abs(r[name]).max()) for r in reference) or 1.0
        gap = max(float(np.abs(a[name].astype(np.float64) - b[name]).max()) for a, b in zip(emulated, true)) / scale
        out[name] = {
            "true_rel_error": t[name]["rel_error"],
            "emulated_rel_error": e[name]["rel_error"],
            "emulated_vs_true": sig(gap) if math.isfinite(gap) else "inf",
            "true_argmax_agreement": t[name]["argmax_agreement"],
            "emulated_argmax_agreement": e[name]["argmax_agreement"],
        }
    return out


def truth_markdown(truth: dict) -> list[str]:
    """precision.md's section on the emulation against true fp16 execution."""
    names = {"pytorch": "PyTorch CPU `.half()`", "mindspore": "MindSpore CPU, fp16 parameters and inputs"}
    rows = []
    for engine, r in truth.items():
        if "error" in r:
            rows.append([names[engine], "-", f"not run: {r['error']}", "", ""])
            continue
        for out, m in r["outputs"].items():
            rows.append([names[engine], out, m["true_rel_error"], m["emulated_rel_error"], m["emulated_vs_true"]])
    return [
        "## The emulation against true fp16 execution here",
        "",
        "rel error = max |x - PyTorch fp32| / max |PyTorch fp32|;",
        "emulated vs true = max |emulated - true| / max |PyTorch fp32|.",
        "",
        *table(["engine", "output", "true fp16 rel error", "emulated rel error", "emulated vs true"], rows),
    ]
