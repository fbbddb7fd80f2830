"""The detection check every stage runs (torch2ms.tasks.detection) and the recipe's postprocess section."""

from __future__ import annotations

import numpy as np
import pytest

from torch2ms.errors import RecipeError
from torch2ms.postprocess import yolo
from torch2ms.recipe import parse_recipe
from torch2ms.tasks import task_for

BASE = {
    "name": "det",
    "task": "detection",
    "model": {"factory": "tiny_models:tiny_net"},
    "inputs": [{"name": "images", "shape": [1, 3, 640, 640]}],
    "postprocess": {"format": "yolo", "nc": 3, "max_det": 50, "class_names": ["a", "b", "c"]},
}


def recipe(**post):
    return parse_recipe({**BASE, "postprocess": {**BASE["postprocess"], **post}})


def head(seed=0, nc=3, extra=0, anchors=1500):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(60, 580, (40, 2))
    xy = centres[rng.integers(0, 40, anchors)] + rng.normal(0, 8, (anchors, 2))
    wh = rng.uniform(30, 90, (anchors, 2))
    cls = rng.uniform(0, 1, (anchors, nc)) ** 8
    ext = rng.normal(0, 1, (anchors, extra))
    return np.concatenate([xy, wh, cls, ext], 1).T[None].astype(np.float32)


def measure(r, got, ref):
    return task_for(r).measure(r, [got], [ref])


def test_identical_outputs_agree_at_a_chosen_conf():
    r = recipe()
    ref = {"output": head()}
    res = measure(r, {"output": ref["output"] * np.float32(1 + 1e-7)}, ref)
    assert res.agreement == 1.0 and not res.notes
    s = res.figures["per_sample"][0]
    assert 10 <= s["pytorch"] <= 50 and s["matched"] == s["pytorch"] == s["stage"]
    # the chosen threshold lies in a gap: no kept score within it
    scores = yolo.non_max_suppression(ref["output"], conf=0, iou=0.7, max_det=10**6, nc=3)[0][:, 4]
    assert (scores > s["conf"]).sum() == s["pytorch"]
    assert np.abs(scores - s["conf"]).min() > 1e-6


def test_a_moved_box_and_a_lost_box_are_listed_with_coordinates():
    r = recipe()
    ref = {"output": head(1)}
    conf = yolo.choose_conf(ref["output"], {**r.postprocess.model_dump(), "kind": "detect"})[0]
    kept = yolo.non_max_suppression(ref["output"], conf=conf, iou=0.7, nc=3, max_det=50)[0]
    x = ref["output"][0].T
    got = ref["output"].copy()
    moved = int(np.flatnonzero(x[:, 4:].max(1) == kept[0, 4])[0])
    lost = int(np.flatnonzero(x[:, 4:].max(1) == kept[3, 4])[0])
    got[0, 0, moved] += 5  # 5 px to the right: IoU < 0.99
    got[0, 4:, lost] = 0  # below any threshold
    res = measure(r, got={"output": got}, ref=ref)
    n = res.figures["detections"]
    assert res.figures["unmatched"] == 2 and res.agreement == pytest.approx((n - 2) / n)
    text = "\n".join(res.notes)
    box = ", ".join(f"{v:.1f}" for v in kept[3, :4])
    assert f"[{box}] not matched" in text
    assert "extra" in text  # the moved box is reported where the stage has it


def test_segment_masks_and_pose_keypoints_take_part():
    r = recipe(kind="segment", masks={"coefficients": 4})
    rng = np.random.default_rng(0)
    ref = {"output0": head(2, extra=4), "output1": rng.normal(0, 1, (1, 4, 160, 160)).astype(np.float32)}
    assert measure(r, ref, ref).agreement == 1.0
    flipped = {**ref, "output1": -ref["output1"]}  # every mask inverted
    res = measure(r, flipped, ref)
    assert res.agreement == 0.0 and "mask IoU" in res.notes[0]
    r = recipe(kind="pose", nc=1, class_names=["person"], keypoints={"shape": [5, 3]})
    ref = {"output": head(3, nc=1, extra=15)}
    got = ref["output"].copy()
    got[0, 5] += 2.0  # first keypoint's x, 2 px off
    res = measure(r, {"output": got}, ref)
    assert res.agreement == 0.0 and "keypoints 2.000 px apart" in res.notes[0]
    assert res.figures["worst_keypoint_px"] == pytest.approx(2.0, abs=1e-3)


@pytest.mark.parametrize(
    "post, message",
    [
        ({"fmt": "yolo"}, "postprocess.fmt: unknown key; did you mean 'format'?"),
        ({"masks": {"coefficients": 32}}, "masks is only for kind: segment"),
        ({"class_names": ["a"]}, "class_names has 1 entries, nc is 3"),
        ({"kind": "pose", "keypoints": {"shape": [17, 4]}}, "postprocess.keypoints.shape"),
        ({"masks": {"protos": "x"}, "kind": "segment"}, "postprocess.masks.protos: unknown key"),
    ],
)
def test_postprocess_schema_errors_name_the_field(post, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace("?", r"\?")):
        recipe(**post)


