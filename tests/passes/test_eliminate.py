"""EliminateIdentity: Identity and inference-mode Dropout leave the graph; the graph's output names stay."""

from __future__ import annotations

from converters.helpers import check_model, rand
from onnx import TensorProto, helper

from torch2ms.passes import EliminateIdentity


def _model(nodes, outputs=("y",), extra_outputs=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in (*outputs, *extra_outputs)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_identity_and_dropout_leave_and_the_output_keeps_its_name(tmp_path):
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="/act/Relu"),
            helper.make_node("Identity", ["r"], ["i"], name="/id/Identity"),
            helper.make_node("Dropout", ["i"], ["d"], name="/drop/Dropout"),
            helper.make_node("Sigmoid", ["d"], ["s"], name="/head/Sigmoid"),
            helper.make_node("Identity", ["s"], ["y"], name="/out/Identity"),
        ]
    )
    p = EliminateIdentity()
    _, fired = check_model(model, {"x": rand(2, 3, 4, seed=1)}, tmp_path, passes=[p], expect_nodes=["Relu", "Sigmoid"])
    assert fired == {"eliminate_identity": 3}
    assert not p.skipped


def test_does_not_fire_on_a_used_dropout_mask_or_an_input_wired_to_an_output(tmp_path):
    mask = helper.make_node("Dropout", ["x"], ["d", "mask"], name="/drop/Dropout")
    wire = helper.make_node("Identity", ["x"], ["y"], name="/wire/Identity")
    cast = helper.make_node("Cast", ["mask"], ["m"], name="/mask/Cast", to=TensorProto.FLOAT)
    add = helper.make_node("Add", ["d", "m"], ["z"], name="/sum/Add")
    model = _model([mask, wire, cast, add], outputs=("y", "z"))
    p = EliminateIdentity()
    _, fired = check_model(
        model, {"x": rand(2, 3, 4, seed=2)}, tmp_path, passes=[p], expect_nodes=["Dropout", "Identity", "Cast", "Add"]
    )
    assert fired == {"eliminate_identity": 0}
    reasons = dict(p.skipped)
    assert "mask output is used" in reasons["/drop/Dropout"]
    assert "graph input straight to a graph output" in reasons["/wire/Identity"]
