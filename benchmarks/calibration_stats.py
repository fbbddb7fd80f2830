"""Are the BatchNorm statistics of a cheaper calibration the same as those of the 16-image one?

``model.init: calibrated`` measures every BatchNorm's running mean and variance on seeded noise
images (``torch2ms.model_loader.calibrate_norm``). It used 16 images at any input size; at
DeepLabV3+'s 512x512 that was ~20 s and ~2.4 GB of the export stage. It now uses as many images
as keep ~16 x 224 x 224 pixels per channel (4 at 512x512). This script measures whether that
changes the statistics by more than drawing other noise images does:

- two independent noise streams A and B (the generator calibrate_norm uses, and another seed);
- for each, the statistics after the first ``CALIBRATION_BATCH`` images (the cheap calibration:
  for stream A exactly what calibrate_norm now computes) and after 16 (the former one); the
  cumulative average (``momentum=None``) makes both snapshots of one run;
- per layer: the mean shift in standard deviations, |mean - mean'| / sqrt(var'), and the variance
  ratio |log(var / var')|; summarised over layers (median, 90th percentile, max);
- the resulting network on one fixed input: its largest activation and its output's relative
  difference (max |a - b| / max |b|) from the 16-image network of the other stream.

Equivalent means: 4 images of A differ from 16 of B about as much as 16 of A differ from 16 of B
(the sampling noise of the calibration itself, which the checks never depended on).

    python benchmarks/calibration_stats.py recipes/deeplabv3plus.yaml --md benchmarks/results/calibration_stats.md
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch

from torch2ms.export.hooks import activation_range
from torch2ms.model_loader import (
    CALIBRATION_BATCH,
    CALIBRATION_IMAGES,
    build_model,
    calibrate_norm,
    calibration_passes,
    measure_norm_stats,
)
from torch2ms.recipe import load_recipe


def norms_of(model) -> list:
    return [
        m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


def snapshot(model) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(m.running_mean.double().numpy().copy(), m.running_var.double().numpy().copy()) for m in norms_of(model)]


def distance(a, b) -> dict:
    """Per layer, over channels: max mean shift in b's standard deviations, max |log variance ratio|."""
    shift = [float(np.max(np.abs(ma - mb) / np.sqrt(vb))) for (ma, _), (mb, vb) in zip(a, b)]
    ratio = [float(np.max(np.abs(np.log(va / vb)))) for (_, va), (_, vb) in zip(a, b)]

    def summary(x):
        return {"median": float(np.median(x)), "p90": float(np.percentile(x, 90)), "max": float(np.max(x))}

    return {"mean_shift_sd": summary(shift), "log_var_ratio": summary(ratio)}


def with_stats(model, stats):
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m, (mean, var) in zip(norms_of(out), stats):
            m.running_mean.copy_(torch.from_numpy(mean).float())
            m.running_var.copy_(torch.from_numpy(var).float())
    return out.eval()


def outputs(model, x) -> tuple[np.ndarray, float]:
    with torch.no_grad(), activation_range(model) as reached:
        y = model(x)
    y = y if isinstance(y, torch.Tensor) else next(iter(y.values() if isinstance(y, dict) else y))
    return y.double().numpy(), reached["max_abs_activation"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    recipe = load_recipe(args.recipe)
    shapes = [tuple(i.shape) for i in recipe.inputs]
    seed = recipe.model.seed
    cheap_passes = calibration_passes(shapes)
    full_passes = CALIBRATION_IMAGES // CALIBRATION_BATCH
    base = build_model(recipe.model_copy(update={"model": recipe.model.model_copy(update={"init": "as_is"})}))
    calibrate_norm(base, shapes, seed, passes=0)  # the seeded gamma/beta, statistics reset
    stats = {}
    for stream, gen_seed in (("A", seed + 1), ("B", seed + 1000)):
        model = copy.deepcopy(base)
        g = torch.Generator().manual_seed(gen_seed)
        if stream == "A":  # calibrate_norm's own stream: gamma/beta were drawn from it first
            g = torch.Generator().manual_seed(seed + 1)
            for m in norms_of(model):
                if m.affine:
                    torch.rand(m.num_features, generator=g), torch.rand(m.num_features, generator=g)
        measure_norm_stats(model, norms_of(model), shapes, cheap_passes, g)
        stats[f"{stream}{cheap_passes * CALIBRATION_BATCH}"] = snapshot(model)
        measure_norm_stats(model, norms_of(model), shapes, full_passes - cheap_passes, g)
        stats[f"{stream}{CALIBRATION_IMAGES}"] = snapshot(model)
    cheap, full = f"A{cheap_passes * CALIBRATION_BATCH}", f"A{CALIBRATION_IMAGES}"
    other = f"B{CALIBRATION_IMAGES}"
    # calibrate_norm itself gives stream A's cheap statistics (same generator, same draws)
    check = copy.deepcopy(base)
    calibrate_norm(check, shapes, seed)
    same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(snapshot(check), stats[cheap]))
    x = torch.from_numpy(np.random.default_rng(recipe.check.seed).standard_normal(shapes[0]).astype(np.float32))
    ref_out, _ = outputs(with_stats(base, stats[other]), x)
    rows = []
    for name in (cheap, full, f"B{cheap_passes * CALIBRATION_BATCH}"):
        out, reached = outputs(with_stats(base, stats[name]), x)
        rows.append(
            {
                "calibration": name,
                "vs": other,
                **distance(stats[name], stats[other]),
                "max_abs_activation": reached,
                "output_rel_diff": float(np.max(np.abs(out - ref_out)) / np.max(np.abs(ref_out))),
            }
        )
    _, reached_other = outputs(with_stats(base, stats[other]), x)
    lines = [
        f"{args.recipe.name}, inputs {shapes}: BatchNorm statistics of {cheap_passes * CALIBRATION_BATCH} vs"
        f" {CALIBRATION_IMAGES} noise images, each against an independent draw of {CALIBRATION_IMAGES} ({other},"
        f" largest activation {reached_other:.3g}). calibrate_norm's default equals {cheap}: {same}.",
        "",
        "| calibration | vs | mean shift / sd: median, p90, max | abs log var ratio: median, p90, max"
        " | largest activation | output rel. diff |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, v = r["mean_shift_sd"], r["log_var_ratio"]
        lines.append(
            f"| {r['calibration']} | {r['vs']} | {s['median']:.3f}, {s['p90']:.3f}, {s['max']:.3f}"
            f" | {v['median']:.3f}, {v['p90']:.3f}, {v['max']:.3f} | {r['max_abs_activation']:.3g}"
            f" | {r['output_rel_diff']:.3g} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    print(json.dumps(rows, indent=1))
    if args.md:
        args.md.write_text(md)


if __name__ == "__main__":
    main()
