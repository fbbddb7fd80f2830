"""Detection bundles: what a ``task: detection`` recipe adds to a bundle.

* ``postprocess.py``: a verbatim copy of ``torch2ms/postprocess/yolo.py`` (numpy only): letterbox,
  NMS, masks, keypoints, mapping back to the original image, and the detection comparison that
  ``infer.py --self-check`` uses;
* ``manifest.json`` ``postprocess``: the recipe's parameters (conf, iou, max_det, agnostic, nc,
  class names, mask / keypoint layout), the head and prototype output names, and the confidence
  threshold the checks used per sample;
* ``compatibility.md``: where NMS runs and why, and what the board conversion must keep;
* ``atc.sh`` / ``converter_lite.sh``: float32 outputs, so the head reaches ``postprocess.py`` in the
  layout it was checked in (``[1, 4 + nc + extra, anchors]``, not fp16).
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.errors import RecipeError
from torch2ms.postprocess import yolo

POSTPROCESS_FILE = "postprocess.py"


def manifest_postprocess(recipe, outputs: list[dict], records: dict[str, dict]) -> dict:
    """The manifest's ``postprocess`` for a detection recipe; checks the outputs against the recipe."""
    spec = recipe.postprocess
    by_name = {o["name"]: o for o in outputs}
    head_name = spec.output or outputs[0]["name"]
    if head_name not in by_name:
        raise RecipeError(f"postprocess.output: the model has no output {head_name!r} (it has {', '.join(by_name)})")
    head = by_name[head_name]["shape"]
    want = 4 + spec.nc + spec.extra
    if len(head) != 3 or head[1] != want:
        raise RecipeError(
            f"postprocess: output {head_name!r} has shape {head}, expected [batch, 4 + nc + extra = {want}, anchors] "
            f"for a YOLO {spec.kind} head with nc={spec.nc}",
            hint="check postprocess.nc, kind, masks / keypoints, and postprocess.output",
        )
    params = spec.model_dump(mode="json")
    params["output"] = head_name
    params["input_hw"] = list(recipe.inputs[0].shape[-2:])
    if spec.kind == "segment":
        masks = dict(params["masks"] or {"coefficients": 32, "prototypes": None})
        others = [o["name"] for o in outputs if o["name"] != head_name]
        masks["prototypes"] = masks["prototypes"] or (others[0] if others else None)
        protos = by_name.get(masks["prototypes"], {}).get("shape")
        if protos is None or len(protos) != 4 or protos[1] != masks["coefficients"]:
            raise RecipeError(
                f"postprocess.masks: prototypes output {masks['prototypes']!r} has shape {protos}, expected "
                f"[batch, {masks['coefficients']}, H/4, W/4]"
            )
        params["masks"] = masks
    if spec.kind == "pose":
        params["keypoints"] = params["keypoints"] or {"shape": [17, 3]}
    task = (records.get("mindir") or {}).get("task") or {}
    check_conf = [p["conf"] for p in task.get("figures", {}).get("per_sample", [])]
    return {
        "kind": "detection",
        "output": head_name,
        "op": "host NMS in postprocess.py (numpy, as Ultralytics' non_max_suppression), then boxes mapped back "
        "through the letterbox",
        "class_names": params.pop("class_names"),
        "yolo": params,
        "check_conf": check_conf,
    }


def preprocess(recipe) -> dict:
    """Manifest ``preprocess`` entries that differ for a letterboxed YOLO input."""
    return {
        "resize": "letterbox (postprocess.letterbox): Ultralytics LetterBox(auto=False): scale min(H/h, W/w), "
        "each side max(round(side * r), 1), OpenCV INTER_LINEAR resize, grey padding split round(d/2 - 0.1) "
        "before and round(d/2 + 0.1) after",
        "letterbox": {"pad_value": yolo.PAD_VALUE, "auto": False, "center": True, "scaleup": True},
    }


def bundle_files() -> dict[str, bytes]:
    return {POSTPROCESS_FILE: Path(yolo.__file__).read_bytes()}


def readme_texts(manifest: dict) -> tuple[str, str]:
    post, pre = manifest["postprocess"], manifest["preprocess"]
    y = post["yolo"]
    h, w = pre["size_hw"]
    pre_text = (
        f"Input `{manifest['inputs'][0]['name']}`: one RGB image letterboxed to {w}x{h} exactly like Ultralytics' "
        f"`LetterBox(auto=False)` (aspect kept, grey {yolo.PAD_VALUE} padding; `postprocess.letterbox`, with OpenCV's "
        f"resize when `cv2` is installed, else a numpy copy of it) -> float32 -> `pixel * {pre['scale']:.6g}` -> NCHW."
    )
    extra = {
        "segment": f", then instance masks from the prototypes output `{(y['masks'] or {}).get('prototypes')}`",
        "pose": f", then {y['keypoints']['shape'][0]} keypoints per person" if y.get("keypoints") else "",
        "obb": ", rotated boxes (probiou NMS)",
    }.get(y["kind"], "")
    post_text = (
        f"Output `{post['output']}`: the raw YOLO head (boxes xywh, {y['nc']} class probabilities{extra}). NMS runs on "
        f"the host in `postprocess.py` (numpy) with conf {y['conf']}, iou {y['iou']}, max_det {y['max_det']}"
        f"{', class-agnostic' if y['agnostic'] else ''}. `infer.py IMAGE` writes `<out>.json` (boxes in the "
        f"original image's pixels) and `<out>.png` (the image with the detections drawn)."
    )
    return pre_text, post_text


def compat_markdown(manifest: dict) -> str:
    y = manifest["postprocess"]["yolo"]
    head = next(o for o in manifest["outputs"] if o["name"] == manifest["postprocess"]["output"])
    return "\n".join(
        [
            "## Where NMS runs",
            "",
            f"The model ends at the raw YOLO head `{head['name']}` {head['shape']} (float32). Non-maximum suppression "
            "runs on the host CPU, in `postprocess.py` (numpy), not on the NPU:",
            "",
            "- torchvision's `NonMaxSuppression` (4 inputs) crashes ATC, and the ONNX op is an AI CPU kernel at best;",
            "- its output shape depends on the data, while an OM model is compiled for fixed shapes;",
            "- on the host it is exactly Ultralytics' `non_max_suppression` (tested against it and against "
            "torchvision's `nms`), and every conversion stage was checked on the boxes it returns.",
            "",
            f"Parameters (manifest.json `postprocess.yolo`): conf {y['conf']}, iou {y['iou']}, max_det {y['max_det']}, "
            f"{'class-agnostic' if y['agnostic'] else 'per class'}, kind {y['kind']}.",
            "",
            "What the board conversion must keep: the head's layout `[batch, 4 + nc + extra, anchors]` and float32 "
            "outputs. `atc.sh` passes `--output_type=FP32` and `converter_lite.sh` `--outputDataType=FLOAT32`: with "
            "fp16 outputs box coordinates up to 640 keep only ~0.25 px of precision and nearly equal scores tie.",
            "",
        ]
    )
