"""An oracle for integer-accumulating ONNX ops that does not depend on the CPU.

onnxruntime computes ``MatMulInteger``, ``ConvInteger``, ``QLinearMatMul`` and ``QLinearConv`` (and
the ``QGemm`` / ``QLinearConv`` it fuses QDQ graphs into at ``ORT_ENABLE_EXTENDED`` and above) with
MLAS kernels chosen by the CPU's instruction set. Without VNNI (e.g. an AVX2-only AMD EPYC), the
uint8 x int8 kernels add pairs of products into 16-bit lanes with saturation (``vpmaddubsw``):
a 4x64 uint8 x 64x5 int8 ``MatMulInteger`` is wrong in 10-12 of 20 outputs, by up to 2.7e4
(measured on an EPYC and under ``qemu-x86_64 -cpu Haswell``). uint8 x uint8 and int8 x int8 are
exact on both kinds of CPU. So onnxruntime cannot be the oracle for these ops as is.

This module evaluates a model node by node instead: every integer-accumulating node in numpy with
int64 accumulation (exact), every other node by onnxruntime on its own without graph optimizations
(the kernels a whole-graph ``ORT_DISABLE_ALL`` run uses, so float ops stay bitwise onnxruntime's).
The requantization follows the ONNX spec in onnxruntime's float32 order::

    y = saturate(round_half_even(float32(acc) * float32(a_scale * b_scale / y_scale)) + y_zero_point)

``test_exact_oracle.py`` checks on every CPU whose kernels do not saturate that this agrees with
onnxruntime to the bit, so it is onnxruntime's semantics with exact accumulation.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper

INTEGER_OPS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}


def has_integer_ops(model: onnx.ModelProto) -> bool:
    return any(n.op_type in INTEGER_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _i64(a) -> np.ndarray:
    return np.asarray(a).astype(np.int64)


def _zero_point(zp, dtype) -> np.ndarray:
    return np.zeros((), np.int64) if zp is None else _i64(zp)


def matmul_integer(a, b, a_zp=None, b_zp=None) -> np.ndarray:
    """MatMulInteger(A, B, a_zero_point?, b_zero_point?) -> int32; a_zero_point per row (shape [M]),
    b_zero_point per column (shape [N]) or scalars."""
    za, zb = _zero_point(a_zp, a.dtype), _zero_point(b_zp, b.dtype)
    if za.ndim == 1:
        za = za.reshape(-1, 1)
    acc = np.matmul(_i64(a) - za, _i64(b) - zb)
    return acc.astype(np.int32)


def _explicit_pads(spatial, kernel, strides, dilations, pads, auto_pad: str) -> list[tuple[int, int]]:
    nd = len(spatial)
    if auto_pad in ("", "NOTSET"):
        pads = list(pads) if pads else [0] * (2 * nd)
        return [(pads[i], pads[i + nd]) for i in range(nd)]
    if auto_pad == "VALID":
        return [(0, 0)] * nd
    out = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        out.append((total // 2, total - total // 2) if auto_pad == "SAME_UPPER" else (total - total // 2, total // 2))
    return out


def conv_integer(x, w, x_zp=None, w_zp=None, *, auto_pad="NOTSET", dilations=None, group=1, pads=None, strides=None):
    """ConvInteger: ``conv(x - x_zp, w - w_zp)`` in int64 (float64 holds every partial sum of
    8-bit operands exactly, so torch's float64 convolution is exact here), returned as int32.
    ``w_zp`` may be per output channel."""
    nd = w.ndim - 2
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    xs = _i64(x) - _zero_point(x_zp, x.dtype)
    zw = _zero_point(w_zp, w.dtype)
    ws = _i64(w) - (zw.reshape(-1, *[1] * (nd + 1)) if zw.ndim == 1 else zw)
    padding = _explicit_pads(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    flat = [p for pair in reversed(padding) for p in pair]  # F.pad: last axis first
    t = torch.nn.functional.pad(torch.from_numpy(xs.astype(np.float64)), flat)
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nd]
    y = conv(t, torch.from_numpy(ws.astype(np.float64)), stride=strides, dilation=dilations, groups=group)
    acc = y.numpy()
    assert np.abs(acc).max(initial=0) < 2**53
    return np.rint(acc).astype(np.int64).astype(np.int32)


def requantize(acc, a_scale, b_scale, y_scale, y_zp, out_dtype, channel_axis: int | None) -> np.ndarray:
    """``saturate(round(float32(acc) * (a_scale * b_scale / y_scale)) + y_zp)``, multiplier in float32
    in onnxruntime's order (float16 scales widened first); b_scale per tensor or per channel."""
    a, b, y = (np.asarray(s).astype(np.float32) for s in (a_scale, b_scale, y_scale))
    multiplier = (a * b / y).astype(np.float32)
    if multiplier.ndim == 1 and channel_axis is not None:
        shape = [1] * acc.ndim
        shape[channel_axis] = -1
        multiplier = multiplier.reshape(shape)
    value = np.rint(acc.astype(np.float32) * multiplier) + _zero_point(y_zp, out_dtype)
    info = np.iinfo(out_dtype)
    return np.clip(value, info.min, info.max).astype(out_dtype)


def qlinear_matmul(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp) -> np.ndarray:
    acc = matmul_integer(a, b, a_zp, b_zp)
    return requantize(acc, a_s, b_s, y_s, y_zp, np.asarray(y_zp).dtype, channel_axis=-1)


def qlinear_conv(x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias=None, **attrs) -> np.ndarray:
    acc = conv_integer(x, w, x_zp, w_zp, **attrs).astype(np.int64)
    if bias is not None:
        acc = acc + _i64(bias).reshape(-1, *[1] * (acc.ndim - 2))
    return requantize(acc, x_s, w_s, y_s, y_zp, np.asarray(y_zp).dtype, channel_axis=1)


def _exact_node(node: onnx.NodeProto, args: list) -> list[np.ndarray]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    attrs.pop("kernel_shape", None)
    args = args + [None] * (9 - len(args))
    if node.op_type == "MatMulInteger":
        return [matmul_integer(*args[:4])]
    if node.op_type == "ConvInteger":
        return [conv_integer(*args[:4], **attrs)]
    if node.op_type == "QLinearMatMul":
        return [qlinear_matmul(*args[:8])]
    return [qlinear_conv(*args[:9], **attrs)]


def _ort_node(node: onnx.NodeProto, args: list, opsets) -> list[np.ndarray]:
    names, inputs, feeds = [], [], {}
    for k, a in enumerate(args):
        if a is None:
            names.append("")
            continue
        name = f"i{k}"
        names.append(name)
        feeds[name] = a
        inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    outs = [f"o{j}" if o else "" for j, o in enumerate(node.output)]
    single = helper.make_node(node.op_type, names, outs, domain=node.domain)
    single.attribute.extend(node.attribute)
    graph = helper.make_graph([single], "node", inputs, [onnx.ValueInfoProto(name=o) for o in outs if o])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 9)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    res = iter(sess.run(None, feeds))
    return [next(res) if o else None for o in outs]


