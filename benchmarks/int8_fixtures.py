"""INT8 bundles of the trained fixtures on inputs where their task has something to find.

    PYTHONPATH=. python benchmarks/int8_fixtures.py [--out runs/int8_fixtures] [--only ppocr_rec,mtcnn_onet]
        [--md benchmarks/results/int8_fixtures_tasks.md]
    PYTHONPATH=. python benchmarks/int8_fixtures.py --replan ppocr_det [--int8-rel-error 10] [--runs runs]

The committed recipes' samples are whole photos: a 48x320 squeeze of skimage's page holds no text
line the recogniser reads, and R-/O-Net see whole photos, not face crops. Here each recipe is run
on the inputs its package's own pipeline feeds it, preprocessed as that package does, and the
recipe is otherwise unchanged (its calibration photos included):

* ppocr_rec: the text lines rapidocr's detector cuts from skimage's page (``resize_norm_img``);
* mtcnn_rnet / mtcnn_onet: crops of skimage's astronaut around the face facenet's ``MTCNN.detect``
  finds (the box itself, shifted by a quarter and half its side, scaled by 0.8 and 1.3) and the
  same-size crops of photos without a face (coffee, chelsea, rocket), resized as facenet does.

Each run is ``package --precision int8`` (``build_bundle``) then ``verify``; the table gives the
plan's Cube layers in INT8 and its task agreement with the reference, all-INT8 and with the plan.

``--replan R`` plans again from R's existing run (``torch2ms package`` done), with
``--int8-rel-error`` in place of the recipe's ``precision.int8_rel_error`` when given (10, its
largest value, leaves only the task gate deciding); the run's own plan file is left as it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

RECIPES = ("ppocr_rec", "mtcnn_rnet", "mtcnn_onet")


def rec_lines() -> list[np.ndarray]:
    import cv2
    import skimage.data
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    img = cv2.cvtColor(skimage.data.page(), cv2.COLOR_GRAY2BGR)
    boxes, _ = engine.text_det(img)
    crops = engine.get_crop_img_list(img, engine.sorted_boxes(boxes))
    return [engine.text_rec.resize_norm_img(c, 320 / 48)[None].astype(np.float32) for c in crops]


def face_crops(side: int) -> list[np.ndarray]:
    import skimage.data
    from facenet_pytorch import MTCNN
    from PIL import Image

    photo = skimage.data.astronaut()
    boxes, _ = MTCNN(device="cpu", keep_all=True).detect(Image.fromarray(photo))
    x0, y0, x1, y1 = boxes[0]
    w = x1 - x0
    windows = [(x0 + dx * w, y0 + dy * w, s) for dx, dy, s in [(0, 0, 1), (0.25, 0, 1), (0, 0.5, 1), (0.1, 0.1, 0.8)]]
    windows.append((x0 - 0.15 * w, y0 - 0.15 * w, 1.3))
    crops = [_crop(photo, x, y, w * s, side) for x, y, s in windows]
    for name in ("coffee", "chelsea", "rocket"):
        crops.append(_crop(getattr(skimage.data, name)(), 20, 20, w, side))
    return crops


def _crop(photo: np.ndarray, x: float, y: float, size: float, side: int) -> np.ndarray:
    from PIL import Image

    box = tuple(int(round(v)) for v in (x, y, x + size, y + size))
    img = Image.fromarray(photo).crop(box).resize((side, side), Image.BILINEAR)
    x = (np.asarray(img, np.float32) - 127.5) / 128.0  # facenet's detect_face normalisation
    return x.transpose(2, 0, 1)[None]


def run_one(name: str, out: Path) -> dict:
    from torch2ms.bundle.build import build_bundle
    from torch2ms.bundle.verify import verify_bundle
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    arrays = rec_lines() if name == "ppocr_rec" else face_crops(24 if name == "mtcnn_rnet" else 48)
    folder = (out / name).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for k, a in enumerate(arrays):
        files.append(str(folder / f"sample{k}.npy"))
        np.save(files[-1], a)
    data = yaml.safe_load((Path("recipes") / f"{name}.yaml").read_text())
    data["inputs"][0]["data"] = files
    data["check"]["samples"] = len(files)
    data["output"] = str(folder / "runs")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = pipeline_runner(load_recipe(path)).run()
    if not result.passed:
        return {"recipe": name, "error": [(s.stage, s.reason) for s in result.stages if s.status != "passed"]}
    bundle = build_bundle(result, folder / "dist", precision="int8")
    verified = verify_bundle(bundle.path)
    plan = json.loads((result.root / "precision" / "int8_plan.json").read_text())
    return {
        "recipe": name,
        "samples": len(files),
        "layers": plan["layers"],
        "int8": len(plan["layers_int8"]),
        "mac_share_int8": plan["mac_share_int8"],
        "all_int8": {"error": plan["before"]["error"], "task": plan["before"]["task"]},
        "plan": {"error": plan["after"]["error"], "task": plan["after"]["task"]},
        "verified_samples": verified.samples,
    }


def replan(name: str, runs: Path, rel_error: float | None) -> dict:
    from torch2ms.bundle import int8
    from torch2ms.pipeline.workspace import load_npz, split_reference
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import writer_of

    recipe = load_recipe(Path("recipes") / f"{name}.yaml")
    if rel_error is not None:
        gate = recipe.precision.model_copy(update={"int8_rel_error": rel_error})
        recipe = recipe.model_copy(update={"precision": gate})
    onnx_path, ref = (runs / name / writer_of(f, recipe) / f for f in ("model.onnx", "reference.npz"))
    inputs, reference = split_reference(load_npz(ref))
    calib, _ = int8.calibration_samples(recipe)
    plan = int8.make_plan(recipe, onnx_path, inputs, reference, calib)
    keys = ("error", "task")
    return {
        "recipe": name,
        "samples": len(inputs),
        "layers": plan["layers"],
        "int8": len(plan["layers_int8"]),
        "mac_share_int8": plan["mac_share_int8"],
        "all_int8": {k: plan["before"][k] for k in keys},
        "plan": {k: plan["after"][k] for k in keys},
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| recipe | samples | Cube layers in INT8 | MACs in INT8 | all INT8: rel error, task | plan: rel error, task |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['recipe']} | failed: {r['error']} | | | | |")
            continue

        def cell(m):
            t = m["task"]
            figs = {k: v for k, v in (t.get("figures") or {}).items() if k != "output"}
            return f"{m['error']}, {t['agreement']:.4f} {figs}"

        lines.append(
            f"| {r['recipe']} | {r['samples']} | {r['int8']} / {r['layers']} | {r['mac_share_int8']:.1%} | "
            f"{cell(r['all_int8'])} | {cell(r['plan'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/int8_fixtures"))
    ap.add_argument("--only", default=",".join(RECIPES))
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--replan", default=None, help="a recipe whose run exists: its INT8 plan again")
    ap.add_argument("--int8-rel-error", type=float, default=None, help="with --replan: the tensor bound")
    ap.add_argument("--runs", type=Path, default=Path("runs"))
    args = ap.parse_args()
    if args.replan:
        rows = [replan(args.replan, args.runs, args.int8_rel_error)]
    else:
        rows = [run_one(name, args.out) for name in args.only.split(",")]
    print(json.dumps(rows, indent=2))
    text = markdown(rows)
    print(text)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
