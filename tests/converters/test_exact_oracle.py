"""The exact integer oracle (exact.py) checked twice: against naive Python integer loops on every
CPU, and against onnxruntime to the bit where onnxruntime's uint8 x int8 kernels do not saturate
(skipped, with the measurement as the reason, where they do: CPUs without VNNI)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from converters import exact
from converters.helpers import const, make_model, x

U8, S8 = np.uint8, np.int8


def _ints(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def _naive_matmul(a, b, za, zb):
    m, k = a.shape
    n = b.shape[1]
    return [[sum((int(a[i, t]) - za) * (int(b[t, j]) - zb) for t in range(k)) for j in range(n)] for i in range(m)]


def _naive_conv2d(xs, ws, zx, zw, pad, stride):
    """One image, group 1, symmetric padding: the textbook sum, in Python ints."""
    c, h, w = xs.shape
    o, _, kh, kw = ws.shape
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    out = np.zeros((o, oh, ow), np.int64)
    for co in range(o):
        for i in range(oh):
            for j in range(ow):
                total = 0
                for ci in range(c):
                    for u in range(kh):
                        for v in range(kw):
                            r, s = i * stride + u - pad, j * stride + v - pad
                            if 0 <= r < h and 0 <= s < w:
                                total += (int(xs[ci, r, s]) - zx) * (int(ws[co, ci, u, v]) - zw)
                out[co, i, j] = total
    return out


@pytest.mark.parametrize("a_type, b_type", [(U8, S8), (U8, U8), (S8, S8), (S8, U8)])
def test_matmul_integer_against_python_ints(a_type, b_type):
    a, b = _ints((4, 64), a_type, 0), _ints((64, 5), b_type, 1)
    za, zb = 7, -3 if b_type == S8 else 200
    got = exact.matmul_integer(a, b, np.array(za, a_type), np.array(zb, b_type))
    assert got.tolist() == _naive_matmul(a, b, za, zb)


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 0)])
def test_conv_integer_against_python_ints(stride, pad):
    xs, ws = _ints((1, 3, 6, 5), U8, 2), _ints((4, 3, 3, 3), S8, 3)
    got = exact.conv_integer(xs, ws, np.uint8(9), np.int8(-2), pads=[pad] * 4, strides=[stride] * 2)
    assert np.array_equal(got[0], _naive_conv2d(xs[0], ws[0:4], 9, -2, pad, stride))


def test_requantize_rounds_half_to_even_and_saturates():
    acc = np.array([1, 3, 5, -1, 1000, -1000], np.int64)  # times 0.5: 0.5, 1.5, 2.5, -0.5, 500, -500
    y = exact.requantize(acc, np.float32(0.5), np.float32(1.0), np.float32(1.0), np.uint8(0), np.uint8, None)
    assert y.tolist() == [0, 2, 2, 0, 255, 0]


ORACLE_CASES = {
    "matmul_u8s8": ("MatMulInteger", [x(data=_ints((4, 64), U8, 0)), const(_ints((64, 5), S8, 1))], {}),
    "matmul_u8u8": ("MatMulInteger", [x(data=_ints((4, 64), U8, 0)), const(_ints((64, 5), U8, 1))], {}),
    "matmul_s8s8": ("MatMulInteger", [x(data=_ints((4, 64), S8, 0)), const(_ints((64, 5), S8, 1))], {}),
    "conv_u8s8": (
        "ConvInteger",
        [x(data=_ints((1, 32, 6, 6), U8, 4)), const(_ints((8, 32, 3, 3), S8, 5))],
        {"pads": [1, 1, 1, 1]},
    ),
    "qlinear_conv_u8s8": (
        "QLinearConv",
        [
            x(data=_ints((1, 16, 5, 5), U8, 6)),
            const(np.float32(0.05)),
            const(np.uint8(10)),
            const(_ints((6, 16, 3, 3), S8, 7)),
            const(np.float32(0.01)),
            const(np.int8(0)),
            const(np.float32(0.35)),
            const(np.uint8(120)),
        ],
        {"strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
}


@pytest.mark.parametrize("case", list(ORACLE_CASES))
def test_exact_oracle_is_onnxruntimes_semantics(case):
    """Where the kernels do not saturate, onnxruntime and the exact oracle agree to the bit: the
    requantization order and rounding are onnxruntime's. uint8 x int8 cannot be decided on a CPU
    whose kernels saturate; the other pairings are exact on every CPU and always decided."""
    op, inputs, attrs = ORACLE_CASES[case]
    saturates, note = exact.onnxruntime_saturates()
    if saturates and "u8s8" in case:
        pytest.skip(f"undecidable on this CPU: {note}")
    model, feeds = make_model(op, inputs, attrs, opset=10)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = exact.evaluate(model, feeds)
    assert got[0].dtype == want[0].dtype and np.array_equal(got[0], want[0]), (
        f"{case}: {int((got[0] != want[0]).sum())} of {want[0].size} differ"
    )
