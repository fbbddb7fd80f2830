"""BatchNormalization, LayerNormalization and the reductions against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_op, check_unsupported, const, rand, x


def _bn_stats(c: int):
    return [
        const(rand(c, seed=1, low=0.5, high=1.5)),
        const(rand(c, seed=2)),
        const(rand(c, seed=3)),
        const(rand(c, seed=4, low=0.5, high=2.0)),
    ]


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (4, 3), (2, 3, 7), (2, 3, 4, 5, 6)], ids=["4d", "2d", "3d", "5d"])
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


@pytest.mark.parametrize("n_outputs", [2, 3])
@pytest.mark.parametrize("shape, axis", [((2, 5, 8), -1), ((2, 3, 4, 6), 1), ((3, 7), 0)])
def test_layer_normalization_statistics(shape, axis, n_outputs, tmp_path):
    """The Mean and InvStdDev outputs."""
    inputs = [x(*shape), const(rand(*shape[axis:], seed=1, low=0.5, high=1.5)), const(rand(*shape[axis:], seed=2))]
    check_op("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, tmp_path, n_outputs=n_outputs)


# --- instance / group normalization (nn.GroupNorm) ---


def _affine(c: int):
    return [const(rand(c, seed=5, low=0.5, high=1.5)), const(rand(c, seed=6))]


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 7), (2, 4, 9), (1, 3, 3, 4, 5), (1, 5, 1, 3)], ids=["2d", "1d", "3d", "1x3"]
)
@pytest.mark.parametrize("epsilon", [None, 1e-3])
def test_instance_normalization(shape, epsilon, tmp_path):
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    check_op("InstanceNormalization", [x(*shape)] + _affine(shape[1]), attrs, tmp_path)


def test_instance_normalization_float16(tmp_path):
    data = rand(2, 3, 5, 6, dtype=np.float16)
    inputs = [x(data=data), const(rand(3, seed=5, dtype=np.float16)), const(rand(3, seed=6, dtype=np.float16))]
    check_op("InstanceNormalization", inputs, {}, tmp_path, rel_tol=2e-3)


def test_instance_normalization_opset11(tmp_path):
    check_op("InstanceNormalization", [x(1, 4, 6, 6)] + _affine(4), {}, tmp_path, opset=11)


@pytest.mark.parametrize(
    "shape, groups", [((2, 6, 5, 7), 3), ((2, 6, 5, 7), 1), ((2, 6, 5, 7), 6), ((1, 8, 9), 2), ((1, 4, 3, 4, 5), 2)]
)
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(shape, groups, opset, tmp_path):
    """Opset 18: scale and bias per group; opset 21: per channel."""
    n_affine = groups if opset < 21 else shape[1]
    check_op("GroupNormalization", [x(*shape)] + _affine(n_affine), {"num_groups": groups}, tmp_path, opset=opset)


def test_group_normalization_epsilon(tmp_path):
    check_op("GroupNormalization", [x(2, 4, 3, 3)] + _affine(4), {"num_groups": 2, "epsilon": 1e-2}, tmp_path, opset=21)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_group_normalization_dtypes(dtype, tmp_path):
    inputs = [
        x(data=rand(2, 4, 3, 5, dtype=dtype)),
        const(rand(4, seed=5, dtype=dtype)),
        const(rand(4, seed=6, dtype=dtype)),
    ]
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_op("GroupNormalization", inputs, {"num_groups": 2}, tmp_path, opset=21, rel_tol=tol)


def test_group_normalization_rank2_refused():
    check_unsupported("GroupNormalization", [x(3, 4)] + _affine(4), {"num_groups": 2}, "rank 2", opset=21)


# --- RMS, Lp, mean-variance normalization and LRN (formulas over ops) ---


@pytest.mark.parametrize(
    "shape, axis", [((2, 5, 8), -1), ((2, 5, 8), 1), ((2, 3, 4, 6), 2), ((3, 7), None), ((2, 3, 4), 0)]
)
@pytest.mark.parametrize("epsilon", [None, 1e-3])
def test_rms_normalization(shape, axis, epsilon, tmp_path):
    axis_ = -1 if axis is None else axis
    attrs = ({} if axis is None else {"axis": axis}) | ({} if epsilon is None else {"epsilon": epsilon})
    scale = const(rand(*shape[axis_:], seed=1, low=0.5, high=1.5))
    check_op("RMSNormalization", [x(*shape), scale], attrs, tmp_path, opset=23)


def test_rms_normalization_float16(tmp_path):
    data = rand(2, 5, 8, dtype=np.float16)
    check_op(
        "RMSNormalization",
        [x(data=data), const(rand(8, seed=1, dtype=np.float16))],
        {},
        tmp_path,
        opset=23,
        rel_tol=2e-3,
    )


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_lp_normalization(p, axis, tmp_path):
    data = rand(3, 4, 5)
    data[1, :, 2] = 0  # a zero vector along axis 1 stays zero
    attrs = {"p": p} | ({} if axis is None else {"axis": axis})
    check_op("LpNormalization", [x(data=data)], attrs, tmp_path)


@pytest.mark.parametrize("axes", [None, [2, 3], [1], [0, 1, 2, 3]], ids=["default", "spatial", "channel", "all"])
def test_mean_variance_normalization(axes, tmp_path):
    attrs = {} if axes is None else {"axes": axes}
    check_op("MeanVarianceNormalization", [x(2, 3, 5, 4)], attrs, tmp_path, rel_tol=1e-4)


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 7, 5, 5), {"size": 5}),
        ((2, 7, 5, 5), {"size": 3, "alpha": 1e-2, "beta": 0.5, "bias": 2.0}),
        ((1, 4, 6, 5), {"size": 1}),
        ((1, 3, 5, 4), {"size": 7, "alpha": 0.5}),
    ],
    ids=["default", "attrs", "size1", "size_over_channels"],
)
def test_lrn(shape, attrs, tmp_path):
    check_op("LRN", [x(*shape)], attrs, tmp_path)


@pytest.mark.parametrize(
    "op, attrs, dtype",
    [
        ("LpNormalization", {"p": 1}, np.float16),
        ("LpNormalization", {"p": 2}, np.float64),
        ("MeanVarianceNormalization", {}, np.float16),
        ("LRN", {"size": 3}, np.float16),
    ],
    ids=["lp1_float16", "lp2_float64", "mvn_float16", "lrn_float16"],
)
def test_normalization_dtypes(op, attrs, dtype, tmp_path):
    """(onnxruntime has no float64 MeanVarianceNormalization or LRN)"""
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_op(op, [x(data=rand(2, 3, 5, 6, dtype=dtype))], attrs, tmp_path, rel_tol=tol)
