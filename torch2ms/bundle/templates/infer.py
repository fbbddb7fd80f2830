#!/usr/bin/env python3
"""Run this bundle's model on an image or a .npy tensor, exactly as manifest.json describes.

Needs numpy, Pillow (images) and either MindSpore Lite (``mindspore_lite``, used when importable:
on the board) or MindSpore (``mindspore``: loads model/network.mindir with ``nn.GraphCell``). Over 1 GB of
weights, the MindIR keeps them in model/network_variables/ beside network.mindir: keep the two together.
It does not need torch2ms or torch.

    python3 infer.py IMAGE.jpg [--out prediction]     # writes prediction.npy + prediction.json (+ prediction.png)
    python3 infer.py INPUT.npy [MASK.npy ...]         # one .npy per model input, in manifest order
    python3 infer.py --tokens "101 2023 2003 102"     # token-id models: ids padded to the sequence length
    python3 infer.py --self-check                     # samples/reference.npz vs PyTorch's outputs
    python3 infer.py photo.jpg [--conf 0.25]          # detection bundles: detections.json + detections.png

Preprocessing (manifest "preprocess"): convert to RGB, resize to the input's HxW with Pillow's
BILINEAR filter (antialiased when shrinking), float32, reverse the channels for a "bgr" model,
``x = (pixel * scale - mean) / std`` per channel, HWC -> NCHW with a batch of 1.

Integer and bool inputs (token ids, masks) take .npy files holding whole numbers of the manifest's
dtype, or ``--tokens``: the ids fill every row of the first input from position 0, padded with
``--pad-id``; the other integer or bool inputs of the same shape become the attention mask (1 at the
given tokens, 0 on the padding), except one named ``token_type_ids``: all 0 (one segment, as a
tokenizer gives for a single text).

Detection bundles (manifest "postprocess" kind "detection") letterbox instead of resizing and run
NMS on the host with ``postprocess.py`` (numpy; OpenCV's resize when ``cv2`` is importable). They
write the detections in the original image's pixels (``.json``) and the image with them drawn
(``.png``); ``--self-check`` also compares the detections on the samples with PyTorch's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _cap_onednn_isa() -> None:
    """Copy of torch2ms.runtime.cpu.configure_cpu: on AVX-512/AMX CPUs MindSpore's oneDNN convolutions
    fall back to reference code above AVX2, so the ISA is capped there. oneDNN reads ONEDNN_MAX_CPU_ISA
    once, so it must be set before mindspore is imported. A value the user set is left alone."""
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        return
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        return
    if "avx2" in flags and any(f in flags for f in ("avx512f", "amx_tile", "amx_bf16")):
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"


def load_manifest() -> dict:
    return json.loads((HERE / "manifest.json").read_text())


def preprocess(image_path: Path, manifest: dict) -> np.ndarray:
    from PIL import Image

    pre = manifest["preprocess"]
    height, width = pre["size_hw"]
    img = Image.open(image_path).convert("RGB")
    if img.size != (width, height):
        img = img.resize((width, height), Image.BILINEAR)
    x = np.asarray(img, dtype=np.float32)
    if pre["color"] == "bgr":
        x = x[:, :, ::-1]
    x = (x * np.float32(pre["scale"]) - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


class Model:
    """MindSpore Lite when importable, else MindSpore's GraphCell (CPU unless --device says)."""

    def __init__(self, path: Path, device: str):
        try:
            import mindspore_lite as mslite
        except ImportError:
            mslite = None
        if mslite is not None:
            context = mslite.Context()
            context.target = [device]
            if device == "ascend":
                context.ascend.device_id = int(os.environ.get("DEVICE_ID", "0"))
            self.lite = mslite.Model()
            self.lite.build_from_file(str(path), mslite.ModelType.MINDIR, context)
            self.runtime = f"mindspore_lite ({device})"
        else:
            _cap_onednn_isa()
            os.environ.setdefault("GLOG_v", "3")
            import mindspore as ms

            ms.set_context(mode=ms.GRAPH_MODE, device_target={"cpu": "CPU", "ascend": "Ascend", "gpu": "GPU"}[device])
            self.ms = ms
            if (path.parent / "kernels").is_dir():  # a Custom op's library: kernels/x.so, from the MindIR's folder
                os.chdir(path.parent)
            self.cell = ms.nn.GraphCell(ms.load(str(path.resolve())))
            self.lite = None
            self.runtime = f"mindspore {ms.__version__} GraphCell ({device})"

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if self.lite is not None:
            inputs = self.lite.get_inputs()
            shapes = [list(a.shape) for a in arrays]
            if [list(t.shape) for t in inputs] != shapes:  # a model serving several batch sizes (dim 0 = -1)
                self.lite.resize(inputs, shapes)
            for t, a in zip(inputs, arrays):
                t.set_data_from_numpy(np.ascontiguousarray(a))
            return [o.get_data_to_numpy() for o in self.lite.predict(inputs)]
        out = self.cell(*[self.ms.Tensor(a) for a in arrays])
        return [o.asnumpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def compare(actual: np.ndarray, expected: np.ndarray) -> dict:
    a, r = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    scale = float(np.abs(r).max(initial=0.0))
    max_abs = float(np.abs(a - r).max(initial=0.0))
    na, nr = np.linalg.norm(a), np.linalg.norm(r)
    cosine = 1.0 if na == nr == 0 else float(a @ r / (na * nr)) if na and nr else 0.0
    out = {
        "max_abs": max_abs,
        "rel_error": max_abs / scale if scale else (0.0 if max_abs == 0 else float("inf")),
        "cosine": cosine,
    }
    if expected.dtype.kind in "biu":  # token ids, masks, labels: exactly
        out["mismatched"] = int((actual.astype(np.int64) != expected.astype(np.int64)).sum())
    elif expected.ndim >= 2 and expected.shape[1] > 1:
        out["argmax_agreement"] = float((actual.argmax(axis=1) == expected.argmax(axis=1)).mean())
    return out


def self_check(model: Model, manifest: dict, rtol: float | None) -> bool:
    with np.load(HERE / "samples" / "reference.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    names = [i["name"] for i in manifest["inputs"]]
    outs = [o["name"] for o in manifest["outputs"]]
    tol = dict(manifest["tolerance"])
    if rtol is not None:
        tol["rel_error"] = rtol
    n = len(arrays[f"input.{names[0]}"])
    got = [model([arrays[f"input.{k}"][s] for k in names]) for s in range(n)]
    ok = True
    for j, name in enumerate(outs):
        a, r = np.stack([g[j] for g in got]), arrays[f"output.{name}"]
        m = compare(a.reshape(-1, *a.shape[2:]), r.reshape(-1, *r.shape[2:]))  # samples x batch -> rows
        good = m["rel_error"] <= tol["rel_error"] and m["cosine"] >= tol["cosine"] and not m.get("mismatched")
        ok &= good
        extra = f", argmax agreement {m['argmax_agreement']:.6f}" if "argmax_agreement" in m else ""
        extra += f", {m['mismatched']} elements differ (compared exactly)" if m.get("mismatched") else ""
        print(
            f"{'ok  ' if good else 'FAIL'} output {name!r}: rel error {m['rel_error']:.3g} (<= {tol['rel_error']:g}), "
            f"cosine {m['cosine']:.7f} (>= {tol['cosine']}){extra}  [{n} samples]"
        )
    if manifest["postprocess"]["kind"] == "detection":
        ok &= self_check_detections([dict(zip(outs, g)) for g in got], arrays, outs, manifest)
    return ok


def self_check_detections(got: list[dict], arrays: dict, outs: list[str], manifest: dict) -> bool:
    """The samples' detections against those of PyTorch's outputs, at the confidence the checks chose."""
    pp = _postprocess()
    params = manifest["postprocess"]["yolo"]
    total = matched = extra = 0
    problems = []
    for s, out in enumerate(got):
        ref = {k: arrays[f"output.{k}"][s] for k in outs}
        conf = pp.choose_conf(ref[params["output"]], params)[0]
        want, have = pp.detect(ref, params, conf)[0], pp.detect(out, params, conf)[0]
        pairs, missing, extras, _ = pp.match_detections(want, have, params["kind"])
        total, matched, extra = total + len(want["boxes"]), matched + len(pairs), extra + len(extras)
        problems += [
            f"sample {s}: PyTorch's box {want['boxes'][i].round(1).tolist()} not matched ({why})" for i, why in missing
        ]
        problems += [f"sample {s}: extra box {have['boxes'][j].round(1).tolist()}" for j in extras]
    # the gate the conversion passed: 1.0, or wider where float32 itself keeps other boxes than float64
    need = manifest["tolerance"].get("task_agreement", 1.0)
    agreement = matched / total if total else 1.0
    if extra and agreement == 1.0:
        agreement = matched / (total + extra)
    good = agreement >= need
    print(
        f"{'ok  ' if good else 'FAIL'} detections: {matched}/{total} of PyTorch's matched "
        f"(box IoU >= {pp.BOX_IOU}, same class), {extra} extra, agreement {agreement:.4f} (>= {need:.4g})"
        f"  [{len(got)} samples]"
    )
    for line in problems[:20]:
        print(f"     {line}")
    return good


def _postprocess():
    sys.path.insert(0, str(HERE))
    import postprocess

    return postprocess


# the 20 colours boxes are drawn in, one per class modulo 20 (Ultralytics' palette), as RGB
PALETTE = [
    tuple(bytes.fromhex(h))
    for h in (
        "FF3838 FF9D97 FF701F FFB21D CFD231 48F90A 92CC17 3DDB86 1A9334 00D4BB "
        "2C99A8 00C2FF 344593 6473FF 0018EC 8438FF 520085 CB38FF FF95C8 FF37C7"
    ).split()
]


def detection_input(image_path: Path, manifest: dict):
    """(model input, original RGB image, letterbox geometry)."""
    from PIL import Image

    pp = _postprocess()
    pre = manifest["preprocess"]
    rgb = np.asarray(Image.open(image_path).convert("RGB"))
    boxed, geometry = pp.letterbox(rgb, tuple(pre["size_hw"]), pre["letterbox"]["pad_value"])
    x = boxed.astype(np.float32)
    if pre["color"] == "bgr":
        x = x[:, :, ::-1]
    x = x / np.float32(1 / pre["scale"])  # as Ultralytics: pixel / 255
    x = (x - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32), rgb, geometry


def detections(outputs: list[np.ndarray], manifest: dict, rgb: np.ndarray, geometry: dict, stem: Path, conf) -> dict:
    """NMS on the host, detections mapped back to the original image, written as .json and drawn as .png."""
    from PIL import Image, ImageDraw

    pp = _postprocess()
    post = manifest["postprocess"]
    params, names = post["yolo"], post["class_names"]
    conf = params["conf"] if conf is None else conf
    det = pp.detect(dict(zip([o["name"] for o in manifest["outputs"]], outputs)), params, conf)[0]
    shape = rgb.shape[:2]
    kind = params["kind"]
    boxes = pp.scale_boxes(det["boxes"], geometry, shape, xywh=kind == "obb")
    image = Image.fromarray(rgb).convert("RGB")
    if kind == "segment" and len(boxes):
        masks = pp.scale_masks(det["masks"], geometry, shape)
        tint = np.asarray(image, np.float32)
        for k, m in enumerate(masks):
            tint[m] = tint[m] * 0.5 + np.asarray(PALETTE[int(det["classes"][k]) % len(PALETTE)], np.float32) * 0.5
        image = Image.fromarray(tint.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    width = max(2, round(max(shape) / 300))
    found = []
    for k in range(len(boxes)):
        c, score = int(det["classes"][k]), float(det["scores"][k])
        color = PALETTE[c % len(PALETTE)]
        label = f"{names[c] if names else c} {score:.2f}"
        item = {"class": c, "name": names[c] if names else None, "score": round(score, 6)}
        if kind == "obb":
            item["box_xywhr"] = [
                round(float(v), 2)
                for v in pp.regularize_rboxes(np.concatenate([boxes[k : k + 1], det["boxes"][k : k + 1, 4:]], 1))[0]
            ]
            x, y = item["box_xywhr"][:2]
            draw.text((x, y), label, fill=color)
        else:
            item["box_xyxy"] = [round(float(v), 2) for v in boxes[k]]
            draw.rectangle(item["box_xyxy"], outline=color, width=width)
            draw.text((item["box_xyxy"][0] + width, item["box_xyxy"][1] + width), label, fill=color)
        if kind == "segment":
            item["mask_pixels"] = int(masks[k].sum())
        if kind == "pose":
            kpts = pp.scale_coords(det["keypoints"][k : k + 1, :, :2], geometry, shape)[0]
            vis = det["keypoints"][k, :, 2] if det["keypoints"].shape[-1] == 3 else np.ones(len(kpts))
            item["keypoints"] = [
                [round(float(a), 2), round(float(b), 2), round(float(v), 4)] for (a, b), v in zip(kpts, vis)
            ]
            for (a, b), v in zip(kpts, vis):
                if v >= 0.5:
                    draw.ellipse([a - width, b - width, a + width, b + width], fill=color)
        found.append(item)
    image.save(f"{stem}.png")
    result = {
        "model": manifest["model"]["name"],
        "version": manifest["model"]["version"],
        "image_size_hw": list(shape),
        "conf": conf,
        "iou": params["iou"],
        "detections": found,
        "png": f"{stem}.png",
    }
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def postprocess(outputs: list[np.ndarray], manifest: dict, stem: Path) -> dict:
    post = manifest["postprocess"]
    names = post.get("class_names")
    logits = outputs[0]
    np.save(f"{stem}.npy", logits)
    result = {
        "model": manifest["model"]["name"],
        "version": manifest["model"]["version"],
        "output": manifest["outputs"][0]["name"],
        "npy": f"{stem}.npy",
    }
    if post["kind"] == "classification":
        probs = softmax(logits.reshape(-1).astype(np.float64))
        top = np.argsort(-probs, kind="stable")[: post["top_k"]]
        result["top_k"] = [
            {"index": int(i), "name": names[i] if names else None, "probability": round(float(probs[i]), 6)}
            for i in top
        ]
    elif post["kind"] == "argmax":  # sequence labels, or the predicted token at every position
        result["argmax"] = logits.argmax(axis=-1).tolist()
    elif post["kind"] == "segmentation":
        from PIL import Image

        mask = logits[0].argmax(axis=0)
        dtype = np.uint8 if logits.shape[1] <= 256 else np.uint16
        Image.fromarray(mask.astype(dtype)).save(f"{stem}.png")
        counts = np.bincount(mask.ravel(), minlength=logits.shape[1])
        result["mask_png"] = f"{stem}.png"
        result["classes_present"] = [
            {"index": int(i), "name": names[i] if names else None, "pixels": int(c)} for i, c in enumerate(counts) if c
        ]
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


class InputError(Exception):
    """An input file or option that does not fit the model's inputs (exit 2)."""


def load_array(path: Path, spec: dict) -> np.ndarray:
    """One .npy input as the manifest's dtype and shape; integer and bool inputs need exact values."""
    x = np.load(path, allow_pickle=False)
    if list(x.shape) != list(spec["shape"]):
        raise InputError(f"{path} has shape {list(x.shape)}, input {spec['name']!r} takes {spec['shape']}")
    dtype = np.dtype(spec.get("dtype", "float32"))
    if dtype.kind in "biu":
        if x.dtype.kind not in "biuf" or (
            x.dtype.kind == "f" and not (np.isfinite(x).all() and (x == np.round(x)).all())
        ):
            raise InputError(f"{path} holds {x.dtype} values; input {spec['name']!r} takes whole numbers ({dtype})")
        if dtype.kind == "b" and not np.isin(x, (0, 1)).all():
            raise InputError(f"{path}: input {spec['name']!r} is a bool mask; give 0/1 values")
    return x.astype(dtype)


def token_inputs(tokens: str, pad_id: int, specs: list[dict]) -> list[np.ndarray]:
    """``--tokens``: the ids in every row of the first input, padded; the other integer/bool inputs of
    the same shape are the attention mask (1 at the tokens, 0 on the padding), ``token_type_ids`` 0."""
    first = specs[0]
    if np.dtype(first.get("dtype", "float32")).kind not in "iu" or len(first["shape"]) != 2:
        raise InputError(f"--tokens needs a (batch, sequence) integer first input; {first['name']!r} is not")
    try:
        ids = [int(t) for t in tokens.replace(",", " ").split()]
    except ValueError:
        raise InputError(f"--tokens {tokens!r}: give integer token ids separated by spaces or commas") from None
    batch, length = first["shape"]
    if not ids or len(ids) > length:
        raise InputError(f"--tokens: give 1 to {length} ids (the model's sequence length), got {len(ids)}")
    row = np.full(length, pad_id, np.int64)
    row[: len(ids)] = ids
    arrays = [np.tile(row, (batch, 1)).astype(first["dtype"])]
    for spec in specs[1:]:
        if list(spec["shape"]) != list(first["shape"]) or np.dtype(spec.get("dtype", "float32")).kind not in "biu":
            raise InputError(f"--tokens: input {spec['name']!r} is not a mask of the ids' shape; pass .npy files")
        if spec["name"] == "token_type_ids":  # segment A everywhere, as for a single text
            arrays.append(np.zeros((batch, length), spec["dtype"]))
        else:
            arrays.append(np.tile(np.arange(length) < len(ids), (batch, 1)).astype(spec["dtype"]))
    return arrays


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if not args.self_check and not args.input and args.tokens is None:
        p.error("give an INPUT file, --tokens or --self-check")
    manifest = load_manifest()
    detecting = manifest["postprocess"]["kind"] == "detection"
    out = Path(args.out or ("detections" if detecting else "prediction"))
    model_path = (HERE / args.model) if not Path(args.model).is_absolute() else Path(args.model)
    problem = _missing_model(model_path, manifest)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    model = Model(model_path, args.device or _default_device())
    print(
        f"{manifest['model']['name']} {manifest['model']['version']}: {model_path.name} on {model.runtime}",
        file=sys.stderr,
    )
    if args.self_check:
        return 0 if self_check(model, manifest, args.rtol) else 1
    try:
        if detecting and args.tokens is None and not all(Path(a).suffix == ".npy" for a in args.input):
            x, rgb, geometry = detection_input(_one_image(args.input), manifest)
            result = detections(model([x]), manifest, rgb, geometry, out, args.conf)
            print(json.dumps({**result, "detections": len(result["detections"])}, indent=2))
            return 0
        arrays = _model_inputs(args, manifest)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = postprocess(model(arrays), manifest, out)
    print(json.dumps(result, indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="*", help="an image file (jpg/png/...), or one .npy per model input")
    p.add_argument("--tokens", default=None, help='token ids for a token-id model, e.g. "101 2023 102"')
    p.add_argument("--pad-id", type=int, default=0, help="the id --tokens pads with (default 0)")
    p.add_argument("--out", default=None, help="output path stem (default: prediction, detections for detectors)")
    p.add_argument("--conf", type=float, default=None, help="detection confidence threshold (default: the manifest's)")
    p.add_argument(
        "--model",
        default="model/network.mindir",
        help="MindIR to run, relative to the bundle (default: model/network.mindir)",
    )
    p.add_argument(
        "--device", default=None, choices=["cpu", "ascend", "gpu"], help="default: ascend with MindSpore Lite, else cpu"
    )
    p.add_argument(
        "--self-check", action="store_true", help="run samples/reference.npz and compare with PyTorch's outputs"
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help=(
            "relative error allowed by --self-check (default: the manifest's; fp16 boards need more, see "
            "compatibility.md)"
        ),
    )
    return p


def _missing_model(model_path: Path, manifest: dict) -> str | None:
    """Why ``model_path`` cannot run (not there, or its weights folder was not copied), if so."""
    if not model_path.is_file():
        return f"{model_path} not found; run a targets/*/converter_lite.sh first or pass --model"
    # over 1 GB of weights the MindIR keeps them in model/network_variables/, beside the graph
    weights = [n for n in manifest["files"] if n.startswith("model/network_variables/")]
    lost = [n for n in weights if model_path == HERE / "model" / "network.mindir" and not (HERE / n).is_file()]
    if lost:
        return f"{model_path} needs its weights {', '.join(lost)}; copy the whole model/ folder"
    return None


def _default_device() -> str:
    """ascend where MindSpore Lite is installed, else cpu."""
    try:
        import mindspore_lite  # noqa: F401

        return "ascend"
    except ImportError:
        return "cpu"


def _one_image(inputs: list[str]) -> Path:
    src = Path(inputs[0]) if inputs else None
    if len(inputs) != 1 or not src.is_file():
        raise InputError(f"{inputs}: give one existing image file, or one .npy per model input")
    return src


def _model_inputs(args, manifest: dict) -> list[np.ndarray]:
    """The model's input arrays from --tokens, one .npy per input, or one image."""
    specs = manifest["inputs"]
    if args.tokens is not None:
        return token_inputs(args.tokens, args.pad_id, specs)
    if all(Path(a).suffix == ".npy" for a in args.input):
        missing = [a for a in args.input if not Path(a).is_file()]
        if missing:
            raise InputError(f"{missing[0]}: no such file")
        if len(args.input) != len(specs):
            raise InputError(
                f"the model takes {len(specs)} inputs ({', '.join(i['name'] for i in specs)}), got "
                f"{len(args.input)} .npy files"
            )
        return [load_array(Path(a), spec) for a, spec in zip(args.input, specs)]
    src = _one_image(args.input)
    if not manifest["preprocess"].get("image_input"):
        raise InputError("this model's input is not a 3-channel image; pass .npy tensors (or --tokens)")
    return [preprocess(src, manifest)]


if __name__ == "__main__":
    sys.exit(main())
