"""BatchNormalization and LayerNormalization against onnxruntime (reductions: test_reduce.py)."""

from __future__ import annotations

import pytest
from converters.helpers import check_op, check_unsupported, const, rand, x


def _bn_stats(c: int):
    return [
        const(rand(c, seed=1, low=0.5, high=1.5)),
        const(rand(c, seed=2)),
        const(rand(c, seed=3)),
        const(rand(c, seed=4, low=0.5, high=2.0)),
    ]


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (4, 3), (2, 3, 7)], ids=["4d", "2d", "3d"])
@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-3, "momentum": 0.99}], ids=["default", "eps_momentum"])
@pytest.mark.parametrize("opset", [11, 15])
def test_batch_normalization(shape, attrs, opset, tmp_path):
    check_op("BatchNormalization", [x(*shape)] + _bn_stats(shape[1]), attrs, tmp_path, opset=opset)


def test_batch_normalization_training_refused():
    check_unsupported(
        "BatchNormalization",
        [x(2, 3, 4, 4)] + _bn_stats(3),
        {"training_mode": 1},
        "training_mode",
        opset=15,
        n_outputs=3,
    )


@pytest.mark.parametrize(
    "shape, axis, bias",
    [
        ((2, 5, 8), -1, True),
        ((2, 5, 8), -1, False),
        ((2, 5, 8), -2, True),
        ((2, 3, 4, 6), 2, True),
        ((2, 8), None, True),
    ],
    ids=["last", "last_nobias", "last_two", "axis2_4d", "default_axis_2d"],
)
@pytest.mark.parametrize("epsilon", [None, 1e-6])
def test_layer_normalization(shape, axis, bias, epsilon, tmp_path):
    axis_ = -1 if axis is None else axis
    normalized = shape[axis_:]
    inputs = [x(*shape), const(rand(*normalized, seed=1, low=0.5, high=1.5))] + (
        [const(rand(*normalized, seed=2))] if bias else []
    )
    attrs = {} if axis is None else {"axis": axis}
    if epsilon is not None:
        attrs["epsilon"] = epsilon
    check_op("LayerNormalization", inputs, attrs, tmp_path)
