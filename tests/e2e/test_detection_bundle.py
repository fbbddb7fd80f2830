"""YOLO end to end: recipe -> every stage checked on detections -> bundle -> verify -> the bundle's infer.py,
run alone (torch and torch2ms blocked), on a photo: the same boxes as Ultralytics' own postprocess on
PyTorch's raw output. yolov8n at 256x256 in the default run; the shipped 640x640 recipes are `slow`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, run_bundle_infer, run_cli, unpack_bundle

from torch2ms.postprocess import yolo
from torch2ms.recipe import load_recipe

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(REPO / "recipes"))  # the recipes' model factories (recipes/models/)
STAGES = ("export", "rebuild", "fold", "compile", "mindir")


def _small_recipe(d: Path, size: int) -> Path:
    data = yaml.safe_load((REPO / "recipes" / "yolov8n.yaml").read_text())
    data["name"] = f"yolov8n{size}"
    data["model"]["kwargs"]["imgsz"] = size
    data["inputs"][0].update(shape=[1, 3, size, size], data=["skimage:astronaut"])
    data["check"]["samples"] = 1
    data["compile"].update(warmup=1, runs=2)
    path = d / "yolo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# the YOLO conversion and its bundle (~55 s): slow; detection's task check and post-processing on
# real outputs stay in make test (tests/tasks/test_detection_task.py, tests/postprocess)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("yolo")
    recipe = _small_recipe(d, 256)
    argv = ["package", "--recipe", str(recipe), "--runs", str(d / "runs"), "--out", str(d / "dist")]
    assert run_cli(*argv) == 0
    (archive,) = (d / "dist").glob("yolov8n256-*.tar.gz")
    return recipe, archive, d / "runs" / "yolov8n256"


def _check_stages(run: Path, kinds=("box_iou",)):
    for stage in STAGES:
        rec = json.loads((run / stage / "stage.json").read_text())
        task = rec["task"]
        assert rec["status"] == "passed" and task["metric"] == "detection agreement"
        assert task["agreement"] == 1.0 and not task["notes"], (stage, task["notes"])
        for s in task["figures"]["per_sample"]:
            assert 10 <= s["pytorch"] <= 300 and s["matched"] == s["pytorch"] == s["stage"]
        assert all(task["figures"][f"worst_{k}"] is not None for k in kinds)
    return rec


def test_every_stage_agrees_on_detections(bundle):
    _, _, run = bundle
    _check_stages(run)


def test_bundle_holds_the_postprocess_and_verify_reports_detections(bundle, capsys):
    _, archive, _ = bundle
    import tarfile

    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        read = lambda n: tar.extractfile(n).read()  # noqa: E731
        manifest = json.loads(read("manifest.json"))
        assert read("postprocess.py") == Path(yolo.__file__).read_bytes()
        atc = read("targets/atlas-200i-dk-a2/atc.sh").decode()
        lite = read("targets/atlas-200i-dk-a2/converter_lite.sh").decode()
        lite_cfg = read("targets/atlas-200i-dk-a2/converter_lite.cfg").decode()
        compat = read("compatibility.md").decode()
    assert {"postprocess.py", "infer.py", "samples/reference.npz"} <= names
    post = manifest["postprocess"]
    assert post["kind"] == "detection" and post["output"] == "output" and len(post["class_names"]) == 80
    assert post["yolo"] | {"conf": 0.25, "iou": 0.7, "max_det": 300, "nc": 80, "kind": "detect"} == post["yolo"]
    assert len(post["check_conf"]) == 1 and manifest["preprocess"]["letterbox"]["pad_value"] == 114
    # converter_lite's --outputDataType is for quantized outputs only; Ascend takes [ascend_context] output_type
    assert "--output_type=FP32" in atc and "outputDataType" not in lite and "\noutput_type=FP32\n" in lite_cfg
    assert "## Where NMS runs" in compat and "crashes ATC" in compat
    assert run_cli("verify", str(archive)) == 0
    out = capsys.readouterr().out
    assert "detection agreement 1.0000" in out and "extra" in out


def test_infer_self_check_compares_detections(bundle, tmp_path):
    _, archive, _ = bundle
    root = unpack_bundle(archive, tmp_path / "b")
    res = run_bundle_infer(root, "--self-check")
    assert res.returncode == 0, res.stderr[-2000:] + res.stdout
    assert "ok   detections:" in res.stdout and " 0 extra" in res.stdout


def _photo(name: str) -> Path:
    import skimage

    return next(p for p in Path(skimage.data.__file__).parent.iterdir() if p.stem == name)


def test_infer_on_a_photo_gives_ultralytics_boxes(bundle, tmp_path):
    """The photo the checks never saw; Ultralytics' LetterBox, model, non_max_suppression and scale_boxes on
    the PyTorch side, the bundle's infer.py (MindSpore, numpy postprocess) on the other."""
    import torch
    from PIL import Image
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils import nms, ops

    from torch2ms.model_loader import build_model

    recipe_path, archive, _ = bundle
    recipe = load_recipe(recipe_path)
    photo = _photo("chelsea")
    rgb = np.asarray(Image.open(photo).convert("RGB"))
    boxed = LetterBox((256, 256), auto=False)(image=rgb.copy())
    x = torch.from_numpy(boxed.copy()).permute(2, 0, 1)[None].float() / 255
    with torch.no_grad():
        raw = build_model(recipe)(x)
    params = {**recipe.postprocess.model_dump(), "input_hw": [256, 256]}
    conf = yolo.choose_conf(raw.numpy(), params)[0]  # random weights: a conf with 10..300 boxes and a clear gap
    want = nms.non_max_suppression(raw, conf, 0.7, max_det=300)[0]
    want[:, :4] = ops.scale_boxes((256, 256), want[:, :4], rgb.shape)
    want = want.numpy()

    root = unpack_bundle(archive, tmp_path / "b")
    res = run_bundle_infer(root, str(photo), "--conf", repr(conf), "--out", str(tmp_path / "det"))
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads((tmp_path / "det.json").read_text())
    dets = got["detections"]
    assert got["image_size_hw"] == list(rgb.shape[:2]) and 10 <= len(dets) == len(want)
    assert [d["class"] for d in dets] == want[:, 5].astype(int).tolist()
    np.testing.assert_allclose([d["box_xyxy"] for d in dets], want[:, :4], atol=0.02)  # json keeps 2 decimals
    np.testing.assert_allclose([d["score"] for d in dets], want[:, 4], atol=1e-5)
    assert dets[0]["name"] == recipe.postprocess.class_names[dets[0]["class"]]
    assert Image.open(tmp_path / "det.png").size == (rgb.shape[1], rgb.shape[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolov8n", "yolov8n-seg", "yolov8n-pose"])
def test_shipped_recipe_converts_packages_and_verifies(name, tmp_path, capsys):
    recipe = REPO / "recipes" / f"{name}.yaml"
    argv = ["package", "--recipe", str(recipe), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "dist")]
    assert run_cli(*argv) == 0
    kinds = {"yolov8n": ("box_iou",), "yolov8n-seg": ("box_iou", "mask_iou"), "yolov8n-pose": ("keypoint_px",)}
    _check_stages(tmp_path / "runs" / name, kinds[name])
    (archive,) = (tmp_path / "dist").glob(f"{name}-*.tar.gz")
    assert run_cli("verify", str(archive)) == 0
    assert "detection agreement 1.0000" in capsys.readouterr().out
