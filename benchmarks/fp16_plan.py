"""fp16 plan figures for the README: per model, the emulated fp16 error and task agreement with
every layer in fp16 and with the plan, the plan's size, and the emulation against true fp16
execution here (PyTorch CPU ``.half()``; the generated MindSpore network with fp16 parameters).

    python benchmarks/fp16_plan.py recipes/resnet50.yaml --trained --bounds 1e-2 2e-3 \\
        --runs /tmp/fp16/runs --md benchmarks/results/fp16_plan.md

``--trained`` adds the two trained fixtures of ``tests/trained_models.py`` (trained here, seeded,
in seconds), each checked on its whole held-out set as one batch, gated at task agreement 0.999.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from torch2ms.bundle import fp16
from torch2ms.bundle.emulate import Fp16Emulator, json_error
from torch2ms.bundle.fp16_truth import true_fp16
from torch2ms.pipeline.runner import raise_for
from torch2ms.pipeline.workspace import load_npz, split_reference
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, writer_of

TESTS = Path(__file__).resolve().parent.parent / "tests"


def trained_recipes(folder: Path) -> list[Path]:
    sys.path.insert(0, str(TESTS))
    import trained_models as tm

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for which, train, factory, task in (
        ("digits", tm.train_digits, "digits_cnn", "classification"),
        ("shapes", tm.train_shapes, "shapes_unet", "segmentation"),
    ):
        t = train(folder / f"{which}.pt")
        print(f"{which}: held-out accuracy {t.heldout_accuracy:.4f}", flush=True)
        out.append(
            trained_recipe(folder, which, t, factory, task, compile={"graph_kernel": "off", "warmup": 1, "runs": 2})
        )
    return out


def trained_recipe(folder: Path, which: str, trained, factory: str, task: str, **sections) -> Path:
    """``folder/<which>.yaml`` for a model tests/trained_models.py trained (``trained``: its result), on
    its held-out inputs (saved beside it); ``sections``: the recipe sections the benchmark adds."""
    import numpy as np

    np.save(folder / f"{which}_heldout.npy", trained.heldout_x)
    data = {
        "name": f"trained_{which}",
        "task": task,
        "model": {"factory": f"trained_models:{factory}", "checkpoint": str(trained.checkpoint)},
        "inputs": [{"name": "input", "shape": list(trained.heldout_x.shape), "data": f"{which}_heldout.npy"}],
        "check": {"samples": 1, "task_agreement": 0.999},
        **sections,
    }
    path = folder / f"{which}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def measure(recipe_path: Path, runs: Path | None, bounds: list[float], fractions: list[float]) -> dict:
    recipe = load_recipe(recipe_path)
    result = pipeline_runner(recipe, runs, log=lambda m: print(f"  {m}", flush=True)).run(until="fold")
    raise_for(result)
    onnx_path, ref_path = (result.root / writer_of(n, recipe) / n for n in ("model.onnx", "reference.npz"))
    inputs, reference = split_reference(load_npz(ref_path))
    emu = Fp16Emulator(onnx_path, inputs, list(reference[0]))
    plans = {}
    before = fp16.judge(recipe, emu.run(), reference)["error"]
    # a fraction of the all-fp16 error: a bound this network misses, so that the plan has work to do
    bounds = list(bounds) + [float(f"{f * json_error(before):.2g}") for f in fractions]
    for b in bounds:
        r = recipe.model_copy(update={"precision": recipe.precision.model_copy(update={"fp16_rel_error": b})})
        plan = fp16.make_plan(r, onnx_path, inputs, reference, emulator=emu)
        plans[str(b)] = {
            k: plan[k] for k in ("before", "after", "keep_fp32", "emulations", "layers", "bound", "search", "seconds")
        }
    truth = true_fp16(recipe, inputs, reference, emu.run(), result.root / writer_of("network.py", recipe))
    return {
        "name": recipe.name,
        "samples": len(inputs),
        "plans": plans,
        "truth": truth,
    }


def _task(m: dict) -> str:
    return f"{m['task']['agreement']:.4f}" if m["task"] else "-"


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | layers | bound | all fp16: rel error | task | kept fp32 | with plan: rel error | task |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for b, p in r["plans"].items():
            lines.append(
                f"| {r['name']} | {p['layers']} | {float(b):g} | {p['before']['error']} | {_task(p['before'])} | "
                f"{len(p['keep_fp32'])} | {p['after']['error']} | {_task(p['after'])} |"
            )
    lines += [
        "",
        "| model | engine | true fp16 rel error | emulated rel error | emulated vs true |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for engine, t in r["truth"].items():
            if "error" in t:
                lines.append(f"| {r['name']} | {engine} | not run: {t['error']} | | |")
                continue
            for m in t["outputs"].values():
                lines.append(
                    f"| {r['name']} | {engine} | {m['true_rel_error']} | {m['emulated_rel_error']} | "
                    f"{m['emulated_vs_true']} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="*", type=Path)
    ap.add_argument("--trained", action="store_true", help="add the trained fixtures (trained into --work)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/torch2ms-fp16"))
    ap.add_argument("--runs", type=Path)
    ap.add_argument("--bounds", type=float, nargs="+", default=[1e-2])
    ap.add_argument(
        "--fractions", type=float, nargs="*", default=[], help="also plan for these fractions of the all-fp16 error"
    )
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    recipes = (trained_recipes(args.work) if args.trained else []) + list(args.recipes)
    results = []
    for path in recipes:
        print(f"== {path}", flush=True)
        results.append(measure(path, args.runs, args.bounds, args.fractions))
        print(json.dumps(results[-1]["plans"], default=str)[:2000], flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = markdown(results)
    print(text)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
