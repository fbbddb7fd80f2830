"""Activations and one-input elementwise ops (converters/activation.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_model, check_op, check_unsupported, const, f32, rand, x

from torch2ms.converters.activation import UNARY

# Inputs inside each op's domain (positive for Sqrt/Log, away from 0 for Reciprocal, inside
# (-1, 1) for the inverse sine/cosine/tanh, past 1 for Acosh, away from Tan's poles).
_DOMAIN = {
    "Sqrt": (0.1, 4.0),
    "Log": (0.1, 4.0),
    "Reciprocal": (0.5, 3.0),
    "Asin": (-0.99, 0.99),
    "Acos": (-0.99, 0.99),
    "Atanh": (-0.99, 0.99),
    "Acosh": (1.0, 4.0),
    "Tan": (-1.4, 1.4),
}
# MindSpore's CPU tanh is a fast approximation: measured 1.4e-5 off onnxruntime's.
_TOL = {"Tanh": 5e-5}
INTEGER_ONLY = {"BitwiseNot"}  # tested in test_elementwise.py
# Other float dtypes, where onnxruntime has the kernel (measured at opset 22).
_TRIG = ["Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]
_FLOAT_DTYPES = [(op, "float16") for op in _TRIG + ["Round"]] + [(op, "float64") for op in ["Sin", "Cos", "Round"]]


@pytest.mark.parametrize("op", sorted(set(UNARY) - INTEGER_ONLY))
def test_unary(op, tmp_path):
    low, high = _DOMAIN.get(op, (-4.0, 4.0))
    opset = {"HardSwish": 14, "IsNaN": 20, "Mish": 18}.get(op, 17)
    check_op(
        op,
        [x(2, 3, 4, 5, data=rand(2, 3, 4, 5, low=low, high=high))],
        {},
        tmp_path,
        opset=opset,
        rel_tol=_TOL.get(op, 1e-5),
    )


@pytest.mark.parametrize("op, dtype", _FLOAT_DTYPES)
def test_unary_float_dtypes(op, dtype, tmp_path):
    low, high = _DOMAIN.get(op, (-4.0, 4.0))
    data = rand(3, 4, 5, low=low, high=high).astype(dtype)
    check_op(op, [x(data=data)], {}, tmp_path, opset=22, rel_tol=2e-3 if dtype == "float16" else 1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_round_half_to_even(dtype, tmp_path):
    """ONNX rounds halves to the even neighbour (2.5 -> 2, -1.5 -> -2), not away from zero."""
    halves = np.array([[0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 0.49, -0.51, 1e3 + 0.5, 7.0, -0.0]], dtype)
    check_op("Round", [x(data=halves)], {}, tmp_path, opset=11)


@pytest.mark.parametrize(
    "lo, hi",
    [(0.0, 6.0), (0.0, None), (-1.0, 1.0), (-0.5, None), (None, 0.5), (None, None)],
    ids=["relu6", "relu", "both", "min_only", "max_only", "neither"],
)
@pytest.mark.parametrize("opset", [11, 13])
def test_clip_inputs(lo, hi, opset, tmp_path):
    inputs = [x(2, 3, 4, 4, data=rand(2, 3, 4, 4, low=-8, high=8))]
    inputs.append(f32(lo).data.reshape(()) if lo is not None else None)
    inputs.append(f32(hi).data.reshape(()) if hi is not None else None)
    inputs = [inputs[0]] + [const(v) if v is not None else None for v in inputs[1:]]
    while inputs[-1] is None:
        inputs.pop()
    check_op("Clip", inputs, {}, tmp_path, opset=opset)


def test_clip_runtime_bounds_refused():
    check_unsupported("Clip", [x(2, 3), x(data=np.float32(-1.0)), const(np.float32(1.0))], {}, "min")


# Clip-6 (attributes) is below the loader's opset range (11-20); its converter is called directly.
@pytest.mark.parametrize(
    "attrs, expected",
    [
        ({"min": 0.0, "max": 6.0}, "ops.relu6(a)"),
        ({"min": -1.0, "max": 1.0}, "ops.clamp(a, -1.0, 1.0)"),
        ({"min": -1.0}, "ops.clamp(a, -1.0, None)"),
        ({}, "a"),
    ],
)
def test_clip_opset6_attributes(attrs, expected):
    from torch2ms.converters.activation import clip_v6

    class FakeEmitter:
        def x(self, i=0):
            return "a"

    assert clip_v6(FakeEmitter(), **attrs) == expected


@pytest.mark.parametrize(
    "attrs", [{}, {"alpha": 1 / 6, "beta": 0.5}, {"alpha": 0.3, "beta": 0.4}], ids=["default", "pytorch", "other"]
)
def test_hard_sigmoid(attrs, tmp_path):
    check_op("HardSigmoid", [x(2, 3, 4, 5, data=rand(2, 3, 4, 5, low=-6, high=6))], attrs, tmp_path)


@pytest.mark.parametrize("alpha", [None, 0.2, 1.5])
def test_leaky_relu(alpha, tmp_path):
    check_op("LeakyRelu", [x(2, 3, 4, 5)], {} if alpha is None else {"alpha": alpha}, tmp_path)


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
def test_gelu(approximate, tmp_path):
    check_op("Gelu", [x(2, 3, 8)], {} if approximate is None else {"approximate": approximate}, tmp_path, opset=20)


@pytest.mark.parametrize(
    "shape, axis",
    [((2, 3, 4, 5), None), ((2, 3, 4, 5), -1), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 0), ((2, 3, 4, 5), -3), ((4, 10), 1)],
)
def test_softmax_opset13(shape, axis, tmp_path):
    """Opset 13+: softmax along one axis."""
    check_op("Softmax", [x(*shape)], {} if axis is None else {"axis": axis}, tmp_path, opset=13)


@pytest.mark.parametrize(
    "shape, axis",
    [((2, 3, 4, 5), -1), ((2, 3, 4, 5), 3), ((2, 3, 4, 5), None), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 0), ((4, 10), 1)],
)
def test_softmax_opset11_flattens_from_axis(shape, axis, tmp_path):
    """Before opset 13 softmax normalises over all axes from ``axis`` on (default 1) together."""
    check_op("Softmax", [x(*shape)], {} if axis is None else {"axis": axis}, tmp_path, opset=11)


@pytest.mark.parametrize("opset", [11, 13])
def test_identity_and_dropout(opset, tmp_path):
    check_op("Identity", [x(2, 3)], {}, tmp_path / "identity", opset=opset)
    check_op("Dropout", [x(2, 3)], {}, tmp_path / "dropout", opset=opset)


def test_dropout_with_ratio_and_mask(tmp_path):
    """Inference Dropout: the output is the input and the mask is all true."""
    check_op("Dropout", [x(2, 3, 4), const(np.float32(0.3)), const(np.bool_(False))], {}, tmp_path, n_outputs=2)


def test_dropout_in_training_refused():
    check_unsupported(
        "Dropout", [x(2, 3, 4), const(np.float32(0.3)), const(np.bool_(True))], {"seed": 0}, "training_mode"
    )


# --- the softmax family before opset 13, Hardmax ---


@pytest.mark.parametrize(
    "shape, axis",
    [((2, 3, 4, 5), None), ((2, 3, 4, 5), -1), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 0), ((2, 3, 4, 5), -3), ((4, 10), 1)],
)
@pytest.mark.parametrize("opset", [11, 13])
def test_log_softmax(shape, axis, opset, tmp_path):
    """Opset 13: one axis; before: all axes from ``axis`` on (default 1), flattened."""
    check_op("LogSoftmax", [x(*shape)], {} if axis is None else {"axis": axis}, tmp_path, opset=opset)


def _ties(*shape):
    """Small integers as floats: many equal maxima along every axis."""
    return np.random.default_rng(3).integers(0, 3, shape).astype(np.float32)


@pytest.mark.parametrize("axis", [None, -1, 0, 1, 2])
@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax(axis, opset, tmp_path):
    """1 at the first maximum (ties are everywhere in the data); before 13 over the flattened tail."""
    check_op("Hardmax", [x(data=_ties(2, 3, 4))], {} if axis is None else {"axis": axis}, tmp_path, opset=opset)


@pytest.mark.parametrize("op, dtype", [("Hardmax", "float16"), ("LogSoftmax", "float16"), ("LogSoftmax", "float64")])
def test_float_dtypes_of_the_softmax_family(op, dtype, tmp_path):
    """At opset 22, where onnxruntime has these kernels (no float64 Hardmax)."""
    data = _ties(2, 3, 4).astype(dtype)
    check_op(op, [x(data=data)], {"axis": 1}, tmp_path, opset=22, rel_tol=2e-3 if dtype == "float16" else 1e-5)


# --- PRelu ---


@pytest.mark.parametrize(
    "x_shape, slope_shape, layer",
    [
        ((2, 3, 4, 5), (3, 1, 1), True),
        ((2, 3, 4, 5), (1,), True),
        ((2, 3, 4, 5), (), True),
        ((2, 3), (3,), True),
        ((2, 3, 4), (3, 1), True),
        ((2, 3, 4, 5), (5,), False),
        ((2, 3, 4, 5), (4, 5), False),
        ((2, 3, 4, 5), (1, 3, 4, 5), False),
    ],
    ids=["per_channel", "one", "scalar", "2d", "3d_per_channel", "last_axis", "trailing", "full"],
)
@pytest.mark.parametrize("opset", [11, 16])
def test_prelu(x_shape, slope_shape, layer, opset, tmp_path):
    """One slope per channel (axis 1), or one in all, is nn.PReLU; other broadcasts the formula."""
    slope = rand(*slope_shape, seed=2, low=0.05, high=0.5)
    source = check_op("PRelu", [x(*x_shape), const(slope)], {}, tmp_path, opset=opset)
    assert ("nn.PReLU" in source) == layer


def test_prelu_slope_as_input(tmp_path):
    check_op("PRelu", [x(2, 3, 4), x(3, 1, data=rand(3, 1, low=0.05, high=0.5))], {}, tmp_path, opset=16)


def test_prelu_float16(tmp_path):
    data = rand(2, 3, 4, 5).astype(np.float16)
    check_op(
        "PRelu",
        [x(data=data), const(rand(3, 1, 1, low=0.1, high=0.3).astype(np.float16))],
        {},
        tmp_path,
        opset=16,
        rel_tol=2e-3,
    )


# --- Elu, Selu, Celu, ThresholdedRelu, Shrink, Swish, Softsign, Mish ---


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, 2.0])
def test_elu(alpha, tmp_path):
    check_op("Elu", [x(2, 3, 4, 5)], {} if alpha is None else {"alpha": alpha}, tmp_path)


@pytest.mark.parametrize(
    "attrs",
    [{}, {"alpha": 2.0}, {"gamma": 3.0}, {"alpha": 1.5, "gamma": 0.5}],
    ids=["default", "alpha", "gamma", "both"],
)
def test_selu(attrs, tmp_path):
    check_op("Selu", [x(2, 3, 4, 5)], attrs, tmp_path)


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, 2.0])
@pytest.mark.parametrize("opset", [12, 22])
def test_celu(alpha, opset, tmp_path):
    check_op("Celu", [x(2, 3, 4, 5)], {} if alpha is None else {"alpha": alpha}, tmp_path, opset=opset)


@pytest.mark.parametrize("alpha", [None, 0.0, 0.5, -1.0])
def test_thresholded_relu(alpha, tmp_path):
    check_op("ThresholdedRelu", [x(2, 3, 4, 5)], {} if alpha is None else {"alpha": alpha}, tmp_path)


@pytest.mark.parametrize(
    "attrs",
    [{}, {"lambd": 1.0}, {"bias": 0.7, "lambd": 0.7}, {"bias": 1.5, "lambd": 1.0}, {"bias": -0.5}],
    ids=["default", "hard", "soft", "other", "negative_bias"],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_shrink(attrs, dtype, tmp_path):
    data = rand(2, 3, 4, 5, low=-3, high=3).astype(dtype)
    check_op("Shrink", [x(data=data)], attrs, tmp_path, rel_tol=2e-3 if dtype == "float16" else 1e-5)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_shrink_integers(dtype, tmp_path):
    """Integer Shrink: computed in float64, truncated toward zero (onnxruntime's result)."""
    data = np.array([[-5, -1, 0, 1, 2, 5, 100, -100]]).astype(dtype)
    check_op("Shrink", [x(data=data)], {"bias": 1.5, "lambd": 1.0}, tmp_path)


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, 2.0])
def test_swish(alpha, tmp_path):
    check_op("Swish", [x(2, 3, 4, 5)], {} if alpha is None else {"alpha": alpha}, tmp_path, opset=24)


