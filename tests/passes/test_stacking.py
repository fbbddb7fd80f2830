"""UnsqueezesToStack: torch.stack as Unsqueeze + Concat becomes one torch2ms.Stack (ops.stack).
GathersToUnstack: one Gather per position of an axis (a loop over the layers of a stacked KV
cache) becomes one torch2ms.Unstack (``ops.unstack``); a missing or repeated position, or Gathers in
different modules, leave the Gathers as they are. Outputs are checked against onnxruntime."""

from __future__ import annotations

import numpy as np
from converters.helpers import check_model, rand
from onnx import TensorProto, helper, numpy_helper

from torch2ms.passes import GathersToUnstack, UnsqueezesToStack


def _model(indices, axis=0, names=None, shape=(3, 2, 4)):
    """x -> Gather(x, i) for each i in ``indices`` -> each + 1 (so that no Gather output is a graph
    output by itself)."""
    names = names or [f"/attn/Gather_{k}" for k in range(len(indices))]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes, outputs = [], []
    for k, (i, name) in enumerate(zip(indices, names)):
        inits.append(numpy_helper.from_array(np.array(i, np.int64), f"i{k}"))
        nodes.append(helper.make_node("Gather", ["x", f"i{k}"], [f"g{k}"], name=name, axis=axis))
        nodes.append(helper.make_node("Add", [f"g{k}", "one"], [f"y{k}"], name=f"/out/Add_{k}"))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _run(tmp_path, model, shape=(3, 2, 4)):
    return check_model(model, {"x": rand(*shape, seed=3)}, tmp_path, passes=[GathersToUnstack()])


def test_every_position_of_an_axis_becomes_one_unstack(tmp_path):
    source, fired = _run(tmp_path, _model([2, 0, 1]))
    assert fired == {"gathers_to_unstack": 1}
    assert "x_0, x_1, x_2 = ops.unstack(x, axis=0)" in source, "the parts take the tensor's name"
    assert "x[" not in source


def test_a_negative_index_and_another_axis(tmp_path):
    source, fired = _run(tmp_path, _model([0, -1], axis=-1, shape=(3, 2)), shape=(3, 2))
    assert fired == {"gathers_to_unstack": 1}
    assert "ops.unstack(x, axis=1)" in source


def test_a_missing_or_repeated_position_keeps_the_gathers(tmp_path):
    for k, indices in enumerate(([0, 2], [0, 1, 2, 1])):
        pass_ = GathersToUnstack()
        source, fired = check_model(_model(indices), {"x": rand(3, 2, 4, seed=4)}, tmp_path / str(k), passes=[pass_])
        assert fired == {"gathers_to_unstack": 0}
        assert "ops.unstack" not in source
        assert pass_.skipped, "the pass says why it did not fire"


def test_gathers_in_two_modules_stay_apart(tmp_path):
    pass_ = GathersToUnstack()
    names = ["/blocks.0/attn/Gather", "/blocks.1/attn/Gather", "/blocks.1/attn/Gather_1"]
    _, fired = check_model(_model([0, 1, 2], names=names), {"x": rand(3, 2, 4, seed=5)}, tmp_path, passes=[pass_])
    assert fired == {"gathers_to_unstack": 0}
    assert "modules" in pass_.skipped[0][1]


def _stack_model(axes, concat_axis=0, extra_use=False, opset=17):
    """a, b, c -> Unsqueeze(axes[k]) each -> Concat(concat_axis); with ``extra_use`` the first
    Unsqueeze's output is a graph output too."""
    inits, nodes = [], []
    for k, axis in enumerate(axes):
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), f"ax{k}"))
        nodes.append(helper.make_node("Unsqueeze", [f"x{k}", f"ax{k}"], [f"u{k}"], name=f"/cache/Unsqueeze_{k}"))
    nodes.append(
        helper.make_node("Concat", [f"u{k}" for k in range(len(axes))], ["y"], name="/cache/Concat", axis=concat_axis)
    )
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("u0", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [2, 3]) for k in range(len(axes))]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _feeds(n):
    return {f"x{k}": rand(2, 3, seed=10 + k) for k in range(n)}


def test_unsqueezes_and_a_concat_become_one_stack(tmp_path):
    for k, (axes, concat_axis, expect) in enumerate((([0, 0, 0], 0, "axis=0"), ([-1, 2], -1, "axis=2"))):
        source, fired = check_model(
            _stack_model(axes, concat_axis), _feeds(len(axes)), tmp_path / str(k), passes=[UnsqueezesToStack()]
        )
        assert fired == {"unsqueezes_to_stack": 1}
        assert f"ops.stack((x0, x1{', x2' if len(axes) == 3 else ''}), {expect})" in source
        assert "ops.concat" not in source


def test_a_concat_on_another_axis_or_a_shared_unsqueeze_stays(tmp_path):
    for k, (model, n) in enumerate(
        ((_stack_model([0, 0], concat_axis=1), 2), (_stack_model([0, 0], extra_use=True), 2))
    ):
        pass_ = UnsqueezesToStack()
        source, fired = check_model(model, _feeds(n), tmp_path / str(k), passes=[pass_])
        assert fired == {"unsqueezes_to_stack": 0}
        assert "ops.stack" not in source and pass_.skipped
