"""Task metrics (torch2ms/tasks/classification.py, segmentation.py) on constructed outputs whose
answer follows from the construction, mIoU against scikit-learn's Jaccard score as an independent
oracle, and both tasks recorded by a real run of the tiny models in every stage.json."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import write_recipe

from torch2ms.pipeline.report import write_reports
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, stage_names
from torch2ms.tasks import TASKS, gate, task_for

RECIPE = SimpleNamespace(task="classification", class_names=None, check=SimpleNamespace(task_agreement=None))


def measure(task: str, outputs, reference, class_names=None):
    recipe = SimpleNamespace(task=task, class_names=class_names, check=SimpleNamespace(task_agreement=None))
    return task_for(recipe).measure(recipe, outputs, reference)


def samples(array: np.ndarray, name: str = "output") -> list[dict[str, np.ndarray]]:
    """One sample per leading index, like the runner's per-sample outputs."""
    return [{name: a} for a in array]


# --- classification ---


def test_identical_scores_agree_fully():
    ref = np.random.default_rng(0).standard_normal((3, 4, 10))  # 3 samples of batch 4
    res = measure("classification", samples(ref.copy()), samples(ref))
    assert res.metric == "top-1 agreement" and res.agreement == 1.0
    assert res.figures["rows"] == 12 and res.figures["top5_overlap"] == 1.0 and res.figures["k"] == 5
    assert res.figures["flips"] == 0 and res.notes == []


def test_swapping_the_top_two_classes_flips_exactly_those_rows():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((8, 1, 20))
    got = ref.copy()
    for s in (2, 5):
        first, second = np.argsort(-ref[s, 0])[:2]
        got[s, 0, [first, second]] = got[s, 0, [second, first]]
    res = measure("classification", samples(got), samples(ref))
    assert res.agreement == 6 / 8
    assert res.figures["top5_overlap"] == 1.0  # the same five classes, in another order
    assert res.figures["flips"] == 2 and len(res.notes) == 2
    assert res.notes[0].startswith(f"row 2: PyTorch class {np.argmax(ref[2, 0])} ")


def test_top5_overlap_counts_shared_classes():
    ref = np.arange(10.0)[None, None]  # top-5: classes 9 8 7 6 5
    got = np.array([[[15, 14, 2, 3, 4, 0, 1, 20, 21, 22]]], float)  # top-5: classes 9 8 7 0 1
    res = measure("classification", samples(got), samples(ref))
    assert res.figures["top5_overlap"] == 3 / 5 and res.agreement == 1.0


def test_fewer_than_five_classes_uses_k_classes():
    ref = np.random.default_rng(2).standard_normal((4, 1, 3))
    res = measure("classification", samples(-ref), samples(ref))
    assert res.figures["k"] == 3 and res.figures["top5_overlap"] == 1.0  # all three classes, reversed
    assert res.agreement == 0.0


def test_flip_notes_give_pytorch_margin():
    ref = np.array([[[5.0, 1.0, 0.0]], [[0.0, 3.0, 2.9]]])
    got = ref.copy()
    got[1, 0, 2] = 3.1  # a near tie flips
    res = measure("classification", samples(got), samples(ref))
    assert res.agreement == 0.5 and res.figures["flips"] == 1
    assert res.notes == ["row 1: PyTorch class 1 (margin 0.1), stage class 2"]


def test_more_than_ten_flips_are_summarised():
    ref = np.tile(np.arange(4.0), (15, 1, 1))
    res = measure("classification", samples(-ref), samples(ref))
    assert res.figures["flips"] == 15 and len(res.notes) == 11 and res.notes[-1] == "... and 5 more"


# --- segmentation ---


def one_hot_scores(maps: np.ndarray, classes: int) -> np.ndarray:
    """Class maps (S x H x W) -> scores (S x 1 x classes x H x W) whose argmax is the map."""
    return np.eye(classes)[maps].transpose(0, 3, 1, 2)[:, None]


