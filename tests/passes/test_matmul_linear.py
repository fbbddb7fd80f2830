"""MatMulToLinear: MatMul by a constant 2-D weight (+ Add of a per-feature bias) becomes one
torch2ms.Linear node (nn.Dense); a runtime weight or a 1-D input stays a MatMul."""

from __future__ import annotations

import numpy as np
from converters.helpers import check_model, rand
from onnx import TensorProto, helper, numpy_helper

from torch2ms.passes import MatMulToLinear


def _model(x_shape, weight_input: bool = False, bias_shape=(6,)):
    rng = np.random.default_rng(6)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    inits = [numpy_helper.from_array(rng.uniform(-1, 1, bias_shape).astype(np.float32), "b")]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [5, 6]))
    else:
        inits.append(numpy_helper.from_array(rng.uniform(-1, 1, (5, 6)).astype(np.float32), "w"))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="/fc/MatMul"),
        helper.make_node("Add", ["m", "b"], ["y"], name="/fc/Add"),
    ]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, [out], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    return model


def test_matmul_and_bias_become_one_linear(tmp_path):
    source, fired = check_model(
        _model((2, 3, 5)), {"x": rand(2, 3, 5, seed=7)}, tmp_path, passes=[MatMulToLinear()], expect_nodes=["Linear"]
    )
    assert fired == {"matmul_to_linear": 1}
    assert "nn.Dense(5, 6" in source


def test_a_bias_of_another_shape_stays_an_add(tmp_path):
    _, fired = check_model(
        _model((2, 3, 5), bias_shape=(3, 1)),
        {"x": rand(2, 3, 5, seed=8)},
        tmp_path,
        passes=[MatMulToLinear()],
        expect_nodes=["Linear", "Add"],
    )
    assert fired == {"matmul_to_linear": 1}


def test_does_not_fire_on_a_runtime_weight_or_a_vector_input(tmp_path):
    feeds = {"x": rand(2, 3, 5, seed=9), "w": rand(5, 6, seed=10)}
    _, fired = check_model(
        _model((2, 3, 5), weight_input=True),
        feeds,
        tmp_path / "w",
        passes=[MatMulToLinear()],
        expect_nodes=["MatMul", "Add"],
    )
    assert fired == {"matmul_to_linear": 0}
    p = MatMulToLinear()
    _, fired = check_model(
        _model((5,)), {"x": rand(5, seed=11)}, tmp_path / "v", passes=[p], expect_nodes=["MatMul", "Add"]
    )
    assert fired == {"matmul_to_linear": 0}
    assert p.skipped and "1-D" in p.skipped[0][1]
