"""INT8 plan figures for docs/packaging.md: per model, all-INT8 against the plan (layers kept in
float, share of the Cube ops' MACs in INT8, task agreement with PyTorch, rel error), the plan time,
and for the trained fixtures their task metric against the labels (top-1 on held-out digits, mIoU
on held-out shape scenes): fp32 -> all INT8 -> INT8 with the plan.

    python benchmarks/int8_plan.py --trained recipes/resnet50.yaml recipes/yolov8n.yaml \\
        --deeplab 256 --runs /tmp/int8/runs --md benchmarks/results/int8_plan.md

``--trained`` trains the two fixtures of ``tests/trained_models.py`` (seeded, seconds) and checks
them on their whole held-out set as one batch; they calibrate on their training data (digits: 1080
training images as 3 batches of 360; shapes: 96 generated training scenes as 3 batches of 32).
The photo models check on 4 scikit-image photos (astronaut, coffee, chelsea, rocket) and calibrate
on the 16 others scikit-image ships; ResNet-50 and DeepLabV3+ have calibrated random weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from fp16_plan import trained_recipe

from torch2ms.bundle import int8
from torch2ms.bundle.emulate_int8 import Int8Emulator
from torch2ms.pipeline.runner import raise_for
from torch2ms.pipeline.workspace import load_npz, split_reference
from torch2ms.recipe import load_recipe, read_yaml
from torch2ms.stages import pipeline_runner, writer_of

TESTS = Path(__file__).resolve().parent.parent / "tests"
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
CHECK_PHOTOS = ["skimage:astronaut", "skimage:coffee", "skimage:chelsea", "skimage:rocket"]
CALIBRATION_PHOTOS = [
    f"skimage:{n}"
    for n in (
        "motorcycle_left",
        "motorcycle_right",
        "hubble_deep_field",
        "retina",
        "ihc",
        "color",
        "logo",
        "brick",
        "camera",
        "cell",
        "coins",
        "grass",
        "gravel",
        "horse",
        "moon",
        "page",
    )
]


def trained_recipes(folder: Path) -> list[tuple[Path, dict]]:
    sys.path.insert(0, str(TESTS))
    import trained_models as tm

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    digits, shapes = tm.train_digits(folder / "digits.pt"), tm.train_shapes(folder / "shapes.pt")
    x_train = tm.digits_data()[0]
    np.save(folder / "digits_calib.npy", x_train[:1080])
    np.save(folder / "shapes_calib.npy", tm.shapes_data(96, seed=7)[0])
    for which, t, factory, task in (
        ("digits", digits, "digits_cnn", "classification"),
        ("shapes", shapes, "shapes_unet", "segmentation"),
    ):
        print(f"{which}: held-out accuracy {t.heldout_accuracy:.4f}", flush=True)
        quantize = {"calibration": f"{which}_calib.npy", "samples": 3}
        path = trained_recipe(folder, which, t, factory, task, quantize=quantize)
        out.append((path, {"labels": t.heldout_y, "task": task}))
    return out


def photo_recipe(source: Path, folder: Path, size: int | None, method: str = "minmax") -> Path:
    """The recipe checked on 4 photos and calibrated on 16 others (at ``size`` x ``size`` if given)."""
    data = read_yaml(source)
    spec = data["inputs"][0]
    if size:
        spec["shape"] = [1, 3, size, size]
        data["name"] = f"{data['name']}_{size}"
        if "preprocess" in data and data["preprocess"].get("resize"):
            data["preprocess"]["resize"] = [size, size]
    spec["data"] = CHECK_PHOTOS
    data.setdefault("check", {})["samples"] = len(CHECK_PHOTOS)
    data["quantize"] = {"calibration": CALIBRATION_PHOTOS, "samples": len(CALIBRATION_PHOTOS), "method": method}
    if method != "minmax":
        data["name"] = f"{data['name']}_{method}"
    if str(data["model"].get("factory", "")).startswith("models."):
        sys.path.insert(0, str(RECIPES))
    path = folder / f"{data['name']}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def label_metric(task: str, logits: np.ndarray, labels: np.ndarray) -> float:
    pred = logits.argmax(1)
    if task == "classification":
        return float((pred == labels).mean())
    ious = []
    for c in range(logits.shape[1]):
        inter = np.sum((pred == c) & (labels == c))
        union = np.sum((pred == c) | (labels == c))
        if union:
            ious.append(inter / union)
    return float(np.mean(ious))


def measure(recipe_path: Path, runs: Path | None, labels: dict | None) -> dict:
    recipe = load_recipe(recipe_path)
    result = pipeline_runner(recipe, runs, log=lambda m: print(f"  {m}", flush=True)).run(until="export")
    raise_for(result)
    onnx_path, ref_path = (result.root / writer_of(n, recipe) / n for n in ("model.onnx", "reference.npz"))
    inputs, reference = split_reference(load_npz(ref_path))
    t0 = time.perf_counter()
    calib, _ = int8.calibration_samples(recipe)
    ranges = int8.calibrate(recipe, onnx_path, calib)
    emu = Int8Emulator(onnx_path, inputs, list(reference[0]), ranges, recipe.quantize.per_channel)
    setup = time.perf_counter() - t0
    plan = int8.make_plan(recipe, onnx_path, inputs, reference, calib, emulator=emu)
    row = {
        "name": recipe.name,
        "layers": plan["layers"],
        "kept_float": [k["label"] for k in plan["keep_float"]],
        "mac_share_int8": plan["mac_share_int8"],
        "macs": plan["macs"],
        "bound": plan["bound"],
        "task": {k: plan[k]["task"] for k in ("float", "before", "after")},
        "rel_error": {k: plan[k]["error"] for k in ("float", "before", "after")},
        "emulations": plan["emulations"],
        "search": plan["search"],
        "seconds": round(plan["seconds"] + setup, 1),
        "calibration_seconds": round(setup, 1),
        "samples": plan["samples"],
        "calibration_samples": len(calib),
        "sensitivity": plan["sensitivity"][:12],  # most sensitive first: score alone (or its block's) in INT8
    }
    if labels is not None:
        keep = {emu.labels.index(k) for k in row["kept_float"]}
        plans = {
            "float": [],
            "before": range(len(emu.names)),
            "after": [i for i in range(len(emu.names)) if i not in keep],
        }
        name = list(reference[0])[0]
        row["labels"] = {
            k: round(label_metric(labels["task"], emu.run(int8=list(v))[0][name], labels["labels"]), 4)
            for k, v in plans.items()
        }
        row["label_metric"] = "held-out top-1" if labels["task"] == "classification" else "held-out mIoU"
    print(json.dumps(row, indent=1, default=str), flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | Cube layers | all INT8: task | with the plan: kept float | MACs in INT8 | task "
        "| rel error all INT8 -> plan | label metric fp32 -> all INT8 -> plan | plan time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["task"]
        task = lambda m: f"{m['agreement']:.4f}" if m else "-"  # noqa: E731
        metric = t["after"]["metric"] if t["after"] else "-"
        labels = (
            f"{r['label_metric']}: " + " -> ".join(f"{r['labels'][k]:.4f}" for k in ("float", "before", "after"))
            if "labels" in r
            else "-"
        )
        lines.append(
            f"| {r['name']} | {r['layers']} | {task(t['before'])} | {len(r['kept_float'])} | {r['mac_share_int8']:.1%} "
            f"| {task(t['after'])} ({metric}) | {r['rel_error']['before']} -> {r['rel_error']['after']} | {labels} "
            f"| {r['seconds']} s ({r['emulations']} emulations) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipes", nargs="*", type=Path)
    ap.add_argument("--trained", action="store_true")
    ap.add_argument("--deeplab", type=int, default=0, help="also DeepLabV3+ at this input size (0: not)")
    ap.add_argument("--runs", type=Path, default=None)
    ap.add_argument("--method", default="minmax", help="quantize.method for the photo models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/int8_bench"))
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args()
    todo: list[tuple[Path, dict | None]] = []
    if args.trained:
        todo += trained_recipes(args.work / "trained")
    for r in args.recipes:
        todo.append((photo_recipe(r, args.work / "photos", None, args.method), None))
    if args.deeplab:
        todo.append(
            (photo_recipe(RECIPES / "deeplabv3plus.yaml", args.work / "photos", args.deeplab, args.method), None)
        )
    rows = [measure(path, args.runs, labels) for path, labels in todo]
    if args.md:
        args.md.write_text(markdown(rows))
        args.md.with_suffix(".json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
