"""FoldConvAffine: a per-channel constant Mul / Add / Sub after a Conv goes into its weights and bias,
W' = W * scale, b' = b * scale + shift (a frozen BatchNorm written out as arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_model, rand
from onnx import TensorProto, helper, numpy_helper

from torch2ms.passes import FoldConvAffine

C = 4


def _model(ops: list[tuple[str, np.ndarray, bool]], side_branch: bool = False):
    """x -> Conv(C) -> each (op, constant, conv-output-first) in turn -> y."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.uniform(-1, 1, (C, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(-1, 1, (C,)).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t0"], name="/conv/Conv", pads=[1, 1, 1, 1])]
    for k, (op, c, first) in enumerate(ops):
        inits.append(numpy_helper.from_array(c.astype(np.float32), f"c{k}"))
        args = [f"t{k}", f"c{k}"] if first else [f"c{k}", f"t{k}"]
        nodes.append(helper.make_node(op, args, [f"t{k + 1}"], name=f"/affine/{op}_{k}"))
    nodes.append(helper.make_node("Identity", [f"t{len(ops)}"], ["y"], name="/out/Identity"))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if side_branch:
        nodes.append(helper.make_node("Sigmoid", ["t0"], ["side"], name="/side/Sigmoid"))
        outs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    return model


def _scale(shape=(1, C, 1, 1), low=0.5, high=1.5):
    return np.random.default_rng(4).uniform(low, high, shape)


FEEDS = {"x": rand(1, 3, 8, 8, seed=5)}


def test_a_frozen_batchnorm_folds_into_the_conv(tmp_path):
    model = _model([("Mul", _scale(), True), ("Add", _scale(low=-0.5, high=0.5), False)])
    p = FoldConvAffine()
    _, fired = check_model(model, FEEDS, tmp_path, passes=[p], expect_nodes=["Conv", "Identity"])
    assert fired == {"fold_conv_affine": 2}


@pytest.mark.parametrize("shape", [(C, 1, 1), (1, 1, 1, 1), ()], ids=["CHW", "scalar-4d", "scalar"])
def test_conv_minus_a_per_channel_or_single_constant_folds(tmp_path, shape):
    model = _model([("Sub", _scale(shape), True)])
    _, fired = check_model(model, FEEDS, tmp_path, passes=[FoldConvAffine()], expect_nodes=["Conv", "Identity"])
    assert fired == {"fold_conv_affine": 1}


@pytest.mark.parametrize(
    "ops, side, reason",
    [
        ([("Sub", _scale(), False)], False, "constant minus the conv"),
        ([("Mul", _scale((1, C, 8, 1)), True)], False, "is not per output channel"),
        ([("Mul", _scale(), True)], True, None),  # the conv output also feeds a side branch
    ],
    ids=["c-minus-conv", "per-row", "shared-output"],
)
def test_does_not_fire(tmp_path, ops, side, reason):
    model = _model(ops, side_branch=side)
    p = FoldConvAffine()
    nodes = ["Conv", ops[0][0], "Identity"] + (["Sigmoid"] if side else [])
    _, fired = check_model(model, FEEDS, tmp_path, passes=[p], expect_nodes=nodes)
    assert fired == {"fold_conv_affine": 0}
    if reason:
        assert p.skipped and reason in p.skipped[0][1]
    else:
        assert not p.skipped  # no match at all: the conv output has two readers
