"""diff's replay where onnxruntime itself is the inaccurate side (``divergence.arbitration``).

onnxruntime's CPU Sigmoid is accurate to ~1e-7 absolute, not relative: on logits near -16 its
outputs are off by tens of percent, MindSpore's by ~1e-6. A Conv -> Add -> Sigmoid graph whose
logits all sit there (rapidocr's PP-OCRv4 detector on an image without text) must pass on the
float64 evidence with the Sigmoid named as onnxruntime's error, and a wrong Add upstream must still
be the node blamed, not the Sigmoid after it.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import write_recipe
from onnx import helper, numpy_helper

from pipeline.test_diff import inject, wrong_add
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner


@pytest.fixture(autouse=True)
def _wide(wide_console):
    """Messages are compared unwrapped (see conftest.wide_console)."""


def tiny_logits_model(path):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "shift"], ["logits"], name="/Add"),
        helper.make_node("Sigmoid", ["logits"], ["y"], name="/Sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 16, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full((1, 4, 1, 1), -16, np.float32), "shift")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def recipe_for(tmp_path):
    model = tiny_logits_model(tmp_path / "logits.onnx")
    return write_recipe(
        tmp_path / "logits.yaml",
        name="logits",
        task="other",
        model={"onnx": str(model)},
        inputs=[{"name": "x", "shape": [1, 3, 16, 16]}],
    )


def test_onnxruntimes_own_sigmoid_error_passes_on_float64_evidence(tmp_path):
    result = pipeline_runner(load_recipe(recipe_for(tmp_path)), log=lambda m: None).run(until="rebuild")
    rebuild = result.stages[1]
    assert rebuild.status == "passed", rebuild.reason
    record = json.loads((result.root / "rebuild" / "stage.json").read_text())
    assert record["metrics"][0]["rel_error"] > 1e-2  # against onnxruntime: its Sigmoid is off
    reference = record["evidence"]["reference"]
    assert reference["op"] == "Sigmoid" and reference["max_rel_error"] <= 1e-4 < reference["onnxruntime_rel_error"]
    diff = json.loads((result.root / "rebuild" / "diff.json").read_text())
    assert diff["wrong"] is None
    sigmoid = next(t for t in diff["tensors"] if t["node"] == "/Sigmoid")
    assert sigmoid["reference_off"].startswith("onnxruntime's own Sigmoid is off its float64 value")


def test_a_wrong_node_upstream_is_blamed_not_the_sigmoid_after_it(tmp_path, monkeypatch):
    inject(monkeypatch, "Add", wrong_add)
    result = pipeline_runner(load_recipe(recipe_for(tmp_path)), log=lambda m: None).run(until="rebuild")
    assert result.stages[1].status == "failed"
    diff = json.loads((result.root / "rebuild" / "diff.json").read_text())
    assert diff["first"]["node"] == "/Add" and diff["wrong"]["node"] == "/Add"
    assert "on onnxruntime's own inputs Add '/Add'" in result.stages[1].reason