def evaluate(model: onnx.ModelProto, feeds: dict[str, np.ndarray], mixed: list | None = None) -> list[np.ndarray]:
    """The graph's outputs, integer-accumulating nodes exact (see the module docstring). ``mixed``,
    when given, receives the integer nodes that multiply uint8 by int8 (the kernels that saturate)."""
    if any(a.type == onnx.AttributeProto.GRAPH for n in model.graph.node for a in n.attribute):
        raise NotImplementedError("control flow (If/Loop/Scan) is not evaluated node by node")
    values: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values.update(feeds)
    for node in model.graph.node:
        args = [values[i] if i else None for i in node.input]
        if node.op_type in INTEGER_OPS and node.domain in ("", "ai.onnx"):
            outs = _exact_node(node, args)
            second = args[3 if node.op_type.startswith("QLinear") else 1]
            if mixed is not None and (args[0].dtype, second.dtype) == (np.uint8, np.int8):
                mixed.append(f"{node.op_type} {node.name or node.output[0]}")
        else:
            outs = _ort_node(node, args, model.opset_import)
        values.update({name: v for name, v in zip(node.output, outs) if name})
    return [values[o.name] for o in model.graph.output]


def onnxruntime_saturates() -> tuple[bool, str]:
    """Whether this CPU's onnxruntime uint8 x int8 kernels saturate: the measured 4x64 x 64x5
    ``MatMulInteger`` against int64 math. Returns (saturates, a one-line measurement)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (4, 64)).astype(np.uint8)
    b = rng.integers(-128, 128, (64, 5)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node],
        "probe",
        [
            helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [4, 64]),
            helper.make_tensor_value_info("b", onnx.TensorProto.INT8, [64, 5]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, [4, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = min(model.ir_version, 9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"a": a, "b": b})[0]
    exact = matmul_integer(a, b)
    wrong = int((got != exact).sum())
    worst = int(np.abs(got.astype(np.int64) - exact).max())
    note = f"onnxruntime {ort.__version__} uint8 x int8 MatMulInteger (4x64 x 64x5): {wrong} of 20 outputs wrong"
    return wrong > 0, note + (f", by up to {worst} (16-bit saturation: no VNNI)" if wrong else "")
