"""An ONNX source whose inputs and outputs declare an open batch (``dim_value: -1`` as PaddlePaddle
writes it, or a ``dim_param``) is converted at the recipe's batch: ``model.onnx`` declares the
shapes the run checked, all five stages pass, and the bundle's compatibility check finds no dynamic
output; with ``inputs[].batch`` dimension 0 stays open as ``batch``."""

from __future__ import annotations

import json

import numpy as np
import onnx
from conftest import write_recipe
from onnx import TensorProto, helper, numpy_helper

from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.verify import verify_bundle
from torch2ms.export.onnx_shapes import fix_dimensions
from torch2ms.recipe import load_recipe, parse_recipe
from torch2ms.stages import pipeline_runner


def open_batch_onnx(path):
    """x [-1, 3] -> MatMul -> Relu -> y [-1, 2]; x -> Sigmoid -> z [N, 3]; the batch open everywhere."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="/open/MatMul"),
        helper.make_node("Relu", ["m"], ["y"], name="/open/Relu"),
        helper.make_node("Sigmoid", ["x"], ["z"], name="/open/Sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "open",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3]),
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_open_batch_converts_at_the_recipes_batch_and_packages(tmp_path):
    open_batch_onnx(tmp_path / "open.onnx")
    recipe = write_recipe(
        tmp_path / "r.yaml",
        name="open",
        task="other",
        model={"onnx": "open.onnx"},
        inputs=[{"name": "x", "shape": [2, 3]}],
    )
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    written = onnx.load(str(result.root / "export" / "model.onnx"))
    assert [dims(v) for v in written.graph.input] == [[2, 3]]
    assert [dims(v) for v in written.graph.output] == [[2, 2], [2, 3]]
    extra = json.loads((result.root / "export" / "stage.json").read_text())["extra"]
    assert len(extra["dimensions_fixed"]) == 3
    ref = np.load(result.root / "export" / "reference.npz")
    assert ref["output.y"].shape[1:] == (2, 2)
    bundle = build_bundle(result, tmp_path / "dist", log=lambda m: None)
    assert not [w for w in bundle.warnings if "dynamic shape" in w], bundle.warnings
    assert verify_bundle(bundle.path, log=lambda m: None).samples == 2


def test_a_served_batch_stays_open_as_batch(tmp_path):
    model = onnx.load(str(open_batch_onnx(tmp_path / "open.onnx")))
    recipe = parse_recipe(
        {"name": "x", "model": {"onnx": "open.onnx"}, "inputs": [{"name": "x", "shape": [1, 3], "batch": [1, 4]}]}
    )
    changed = fix_dimensions(model, recipe, {"y": np.zeros((1, 2)), "z": np.zeros((1, 3))})
    assert [dims(v) for v in model.graph.input] == [["batch", 3]]
    assert [dims(v) for v in model.graph.output] == [["batch", 2], ["batch", 3]]
    assert changed == [
        "input 'x': [-1, 3] -> ['batch', 3]",
        "output 'y': [-1, 2] -> ['batch', 2]",
        "output 'z': ['N', 3] -> ['batch', 3]",
    ]
