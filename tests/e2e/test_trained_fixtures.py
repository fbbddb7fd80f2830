"""Trained models on real held-out data through every stage, `package` and `verify`.

The two models of ``trained_models`` are trained once per test session (seeded, one thread, into
a tmp folder). Each recipe loads the checkpoint through ``model.checkpoint`` and takes the whole
held-out set as one batch (``inputs[].data``), so every stage's check, and its task metric, runs
on the held-out images. The recipes gate on the task (``check.task_agreement: 0.999``).

Asserted: the PyTorch accuracy the training reached; every stage's task agreement with PyTorch;
the accuracy of every stage's own artifact (ONNX in onnxruntime, the generated network in
PyNative, the compiled network in GRAPH mode, the reloaded MindIR) against the labels, within 0.1
point of PyTorch's; the bundle verified with its task line; and the gate failing a stage whose
outputs stay within a loosened tensor tolerance but change predictions.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import trained_models as tm
import yaml

from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.verify import verify_bundle
from torch2ms.pipeline.report import write_reports
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, stage_names

MIN_ACCURACY = {"digits": 0.95, "shapes": 0.95}  # held-out top-1 / pixel accuracy of the trained models
TASK = {"digits": "classification", "shapes": "segmentation"}


# trains both models (~33 s) and converts one: slow; the trained weights that packages ship (PP-OCR,
# MTCNN: tests/e2e) are make test's trained fixtures
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict[str, tm.Trained]:
    d = tmp_path_factory.mktemp("trained")
    return {"digits": tm.train_digits(d / "digits.pt"), "shapes": tm.train_shapes(d / "shapes.pt")}


def write_recipe(folder, which: str, trained: tm.Trained, **check) -> object:
    np.save(folder / "heldout.npy", trained.heldout_x)
    data = {
        "name": f"trained_{which}",
        "task": TASK[which],
        "model": {"factory": f"trained_models:{'digits_cnn' if which == 'digits' else 'shapes_unet'}"},
        "inputs": [{"name": "input", "shape": list(trained.heldout_x.shape), "data": "heldout.npy"}],
        "check": {"samples": 1, "task_agreement": 0.999, **check},
        "compile": {"graph_kernel": "off", "warmup": 1, "runs": 2},
        "output": str(folder / "runs"),
    }
    data["model"]["checkpoint"] = str(trained.checkpoint)
    if which == "shapes":
        data["class_names"] = list(tm.SHAPE_CLASSES)
    path = folder / f"{which}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_recipe(path)


# the segmentation fixture converts as the digits one does: make test-slow runs it
@pytest.fixture(scope="module", params=["digits", pytest.param("shapes", marks=pytest.mark.slow)])
def converted(request, trained, tmp_path_factory):
    which = request.param
    folder = tmp_path_factory.mktemp(which)
    result = pipeline_runner(write_recipe(folder, which, trained[which]), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    return which, trained[which], result, folder


def test_training_reaches_its_accuracy(trained):
    for which, t in trained.items():
        assert t.heldout_accuracy >= MIN_ACCURACY[which], (which, t.heldout_accuracy)
        assert t.train_accuracy >= t.heldout_accuracy - 0.05  # learnt, not memorised noise
    assert len(trained["digits"].heldout_x) == 360 and trained["shapes"].heldout_x.shape == (32, 3, 32, 32)


@pytest.mark.slow
def test_training_is_deterministic(trained, tmp_path):
    import torch

    again = tm.train_digits(tmp_path / "again.pt")
    first, second = torch.load(trained["digits"].checkpoint), torch.load(again.checkpoint)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert again.heldout_accuracy == trained["digits"].heldout_accuracy


def stage_predictions(root, x: np.ndarray) -> dict[str, np.ndarray]:
    """Class indices (argmax over axis 1) from each stage's own artifact on ``x``."""
    from torch2ms.graph.onnxrt import run_reference
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    sample = [{"input": x}]
    out = {"export": run_reference(root / "export" / "model.onnx", (), sample, ["output"])[0][0]["output"]}
    try:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        for stage in ("rebuild", "fold"):
            out[stage] = msutil.run_cell(msutil.build_network(root / stage, f"trained_{stage}"), sample, ["output"])
        msutil.set_graph_mode(ms, False, "", None)
        out["compile"] = msutil.run_cell(msutil.build_network(root / "fold", "trained_compile"), sample, ["output"])
        graph = ms.nn.GraphCell(ms.load(str(root / "mindir" / "network.mindir")))
        out["mindir"] = msutil.run_cell(graph, sample, ["output"])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
    return {k: (v[0]["output"] if isinstance(v, list) else v).argmax(1) for k, v in out.items()}


