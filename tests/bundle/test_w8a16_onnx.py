"""The W8A16 rewrite of an ONNX model (``bundle.w8a16_onnx``), checked on onnxruntime.

A hand-built graph reads weights in every way the rewrite knows (a MatMul's B as W^T, a Gemm's B
as W with ``transB=1``, an axis-0 Gather's table) and in ways it must leave alone (a weight of a
layer kept float, one that an Add also reads). The rewritten model must compute, on onnxruntime,
what numpy computes with the int8-rounded weights of the chosen layers and the float ones of the
others, and hold INT8 initializers exactly for the chosen layers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from torch2ms.bundle.w8a16_cell import fake_quantized, quantize_rows
from torch2ms.bundle.w8a16_onnx import quantize_onnx

RNG = np.random.default_rng(7)
W_MATMUL = RNG.normal(size=(6, 8)).astype(np.float32)  # [out, in], read as W^T
W_GEMM = RNG.normal(size=(5, 6)).astype(np.float32)  # [out, in], read as W with transB=1
TABLE = RNG.normal(size=(10, 8)).astype(np.float32)  # [vocab, hidden]
W_FLOAT = RNG.normal(size=(5, 5)).astype(np.float32)  # a layer the plan keeps float
W_SHARED = RNG.normal(size=(5, 5)).astype(np.float32)  # an int8 layer's weight that an Add also reads


def _model(path):
    inits = {
        "table": TABLE,
        "w_matmul_t": W_MATMUL.T.copy(),
        "w_gemm": W_GEMM,
        "w_float_t": W_FLOAT.T.copy(),
        "w_shared_t": W_SHARED.T.copy(),
    }
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["h"], axis=0),
        helper.make_node("MatMul", ["h", "w_matmul_t"], ["a"]),
        helper.make_node("Gemm", ["a", "w_gemm"], ["b"], transB=1),
        helper.make_node("MatMul", ["b", "w_float_t"], ["c"]),
        helper.make_node("MatMul", ["c", "w_shared_t"], ["d"]),
        helper.make_node("Add", ["d", "w_shared_t"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "w8a16",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(path))


def _numpy(ids, table, w_matmul, w_gemm, w_float, w_shared):
    d = table[ids] @ w_matmul.T @ w_gemm.T @ w_float.T @ w_shared.T
    return d + W_SHARED.T


def test_the_int8_layers_become_int8_initializers_and_compute_their_rounded_weights(tmp_path):
    src, dest = tmp_path / "model.onnx", tmp_path / "w8a16.onnx"
    _model(src)
    weights = {
        "embed": ("table", TABLE),
        "proj": ("dense", W_MATMUL),
        "fc": ("dense", W_GEMM),
        "shared": ("dense", W_SHARED),
    }
    figures = quantize_onnx(src, dest, weights)
    assert figures["layers"] == {"embed": "table", "proj": "w_matmul_t", "fc": "w_gemm"}
    model = onnx.load(str(dest))
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert {n for n, t in types.items() if t == TensorProto.INT8} == {
        f"{n}_w8a16_int8" for n in ("table", "w_matmul_t", "w_gemm")
    }
    assert types["w_float_t"] == types["w_shared_t"] == TensorProto.FLOAT
    assert figures["int8_bytes"] < 0.3 * figures["float_bytes"] + 4 * (10 + 6 + 5)

    ids = np.array([3, 0, 9, 3, 7], dtype=np.int64)
    got = ort.InferenceSession(str(dest), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    rounded = _numpy(ids, fake_quantized(TABLE), fake_quantized(W_MATMUL), fake_quantized(W_GEMM), W_FLOAT, W_SHARED)
    np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-5)
    float_out = _numpy(ids, TABLE, W_MATMUL, W_GEMM, W_FLOAT, W_SHARED)
    assert np.abs(got - float_out).max() > 10 * np.abs(got - rounded).max()  # the rounding is really there


def test_the_int8_values_are_the_mindir_layers_rows_transposed(tmp_path):
    """A MatMul's W^T holds W's per-row int8 values and scales, transposed: what Int8Dense stores."""
    src, dest = tmp_path / "model.onnx", tmp_path / "w8a16.onnx"
    _model(src)
    quantize_onnx(src, dest, {"proj": ("dense", W_MATMUL)})
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(dest)).graph.initializer}
    q, scale = quantize_rows(W_MATMUL)
    np.testing.assert_array_equal(inits["w_matmul_t_w8a16_int8"], q.T)
    np.testing.assert_array_equal(inits["w_matmul_t_w8a16_scale"], scale.T)
