"""Quantization (converters/quantize.py) against onnxruntime: integer outputs must match exactly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from converters.helpers import check_op, check_unsupported, const, convert_and_run, load, rand, reference, x
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

from torch2ms.passes import fold_passes

RANGES = {np.uint8: (0, 255), np.int8: (-128, 127), np.uint16: (0, 65535), np.int16: (-32768, 32767)}


def _ints(shape, dtype, seed=0) -> np.ndarray:
    lo, hi = RANGES[dtype]
    return np.random.default_rng(seed).integers(lo, hi + 1, shape).astype(dtype)


def _ties(shape, scale, seed=0) -> np.ndarray:
    """Values on and next to the rounding midpoints of ``x / scale`` (round half to even), plus saturating ones."""
    k = np.random.default_rng(seed).integers(-300, 300, shape)
    half = (k + 0.5) * scale
    near = np.where(k % 3 == 0, np.nextafter(np.float32(half), np.float32(0)), np.float32(half))
    return np.where(k % 7 == 0, k * 1000.0, near).astype(np.float32)


@pytest.mark.parametrize(
    "dtype, scale, zero_point",
    [
        (np.uint8, 0.25, 128),
        (np.int8, 0.5, -3),
        (np.uint8, 0.0371, 7),
        (np.int8, 0.013, 0),
        (np.uint8, 0.1, None),
    ],
    ids=["uint8_pow2", "int8_pow2", "uint8", "int8_zero", "no_zero_point"],
)
def test_quantize_per_tensor(dtype, scale, zero_point, tmp_path):
    inputs = [x(data=_ties((3, 4, 5), scale)), const(np.float32(scale))]
    if zero_point is not None:
        inputs.append(const(np.array(zero_point, dtype)))
    check_op("QuantizeLinear", inputs, {}, tmp_path, opset=13)


@pytest.mark.parametrize("dtype", [np.uint16, np.int16])
def test_quantize_16_bit(dtype, tmp_path):
    data = _ties((4, 6), 0.001) * 40
    check_op(
        "QuantizeLinear", [x(data=data), const(np.float32(0.003)), const(np.array(17, dtype))], {}, tmp_path, opset=21
    )


@pytest.mark.parametrize("output_dtype, dtype", [(TensorProto.INT8, np.int8), (TensorProto.UINT16, np.uint16)])
def test_quantize_output_dtype(output_dtype, dtype, tmp_path):
    """Without a zero point, opset 21's output_dtype gives the type."""
    check_op(
        "QuantizeLinear",
        [x(data=_ties((8,), 0.05)), const(np.float32(0.05))],
        {"output_dtype": output_dtype},
        tmp_path,
        opset=21,
    )


@pytest.mark.parametrize("axis, shape", [(1, (2, 3, 4)), (0, (3, 5)), (-1, (2, 2, 5)), (2, (1, 2, 3, 4))])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_per_axis(axis, shape, dtype, tmp_path):
    n = shape[axis]
    scale = rand(n, seed=3, low=0.01, high=0.2)
    zp = _ints((n,), dtype, seed=4) // 4
    check_op(
        "QuantizeLinear", [x(data=_ties(shape, 0.07)), const(scale), const(zp)], {"axis": axis}, tmp_path, opset=13
    )