# float16 where onnxruntime has the kernel (opset 22)
_F16_ACTIVATIONS = ["Elu", "Selu", "ThresholdedRelu", "Softsign", "Mish"]


@pytest.mark.parametrize("op", _F16_ACTIVATIONS)
def test_activation_float16(op, tmp_path):
    data = rand(2, 3, 4, 5, low=-3, high=3).astype(np.float16)
    check_op(op, [x(data=data)], {}, tmp_path, opset=22, rel_tol=3e-3)


@pytest.mark.parametrize("order", ["x_first", "sigmoid_first"])
def test_silu_from_its_decomposition(order, tmp_path):
    """x * Sigmoid(x) (either operand order) becomes one torch2ms.Silu node, written as ops.silu."""
    from onnx import TensorProto, helper

    from torch2ms.passes import rebuild_passes

    operands = ["x", "s"] if order == "x_first" else ["s", "x"]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="/act/Sigmoid"), helper.make_node("Mul", operands, ["y"])]
    graph = helper.make_graph(
        nodes,
        "silu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    source, _ = check_model(
        model, {"x": rand(2, 3, 4, 5, low=-6, high=6)}, tmp_path, passes=rebuild_passes(), expect_nodes=["Silu"]
    )
    assert "ops.silu(" in source and "ops.sigmoid(" not in source