def test_segmentation_agreement_and_miou_by_hand():
    truth = np.zeros((1, 8, 8), int)
    truth[:, :, 4:] = 1  # left half 0, right half 1
    pred = np.zeros_like(truth)
    pred[:, :, 5:] = 1  # the boundary one column to the right
    res = measure("segmentation", samples(one_hot_scores(pred, 3)), samples(one_hot_scores(truth, 3)))
    assert res.metric == "pixel agreement" and res.agreement == 56 / 64
    iou0, iou1 = 32 / 40, 24 / 32  # class 2 is in neither map: not averaged
    assert res.figures["miou"] == pytest.approx((iou0 + iou1) / 2)
    assert res.figures["classes_present"] == 2 and res.figures["pixels_changed"] == 8
    assert res.notes == [
        f"class 1: IoU {iou1:.4f}",
        f"class 0: IoU {iou0:.4f}",
        "largest PyTorch top-1/top-2 margin on a changed pixel: 1",
    ]


def test_segmentation_miou_matches_sklearn_jaccard():
    from sklearn.metrics import jaccard_score

    rng = np.random.default_rng(3)
    ref = rng.standard_normal((3, 2, 5, 16, 16))
    got = ref + rng.normal(0, 0.3, ref.shape)
    res = measure("segmentation", samples(got), samples(ref), class_names=("bg", "road", "car", "person", "sky"))
    t, p = ref.argmax(2).ravel(), got.argmax(2).ravel()
    assert res.agreement == pytest.approx((t == p).mean())
    assert res.figures["miou"] == pytest.approx(jaccard_score(t, p, average="macro"))
    assert res.figures["pixels"] == 3 * 2 * 16 * 16
    assert any("(car)" in n for n in res.notes)
    changed = t != p
    margin = np.sort(ref, axis=2)
    margin = (margin[:, :, -1] - margin[:, :, -2]).ravel()
    assert res.notes[-1] == f"largest PyTorch top-1/top-2 margin on a changed pixel: {margin[changed].max():.3g}"


def test_segmentation_picks_the_first_class_map_output():
    ref = np.random.default_rng(4).standard_normal((2, 1, 4, 6, 6))
    outputs = [{"logits_flat": r[0, 0], "out": r} for r in ref]
    res = measure("segmentation", outputs, outputs)
    assert res.figures["output"] == "out" and res.agreement == 1.0 and res.figures["miou"] == 1.0


def test_no_class_output_gives_no_result():
    flat = [{"output": np.zeros((1, 7))}]
    assert measure("segmentation", flat, flat) is None
    assert measure("classification", [{"output": np.zeros((1, 1))}], [{"output": np.zeros((1, 1))}]) is None


def test_registry_and_default_gates():
    task_for(RECIPE)
    assert {"classification", "segmentation"} <= set(TASKS)
    for name in ("classification", "segmentation"):
        t = TASKS[name]
        assert t.default_gate == 0.0
        assert gate(SimpleNamespace(check=SimpleNamespace(task_agreement=None)), t) == 0.0
        assert gate(SimpleNamespace(check=SimpleNamespace(task_agreement=0.999)), t) == 0.999


# --- recorded by the runner ---


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "name": "tinyseg",
            "task": "segmentation",
            "model": {"factory": "tiny_models:tiny_seg", "kwargs": {"classes": 3}, "seed": 0},
        },
    ],
    ids=["classification", "segmentation"],
)
def test_every_stage_records_its_task_metrics(tmp_path, overrides):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", check={"samples": 2, "task_agreement": 0.999}, **overrides))
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.reason) for s in result.stages]
    for stage in stage_names():
        record = json.loads((result.root / stage / "stage.json").read_text())
        task = record["task"]
        assert task["agreement"] == 1.0, (stage, task)
        if recipe.task == "classification":
            assert task["metric"] == "top-1 agreement" and task["figures"]["rows"] == 2
        else:
            assert task["metric"] == "pixel agreement" and task["figures"]["miou"] == 1.0
            assert task["figures"]["output"] == "out" and task["figures"]["pixels"] == 2 * 32 * 32
    write_reports(result)
    report = (result.root / "report.md").read_text()
    cell = (
        "top-1 agreement 1.0000, top-5 overlap 1.0000"
        if recipe.task == "classification"
        else "pixel agreement 1.0000, mIoU 1.0000"
    )
    assert report.count(f" | {cell} | ") == 5 and "| task | notes |" in report
    assert f"Task ({recipe.task}): each stage's outputs vs PyTorch's; a stage fails below 0.999" in report
