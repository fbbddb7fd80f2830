"""DFT and STFT (converters/spectral.py) against onnxruntime; the window generators fold to constants."""

from __future__ import annotations

import numpy as np
import pytest
from converters.helpers import check_model, check_op, check_unsupported, const, rand, x
from onnx import TensorProto, helper


def scalar(v: int):
    return const(np.int64(v))


# float32 DFT as one matmul sums N products per bin (onnxruntime's FFT sums fewer): relative error ~ sqrt(N) ulp
TOL = 2e-5


@pytest.mark.parametrize(
    "shape, attrs, length",
    [
        ((2, 8, 1), {}, None),
        ((2, 8, 2), {}, None),
        ((3, 7, 2), {"inverse": 1}, None),
        ((2, 10, 1), {"onesided": 1}, None),
        ((2, 9, 1), {"onesided": 1}, None),
        ((1, 6, 5, 2), {"axis": 2}, None),
        ((4, 3, 2), {"axis": 0}, None),
        ((2, 5, 3, 1), {"axis": -3, "onesided": 1}, None),
        ((2, 8, 2), {}, 12),
        ((2, 8, 1), {"onesided": 1}, 5),
        ((2, 5, 2), {"onesided": 1, "inverse": 1}, None),
        ((2, 5, 2), {"onesided": 1, "inverse": 1}, 9),
        ((2, 64, 1), {"onesided": 1}, None),
    ],
    ids=[
        "real",
        "complex",
        "inverse",
        "rfft_even",
        "rfft_odd",
        "axis2",
        "axis0",
        "negative_axis",
        "padded",
        "truncated_rfft",
        "irfft",
        "irfft_odd_length",
        "rfft_64",
    ],
)
def test_dft_17(shape, attrs, length, tmp_path):
    inputs = [x(*shape)] + ([scalar(length)] if length is not None else [])
    check_op("DFT", inputs, attrs, tmp_path, opset=17, rel_tol=TOL)


@pytest.mark.parametrize(
    "shape, attrs, length, axis",
    [
        ((2, 8, 2), {}, None, None),
        ((2, 6, 4, 1), {"onesided": 1}, None, 1),
        ((3, 5, 2), {"inverse": 1}, 7, -2),
        ((2, 4, 3, 2), {"onesided": 1, "inverse": 1}, None, -3),
    ],
    ids=["default_axis", "axis_input", "inverse_padded", "irfft_axis"],
)
def test_dft_20(shape, attrs, length, axis, tmp_path):
    inputs = [x(*shape), scalar(length) if length is not None else None]
    if axis is not None:
        inputs.append(scalar(axis))
    while inputs[-1] is None:
        inputs.pop()
    check_op("DFT", inputs, attrs, tmp_path, opset=20, rel_tol=TOL)


def test_dft_runtime_length_refused():
    inputs = [x(2, 8, 1), x(data=np.array(8, np.int64))]
    check_unsupported("DFT", inputs, {}, "dft_length (input 1) must be a constant", opset=17)


@pytest.mark.parametrize(
    "signal, step, window, length, onesided",
    [
        ((2, 32, 1), 8, "hann", None, 1),
        ((1, 30, 1), 5, None, 8, 1),
        ((2, 20, 2), 4, "random", None, 0),
        ((1, 25, 1), 3, "random", 7, 0),
        ((3, 16, 1), 16, None, 16, 1),
    ],
    ids=["hann", "no_window", "complex", "odd_window", "one_frame"],
)
def test_stft(signal, step, window, length, onesided, tmp_path):
    inputs = [x(*signal), scalar(step)]
    if window == "hann":
        inputs.append(const(np.hanning(18)[1:-1].astype(np.float32)))
    elif window == "random":
        inputs.append(const(rand(length or 6, seed=4, low=0.0, high=1.0)))
    else:
        inputs.append(None)
    if length is not None:
        inputs.append(scalar(length))
    while inputs[-1] is None:
        inputs.pop()
    check_op("STFT", inputs, {"onesided": onesided}, tmp_path, opset=17, rel_tol=TOL)


def test_stft_runtime_step_refused():
    check_unsupported("STFT", [x(1, 16, 1), x(data=np.array(4, np.int64)), None, scalar(8)], {}, "frame_step (input 1)")


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_folds(op, periodic, tmp_path):
    """A window of constant size is folded by the loader (onnxruntime computes it): only the Mul is left."""
    size = 11
    nodes = [
        helper.make_node(op, ["size"], ["window"], name=f"/w/{op}", periodic=periodic),
        helper.make_node("Mul", ["x", "window"], ["y"], name="/mul/Mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "window",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, size])],
        [helper.make_tensor("size", TensorProto.INT64, [], [size])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_model(model, {"x": rand(2, size)}, tmp_path, expect_nodes=["Mul"])


def test_mel_weight_matrix_folds(tmp_path):
    consts = {"bins": (TensorProto.INT64, 8), "n_fft": (TensorProto.INT64, 32), "rate": (TensorProto.INT64, 16000)}
    consts |= {"low": (TensorProto.FLOAT, 100.0), "high": (TensorProto.FLOAT, 6000.0)}
    nodes = [
        helper.make_node("MelWeightMatrix", list(consts), ["mel"], name="/mel/MelWeightMatrix"),
        helper.make_node("MatMul", ["x", "mel"], ["y"], name="/mm/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "mel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor(k, t, [], [v]) for k, (t, v) in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_model(model, {"x": rand(3, 17)}, tmp_path, expect_nodes=["MatMul"])


def test_window_runtime_size_refused():
    check_unsupported(
        "HannWindow", [x(data=np.array(8, np.int64))], {}, "refused: the output's shape is an input's value"
    )


@pytest.mark.parametrize("opset", [17, 20, 24])
def test_stft_and_dft_opsets(opset, tmp_path):
    check_op(
        "STFT",
        [x(1, 24, 1), scalar(4), const(np.hanning(8).astype(np.float32))],
        {},
        tmp_path,
        opset=opset,
        rel_tol=TOL,
    )
    check_op("DFT", [x(2, 6, 2)], {"inverse": 1}, tmp_path / "dft", opset=opset, rel_tol=TOL)