@pytest.mark.parametrize("block_size, shape, axis", [(2, (4, 6), 1), (3, (7, 4), 0), (4, (2, 10), -1)])
def test_quantize_blocked(block_size, shape, axis, tmp_path):
    blocks = list(shape)
    blocks[axis] = -(-shape[axis] // block_size)
    scale, zp = rand(*blocks, seed=5, low=0.02, high=0.1), _ints(blocks, np.int8, seed=6) // 8
    attrs = {"axis": axis, "block_size": block_size}
    check_op("QuantizeLinear", [x(data=_ties(shape, 0.04)), const(scale), const(zp)], attrs, tmp_path, opset=21)


def test_quantize_runtime_scale(tmp_path):
    inputs = [x(data=_ties((3, 4), 0.1)), x(data=np.float32(0.1)), const(np.array(3, np.uint8))]
    check_op("QuantizeLinear", inputs, {}, tmp_path, opset=13)


@pytest.mark.parametrize(
    "dtype, zero_point, opset",
    [(np.uint8, 131, 13), (np.int8, -7, 13), (np.uint8, None, 13), (np.uint16, 1000, 21), (np.int16, -5, 21)],
    ids=["uint8", "int8", "no_zero_point", "uint16", "int16"],
)
def test_dequantize_per_tensor(dtype, zero_point, opset, tmp_path):
    inputs = [x(data=_ints((2, 3, 4), dtype)), const(np.float32(0.0173))]
    if zero_point is not None:
        inputs.append(const(np.array(zero_point, dtype)))
    check_op("DequantizeLinear", inputs, {}, tmp_path, opset=opset)


def test_dequantize_int32(tmp_path):
    data = np.random.default_rng(0).integers(-(2**30), 2**30, (5, 7)).astype(np.int32)
    check_op("DequantizeLinear", [x(data=data), const(np.float32(1e-4))], {}, tmp_path, opset=13)


@pytest.mark.parametrize("axis, shape", [(1, (2, 3, 4)), (0, (5, 2)), (-1, (2, 3))])
def test_dequantize_per_axis(axis, shape, tmp_path):
    n = shape[axis]
    inputs = [x(data=_ints(shape, np.int8)), const(rand(n, seed=2, low=0.01, high=1)), const(_ints((n,), np.int8, 3))]
    check_op("DequantizeLinear", inputs, {"axis": axis}, tmp_path, opset=13)


@pytest.mark.parametrize("block_size, shape, axis", [(2, (4, 6), 1), (3, (7, 2), 0)])
def test_dequantize_blocked(block_size, shape, axis, tmp_path):
    blocks = list(shape)
    blocks[axis] = -(-shape[axis] // block_size)
    inputs = [
        x(data=_ints(shape, np.uint8)),
        const(rand(*blocks, seed=1, low=0.01, high=1)),
        const(_ints(blocks, np.uint8)),
    ]
    check_op("DequantizeLinear", inputs, {"axis": axis, "block_size": block_size}, tmp_path, opset=21)


@pytest.mark.parametrize(
    "data",
    [
        rand(3, 4, seed=1),
        rand(2, 5, seed=2, low=0.5, high=3.0),
        rand(7, seed=3, low=-4.0, high=-0.1),
        np.zeros((2, 2), np.float32),
        np.array([0.0, 1.0, 2.0, 255.0, -127.5], np.float32),
    ],
    ids=["mixed", "positive", "negative", "zeros", "ties"],
)
def test_dynamic_quantize(data, tmp_path):
    check_op("DynamicQuantizeLinear", [x(data=data)], {}, tmp_path, opset=11, n_outputs=3)


@pytest.mark.parametrize(
    "a_type, b_type, a_zp, b_zp",
    [
        (np.uint8, np.uint8, 12, 200),
        (np.uint8, np.int8, 128, None),
        (np.int8, np.int8, -3, 5),
        (np.int8, np.uint8, None, 9),
    ],
    ids=["u8u8", "u8s8", "s8s8", "s8u8"],
)
def test_matmul_integer(a_type, b_type, a_zp, b_zp, tmp_path):
    inputs = [x(data=_ints((5, 9), a_type)), const(_ints((9, 4), b_type, seed=1))]
    inputs += [const(np.array(a_zp, a_type)) if a_zp is not None else None]
    inputs += [const(np.array(b_zp, b_type))] if b_zp is not None else []
    check_op("MatMulInteger", inputs, {}, tmp_path, opset=10)


def test_matmul_integer_per_column_and_batched(tmp_path):
    b_zp = _ints((6,), np.uint8, seed=4)
    inputs = [
        x(data=_ints((2, 3, 8), np.uint8)),
        const(_ints((8, 6), np.uint8, seed=2)),
        const(np.uint8(77)),
        const(b_zp),
    ]
    check_op("MatMulInteger", inputs, {}, tmp_path, opset=10)


def test_matmul_integer_runtime_b(tmp_path):
    inputs = [
        x(data=_ints((4, 300), np.uint8)),
        x(data=_ints((300, 3), np.uint8, seed=1)),
        const(np.uint8(255)),
        const(np.uint8(0)),
    ]
    check_op("MatMulInteger", inputs, {}, tmp_path, opset=10)


@pytest.mark.parametrize(
    "dtype, a_shape, b_scale",
    [(np.uint8, (4, 16), 0.02), (np.int8, (2, 3, 16), 0.015), (np.uint8, (3, 16), "per_column")],
    ids=["uint8", "int8_batched", "per_column_scale"],
)
def test_qlinear_matmul(dtype, a_shape, b_scale, tmp_path):
    n = 5
    b_scale = rand(n, seed=8, low=0.01, high=0.05) if b_scale == "per_column" else np.float32(b_scale)
    inputs = [
        x(data=_ints(a_shape, dtype)),
        const(np.float32(0.04)),
        const(np.array(3, dtype)),
        const(_ints((16, n), dtype, seed=1)),
        const(b_scale),
        const(np.array(-2 if dtype == np.int8 else 130, dtype)),
        const(np.float32(0.9)),
        const(np.array(5, dtype)),
    ]
    check_op("QLinearMatMul", inputs, {}, tmp_path, opset=10)


CONV = {
    "plain": ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    "pads_strides": ((2, 4, 9, 8), (6, 4, 3, 3), {"pads": [1, 2, 0, 1], "strides": [2, 1]}),
    "group_dilation": ((1, 4, 8, 8), (4, 2, 3, 3), {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "same_upper": ((1, 2, 6, 5), (3, 2, 2, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "pointwise": ((1, 16, 4, 4), (8, 16, 1, 1), {}),
}


def test_qlinear_conv_split_weights(tmp_path):
    """A weight whose partial sums can pass 2**24 (64 * 9 * 255 * 255) is split into 16 * high + low: two
    convolutions that stay exact in float32; the requantized result still equals onnxruntime's."""
    w = np.full((2, 64, 3, 3), 255, np.uint8)
    w[1] = _ints((64, 3, 3), np.uint8, seed=3)
    data = np.full((1, 64, 5, 5), 255, np.uint8)
    data[0, :, 1:3] = _ints((64, 2, 5), np.uint8, seed=4)
    scales = [const(np.float32(0.01)), const(np.uint8(0))]
    inputs = [x(data=data), *scales, const(w), *scales, const(np.float32(14.5)), const(np.uint8(3))]
    src = check_op("QLinearConv", inputs, {"pads": [1, 1, 1, 1]}, tmp_path, opset=10)
    assert "16 * ops.cast(" in src


@pytest.mark.parametrize(
    "x_type, w_type, per_channel, bias, case",
    [
        (np.uint8, np.uint8, False, False, "plain"),
        (np.uint8, np.int8, True, True, "pads_strides"),
        (np.int8, np.int8, True, True, "group_dilation"),
        (np.uint8, np.int8, False, True, "pointwise"),
        (np.uint8, np.uint8, True, False, "same_upper"),
    ],
    ids=["u8u8", "u8s8_per_channel_bias", "s8s8_group", "u8s8_pointwise", "u8u8_same_upper"],
)
def test_qlinear_conv(x_type, w_type, per_channel, bias, case, tmp_path):
    xs, ws, attrs = CONV[case]
    cout = ws[0]
    w_scale = rand(cout, seed=4, low=0.002, high=0.02) if per_channel else np.float32(0.01)
    w_zp = np.zeros(cout, w_type) if per_channel else np.array(0 if w_type == np.int8 else 131, w_type)
    inputs = [
        x(data=_ints(xs, x_type)),
        const(np.float32(0.05)),
        const(np.array(10 if x_type == np.uint8 else -4, x_type)),
        const(_ints(ws, w_type, seed=1)),
        const(w_scale),
        const(w_zp),
        const(np.float32(0.35)),
        const(np.array(120 if x_type == np.uint8 else 3, x_type)),
    ]
    if bias:
        inputs.append(const(np.random.default_rng(5).integers(-2000, 2000, cout).astype(np.int32)))
    check_op("QLinearConv", inputs, attrs, tmp_path, opset=10)


def test_qdq_model(tmp_path):
    """Q -> DQ -> Conv -> Q -> DQ, as a QDQ-quantized model holds it: per-channel weights, int8."""
    w = rand(6, 3, 3, 3, seed=1, low=-0.5, high=0.5)
    w_scale = np.abs(w).reshape(6, -1).max(axis=1) / 127
    w_q = np.clip(np.round(w / w_scale.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.float32(0.02), "x_scale"),
        numpy_helper.from_array(np.uint8(128), "x_zp"),
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(w_scale.astype(np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(6, np.int8), "w_zp"),
        numpy_helper.from_array(rand(6, seed=2, low=-0.1, high=0.1), "bias"),
        numpy_helper.from_array(np.float32(0.05), "y_scale"),
        numpy_helper.from_array(np.uint8(100), "y_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="/q_in/QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xf"], name="/dq_in/DequantizeLinear"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wf"], name="/dq_w/DequantizeLinear", axis=0),
        helper.make_node("Conv", ["xf", "wf", "bias"], ["y"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["y", "y_scale", "y_zp"], ["yq"], name="/q_out/QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["out"], name="/dq_out/DequantizeLinear"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 6, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feeds = {"x": rand(1, 3, 8, 8, seed=3)}
    # the weight's DequantizeLinear has constant inputs: the loader folds it into the float weight; the
    # rebuild and fold passes (what `torch2ms convert` runs) leave the rest alone
    graph, fired = load(model, feeds, fold_passes())
    assert [n.op_type for n in graph.nodes] == ["QuantizeLinear", "DequantizeLinear", "Conv"] + [
        "QuantizeLinear",
        "DequantizeLinear",
    ], fired
    # onnxruntime without graph optimizations computes the same fake-quant float arithmetic (with them it
    # would fuse DQ -> Conv -> Q into an integer QLinearConv)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, (actual,) in results.items():
        # Q and DQ are exact; the float Conv between them sums in another order, so a value within an ulp of a
        # rounding midpoint may land one step (0.05) away. Everything else must be bit-exact.
        steps = np.round((actual - expected) / 0.05)
        assert np.abs(steps).max() <= 1, mode
        assert np.count_nonzero(steps) <= expected.size // 200, f"{mode}: {np.count_nonzero(steps)} values differ"
        assert np.array_equal(actual[steps == 0], expected[steps == 0]), mode


@pytest.mark.parametrize(
    "output_dtype, name",
    [(TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"), (TensorProto.FLOAT8E5M2, "float8_e5m2")],
)
def test_quantize_types_without_mindspore_dtype_refused(output_dtype, name):
    """The loader refuses the output's dtype by name before the converter runs."""
    inputs = [x(3, 4), const(np.float32(0.1))]
    match = f"has no tensor type for QuantizeLinear output 'out0' ({name})"
    check_unsupported("QuantizeLinear", inputs, {"output_dtype": output_dtype}, match, opset=21)


def test_quantize_runtime_per_axis_scale(tmp_path):
    inputs = [
        x(data=_ties((2, 3, 4), 0.05)),
        x(data=rand(3, seed=1, low=0.02, high=0.1)),
        const(np.arange(3, dtype=np.uint8)),
    ]
    check_op("QuantizeLinear", inputs, {}, tmp_path, opset=13)


def test_dequantize_runtime_scale_and_zero_point(tmp_path):
    inputs = [
        x(data=_ints((4, 3), np.int8)),
        x(data=rand(3, seed=1, low=0.02, high=0.1)),
        x(data=_ints((3,), np.int8, 2)),
    ]
    check_op("DequantizeLinear", inputs, {"axis": 1}, tmp_path, opset=13)


def test_quantize_runtime_blocked_scale_refused():
    inputs = [x(4, 6), x(data=rand(4, 3, seed=1, low=0.02, high=0.1)), const(np.zeros((4, 3), np.int8))]
    check_unsupported(
        "QuantizeLinear", inputs, {"axis": 1, "block_size": 2}, "scale (input 1) must be a constant", opset=21
    )


def test_qlinear_matmul_runtime_scales_and_zero_points(tmp_path):
    """All inputs at run time (onnxruntime's own tests give them so): the multiplier is computed in the graph."""
    inputs = [
        x(data=_ints((3, 6), np.uint8)),
        x(data=np.float32(0.03)),
        x(data=np.uint8(120)),
        x(data=_ints((6, 4), np.uint8, seed=1)),
        x(data=rand(4, seed=2, low=0.01, high=0.05)),
        x(data=_ints((4,), np.uint8, seed=3)),
        x(data=np.float32(0.2)),
        x(data=np.uint8(7)),
    ]
    check_op("QLinearMatMul", inputs, {}, tmp_path, opset=10)


@pytest.mark.parametrize("runtime", [False, True])
def test_qlinear_matmul_float16_scales(runtime, tmp_path):
    """opset 21 allows float16 scales; onnxruntime widens them to float32 before the multiplier (its float16
    product would differ in some roundings: the scales below make the two multipliers differ by 4e-4)."""
    scales = [np.float16(0.0123), np.float16(0.0456), np.float16(0.2789)]
    scale = (lambda v: x(data=v)) if runtime else const
    inputs = [
        x(data=_ints((40, 30), np.uint8)),
        scale(scales[0]),
        const(np.uint8(120)),
        const(_ints((30, 20), np.uint8, seed=1)),
        scale(scales[1]),
        const(np.uint8(130)),
        scale(scales[2]),
        const(np.uint8(128)),
    ]
    check_op("QLinearMatMul", inputs, {}, tmp_path, opset=21)


def test_matmul_integer_runtime_zero_points(tmp_path):
    inputs = [
        x(data=_ints((4, 5), np.uint8)),
        x(data=_ints((5, 3), np.int8, 1)),
        x(data=np.uint8(9)),
        x(data=_ints((3,), np.int8, 2)),
    ]
    check_op("MatMulInteger", inputs, {}, tmp_path, opset=10)


def test_qlinear_conv_runtime_scales(tmp_path):
    xs, ws, attrs = CONV["pads_strides"]
    inputs = [
        x(data=_ints(xs, np.uint8)),
        x(data=np.float32(0.05)),
        x(data=np.uint8(10)),
        const(_ints(ws, np.int8, seed=1)),
        x(data=rand(ws[0], seed=4, low=0.002, high=0.02)),
        const(np.zeros(ws[0], np.int8)),
        x(data=np.float32(0.3)),
        x(data=np.uint8(128)),
        x(data=np.random.default_rng(5).integers(-2000, 2000, ws[0]).astype(np.int32)),
    ]
    check_op("QLinearConv", inputs, attrs, tmp_path, opset=10)


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_quantize_dequantize_opsets(opset, tmp_path):
    """One converter each serves every version (10; 13 axis; 19 saturate; 21 blocks, output_dtype; 23-25 more types)."""
    check_op(
        "QuantizeLinear",
        [x(data=_ties((3, 5), 0.05)), const(np.float32(0.05)), const(np.int8(3))],
        {},
        tmp_path,
        opset=opset,
    )
    q = _ints((3, 5), np.uint8)
    check_op(
        "DequantizeLinear", [x(data=q), const(np.float32(0.05)), const(np.uint8(9))], {}, tmp_path / "dq", opset=opset
    )


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(12, 16), torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _SmallNet(torch.nn.Module):
    def __init__(self, head: bool):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(8, 5) if head else None

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(y.mean((2, 3))) if self.fc is not None else y


class _Calibration(CalibrationDataReader):
    def __init__(self):
        self.batches = iter([{"x": rand(1, 3, 16, 16, seed=k)} for k in range(8)])  # static: the conv nets

    def get_next(self):
        return next(self.batches, None)


@pytest.mark.parametrize(
    "how, ops",
    [
        ("qdq", {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"}),
        ("qoperator", {"QuantizeLinear", "QLinearConv", "DequantizeLinear"}),
        ("dynamic", {"DynamicQuantizeLinear", "MatMulInteger"}),
    ],
)
def test_onnxruntime_quantized_model(how, ops, tmp_path):
    """A torch model quantized by onnxruntime's own tools (static QDQ and QOperator per channel, dynamic),
    through the rebuild and fold passes, against onnxruntime without graph optimizations (integer nodes exact)."""
    torch.manual_seed(0)
    float_path, path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    # QOperator's Gemm would be com.microsoft's QGemm; dynamic: conv.py's ConvInteger needs a constant x_zero_point
    net = (_Mlp() if how == "dynamic" else _SmallNet(head=how == "qdq")).eval()
    shape = (2, 12) if how == "dynamic" else (1, 3, 16, 16)
    example = (torch.randn(*shape),)
    torch.onnx.export(net, example, str(float_path), dynamo=False, opset_version=17, input_names=["x"])
    if how == "dynamic":
        quantize_dynamic(str(float_path), str(path))
    else:
        fmt = QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator
        quantize_static(str(float_path), str(path), _Calibration(), quant_format=fmt, per_channel=True)
    model, feeds = onnx.load(str(path)), {"x": rand(*shape, seed=42)}
    graph, _ = load(model, feeds, fold_passes())
    assert ops <= {n.op_type for n in graph.nodes}
    expected = reference(model, feeds)  # onnxruntime, integer nodes exact: its u8s8 kernels saturate without VNNI
    results, _ = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        # integer arithmetic and the same float ops in the same order: bit-exact (a float Conv between Q and DQ
        # could flip a value within an ulp of a rounding midpoint; none does for this model and input)
        assert np.array_equal(actual[0], expected[0]), (
            f"{how} ({mode}): max diff {np.abs(actual[0] - expected[0]).max()}"
        )