# --- Softmax over rows that are all -inf (masked attention) ---


def _masked_softmax(axis: int, opset: int, dtype=np.float32):
    """Softmax(Where(mask, x, -inf)): a masked_fill(-inf) as PyTorch exports it."""
    import onnx
    from onnx import helper, numpy_helper

    vi = helper.make_tensor_value_info
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Where", ["mask", "x", "ninf"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=axis),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("mask", onnx.TensorProto.BOOL, [2, 3, 4]), vi("x", elem, [2, 3, 4])],
        [vi("y", elem, [2, 3, 4])],
        [numpy_helper.from_array(np.array(-np.inf, dtype), "ninf")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    mask = np.random.default_rng(0).random((2, 3, 4)) > 0.3
    mask[0, 1, :] = False  # a fully masked row, before unmasked ones
    mask[1, 0, :] = False
    return model, {"mask": mask, "x": rand(2, 3, 4, dtype=dtype)}


@pytest.mark.parametrize("axis, opset, dtype", [(-1, 13, np.float32), (2, 11, np.float32), (-1, 13, np.float16)])
def test_softmax_after_a_fully_masked_row(axis, opset, dtype, tmp_path):
    """MindSpore's CPU softmax turns every row after an all -inf row to garbage; the converter
    writes softmax out there (onnx_masked_softmax): the masked row is NaN (as in onnxruntime),
    the others right."""
    from converters.helpers import convert_and_run, load, run_ort

    model, feeds = _masked_softmax(axis, opset, dtype)
    (expected,) = run_ort(model, feeds)
    assert np.isnan(expected[0, 1]).all() and np.isfinite(expected[0, 2]).all()
    graph, _ = load(model, feeds)
    results, source = convert_and_run(graph, feeds, tmp_path / "net")
    assert "onnx_masked_softmax(" in source and "ops.softmax(" not in source
    for mode, (actual,) in results.items():
        tol = 1e-3 if dtype == np.float16 else 1e-5  # float16: within a unit in the last place or two
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, equal_nan=True, err_msg=mode)


def test_softmax_without_an_infinite_constant_stays_ops_softmax(tmp_path):
    source = check_op("Softmax", [x(2, 3, 4)], {"axis": -1}, tmp_path, opset=13)
    assert "ops.softmax(" in source and "onnx_masked_softmax" not in source