def test_detection_needs_postprocess_and_takes_names_there():
    with pytest.raises(RecipeError, match="task: detection needs a postprocess section"):
        parse_recipe({k: v for k, v in BASE.items() if k != "postprocess"})
    with pytest.raises(RecipeError, match="postprocess.class_names"):
        parse_recipe({**BASE, "class_names": ["a", "b", "c"]})
    with pytest.raises(RecipeError, match="postprocess is for task: detection"):
        parse_recipe({**BASE, "task": "classification"})


def test_image_sample_data(tmp_path):
    """inputs[].data lists one entry per sample: photos are letterboxed into the tensor infer.py would feed."""
    from torch2ms.samples import sample_inputs
    from torch2ms.stages.export import ExportStage

    data = dict(BASE, inputs=[{"name": "images", "shape": [1, 3, 320, 320], "data": ["skimage:coffee"]}])
    data["preprocess"] = {"mean": [0, 0, 0], "std": [1, 1, 1]}
    r = parse_recipe(data, base_dir=tmp_path)
    first, second = sample_inputs(r)
    x = first["images"]
    rgb = yolo.letterbox(np.asarray(__import__("skimage").data.coffee()), (320, 320))[0]
    np.testing.assert_array_equal(x[0].transpose(1, 2, 0), rgb.astype(np.float32) / np.float32(255))  # as Ultralytics
    assert second["images"].std() > 0.5  # sample 1: seeded noise
    assert "preprocess" in ExportStage().config(r)  # the preprocessing makes the sample tensor
    with pytest.raises(RecipeError, match="scikit-image ships no photo 'nosuch'"):
        ExportStage().config(parse_recipe(dict(data, inputs=[{"shape": [1, 3, 8, 8], "data": "skimage:nosuch"}])))
    with pytest.raises(RecipeError, match="inputs.0.data"):
        parse_recipe(dict(data, inputs=[{"shape": [1, 3, 8, 8], "data": "a.txt"}]))


def test_zoo_summary_shows_the_task_agreement():
    from torch2ms.zoo.summary import COLUMNS, cells

    row = {"name": "yolov8n", "status": "passed", "stages": {}, "task_agreement": 1.0}
    assert cells(row)[COLUMNS.index("task agreement")] == "1.0000"  # as `verify` prints it
    assert cells({**row, "task_agreement": None})[COLUMNS.index("task agreement")] == "-"


def test_the_gate_widens_only_to_what_float32_itself_cannot_decide():
    from torch2ms.tasks import bound

    r = recipe()
    t = task_for(r)
    assert bound(r, t) == {"agreement": 1.0, "by": "recipe"}
    assert bound(r, t, 1.0, "x") == {"agreement": 1.0, "by": "recipe"}
    # yolo12n: float32 PyTorch keeps 1 of ~600 float64 boxes differently -> 10x that disagreement
    b = bound(r, t, 1 - 1 / 600, "float32 PyTorch's disagreement with float64")
    assert abs(b["agreement"] - (1 - 10 / 600)) < 1e-12 and b["by"].startswith("10x float32 PyTorch's")
    # noise_factor 0 turns it off; a recipe gate already looser than the floor's stays
    off = parse_recipe({**BASE, "check": {"noise_factor": 0}})
    assert bound(off, task_for(off), 0.99, "x")["by"] == "recipe"
    loose = parse_recipe({**BASE, "check": {"task_agreement": 0.5}})
    assert bound(loose, task_for(loose), 0.99, "x") == {"agreement": 0.5, "by": "recipe"}
    assert bound(r, t, 0.5, "x")["agreement"] == 0.0


def test_the_export_stage_measures_float32_against_float64_boxes():
    from torch2ms.export.floor import float32_task_floor

    r = recipe()
    wide = {"output": head(3).astype(np.float64)}
    same = float32_task_floor(r, [{"output": wide["output"].astype(np.float32)}], [wide])
    assert same == {"metric": "detection agreement", "agreement": 1.0}
    # float32 that loses one of float64's kept boxes (its class score falls to 0) is measured as such
    conf = yolo.choose_conf(wide["output"], {**r.postprocess.model_dump(), "kind": "detect"})[0]
    kept = yolo.non_max_suppression(wide["output"], conf=conf, iou=0.7, nc=3, max_det=50)[0]
    x = wide["output"][0].T
    lost = int(np.flatnonzero(np.isclose(x[:, 4:].max(1), kept[-1, 4]))[0])
    narrow = wide["output"].astype(np.float32)
    narrow[0, 4:, lost] = 0
    got = float32_task_floor(r, [{"output": narrow}], [wide])
    assert got["agreement"] == (len(kept) - 1) / len(kept)
    assert float32_task_floor(r, [{"output": narrow}], None) is None