def test_every_stage_agrees_with_pytorch_and_keeps_the_accuracy(converted):
    which, trained, result, _ = converted
    for stage in stage_names():
        task = json.loads((result.root / stage / "stage.json").read_text())["task"]
        assert task["agreement"] >= 0.999, (stage, task)
        if which == "digits":
            assert task["metric"] == "top-1 agreement" and task["figures"]["rows"] == 360
            assert task["figures"]["top5_overlap"] >= 0.999
        else:
            assert task["metric"] == "pixel agreement" and task["figures"]["pixels"] == 32 * 32 * 32
            assert task["figures"]["miou"] >= 0.99 and task["figures"]["classes_present"] == 3
    predictions = stage_predictions(result.root, trained.heldout_x)
    assert set(predictions) == set(stage_names())
    for stage, pred in predictions.items():
        accuracy = float((pred == trained.heldout_y).mean())
        assert abs(accuracy - trained.heldout_accuracy) <= 0.001, (stage, accuracy, trained.heldout_accuracy)


def test_bundle_verifies_with_its_task_metric(converted):
    which, _, result, folder = converted
    logs = []
    bundle = build_bundle(result, folder / "dist", log=lambda m: None)
    verified = verify_bundle(bundle.path, log=logs.append)
    assert verified.task["agreement"] >= 0.999 and verified.samples == 1
    metric = "top-1 agreement" if which == "digits" else "pixel agreement"
    assert any(line.startswith(f"task: {metric} ") for line in logs), logs
    assert "aipp.cfg" not in json.dumps(bundle.manifest["files"])  # a batch of held-out images is not one image


def test_the_task_gate_fails_a_stage_that_changes_predictions(trained, tmp_path, monkeypatch):
    """A wrong folded bias on the first conv, with the tensor tolerance loosened so that only the
    task gate can catch it: fold fails naming top-1 agreement; rebuild (no folding) passes."""
    from torch2ms.passes import fold_bn

    real = fold_bn.fold_bn_weights

    def biased(w, b, *stats):
        w_f, b_f = real(w, b, *stats)
        return (w_f, b_f + 0.3) if w.shape[1] == 1 else (w_f, b_f)  # the first conv: 1 input channel

    monkeypatch.setattr(fold_bn, "fold_bn_weights", biased)
    recipe = write_recipe(tmp_path, "digits", trained["digits"], rel_error=1.0, cosine=0.5)
    result = pipeline_runner(recipe, log=lambda m: None).run(until="fold")
    status = {s.stage: s for s in result.stages}
    assert status["rebuild"].status == "passed" and status["fold"].status == "failed", status
    record = json.loads((result.root / "fold" / "stage.json").read_text())
    assert record["violations"] == [f"top-1 agreement {record['task']['agreement']:.4f} < 0.999"]
    assert record["task"]["figures"]["flips"] >= 1 and record["task"]["notes"]
    write_reports(result)
    report = (result.root / "report.md").read_text()
    assert "| fold | failed |" in report and f"- fold: {record['task']['notes'][0]}" in report
    assert "a stage fails below 0.999 (check.task_agreement)" in report
