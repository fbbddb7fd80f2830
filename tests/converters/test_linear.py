"""Gemm (nn.Dense) and MatMul against onnxruntime."""

from __future__ import annotations

import pytest
from converters.helpers import batchnorm, check_model, check_op, check_unsupported, const, rand, x
from converters.test_conv import act_nodes
from onnx import TensorProto, helper, numpy_helper

from torch2ms.passes import MatMulToLinear, fold_passes, rebuild_passes


def _gemm_inputs(m, k, n, trans_a, trans_b, c_shape):
    a = x(*((k, m) if trans_a else (m, k)))
    b = const(rand(*((n, k) if trans_b else (k, n)), seed=5))
    return [a, b] + ([const(rand(*c_shape, seed=6))] if c_shape is not None else [])


@pytest.mark.parametrize("c_shape", [(5,), (1, 5), (1,), (), None], ids=["C_vec", "C_row", "C_one", "C_scalar", "no_C"])
@pytest.mark.parametrize(
    "trans_a, trans_b", [(0, 1), (0, 0), (1, 0), (1, 1)], ids=["transB", "plain", "transA", "transAB"]
)
def test_gemm(trans_a, trans_b, c_shape, tmp_path):
    inputs = _gemm_inputs(3, 4, 5, trans_a, trans_b, c_shape)
    check_op("Gemm", inputs, {"transA": trans_a, "transB": trans_b}, tmp_path)


@pytest.mark.parametrize("alpha, beta", [(0.5, 1.0), (1.0, 2.0), (0.25, 0.0)])
def test_gemm_alpha_beta(alpha, beta, tmp_path):
    check_op("Gemm", _gemm_inputs(3, 4, 5, 0, 1, (5,)), {"alpha": alpha, "beta": beta, "transB": 1}, tmp_path)


def test_gemm_refuses_a_per_row_bias():
    """C of shape (M, 1) adds one value per row, not per output feature: nn.Dense cannot."""
    check_unsupported("Gemm", _gemm_inputs(4, 3, 4, 0, 1, (4, 1)), {"transB": 1}, "C")


def test_gemm_refuses_runtime_weight():
    check_unsupported("Gemm", [x(3, 4), x(4, 5)], {}, "B")


@pytest.mark.parametrize(
    "a_shape, b_shape, const_b",
    [
        ((3, 4), (4, 5), False),
        ((3, 4), (4, 5), True),
        ((2, 3, 4), (2, 4, 5), False),
        ((2, 3, 4), (4, 5), True),
        ((5, 1, 4), (4, 6), True),
        ((2, 3, 3, 4), (4, 5), False),
        ((2, 2, 3, 4), (2, 2, 4, 3), False),
        ((2, 2, 3, 4), (1, 2, 4, 3), False),
        ((2, 1, 3, 4), (2, 4, 6), False),
        ((4,), (4, 5), False),
        ((2, 3, 4), (4,), False),
    ],
    ids=[
        "2d",
        "2d_const",
        "3d",
        "3d_x_2d_const",
        "seq_x_weight",
        "4d_x_2d",
        "4d",
        "4d_broadcast",
        "4d_x_3d",
        "1d_lhs",
        "1d_rhs",
    ],
)
def test_matmul(a_shape, b_shape, const_b, tmp_path):
    b = const(rand(*b_shape, seed=3)) if const_b else x(*b_shape, seed=3)
    check_op("MatMul", [x(*a_shape), b], {}, tmp_path)


def test_matmul_sequence_by_weight_is_one_2d_matmul(tmp_path):
    """(S, 1, K) x (K, N) must not broadcast the weight to (S, K, N) (MindSpore GRAPH_MODE does that
    for ops.matmul: ViT-B/16's compile reached 18 GB): a 2-D matmul between reshapes."""
    source = check_op("MatMul", [x(7, 1, 4), const(rand(4, 6, seed=3))], {}, tmp_path)
    body = [line.strip() for line in source.splitlines() if "ops.matmul(" in line]
    assert (
        len(body) == 1
        and "ops.reshape(ops.matmul(ops.reshape(" in body[0]
        and "(7, 4)" in body[0]
        and "(7, 1, 6)" in body[0]
    ), body


def matmul_add_model(x_shape, k, n, bias_shape, bias_first=False, extra_consumer=False):
    """What the exporter writes for nn.Linear on a rank > 2 tensor: MatMul(x, W^T) then Add(b)."""
    inits = [numpy_helper.from_array(rand(k, n, seed=3), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="/encoder/mlp/mlp.0/MatMul")]
    outputs = ["y"]
    if bias_shape is None:
        nodes[0].output[0] = "y"
    else:
        inits.append(numpy_helper.from_array(rand(*bias_shape, seed=4), "b"))
        nodes.append(
            helper.make_node("Add", ["b", "mm"] if bias_first else ["mm", "b"], ["y"], name="/encoder/mlp/mlp.0/Add")
        )
    if extra_consumer:
        nodes.append(helper.make_node("Relu", ["mm"], ["r"], name="/other/Relu"))
        outputs.append("r")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, {"x": rand(*x_shape, seed=1)}


@pytest.mark.parametrize(
    "x_shape, bias_shape, bias_first",
    [
        ((1, 7, 7, 6), (5,), False),
        ((9, 1, 6), (5,), True),
        ((4, 6), (5,), False),
        ((2, 3, 6), (1, 1, 5), False),
        ((2, 3, 6), None, False),
    ],
    ids=["4d", "seq_bias_first", "2d", "bias_row", "no_bias"],
)
def test_matmul_add_becomes_one_dense(x_shape, bias_shape, bias_first, tmp_path):
    model, feeds = matmul_add_model(x_shape, 6, 5, bias_shape, bias_first)
    source, fired = check_model(model, feeds, tmp_path, passes=[MatMulToLinear()], expect_nodes=["Linear"])
    assert fired == {"matmul_to_linear": 1}
    assert "self.encoder_mlp_0 = nn.Dense(6, 5" in source, source
    assert ("has_bias=False" in source) == (bias_shape is None)
    assert "ops.matmul" not in source and "const_" not in source


def test_matmul_with_a_second_consumer_keeps_the_add(tmp_path):
    """The MatMul output is used elsewhere: the Dense has no bias and the Add stays."""
    model, feeds = matmul_add_model((2, 3, 6), 6, 5, (5,), extra_consumer=True)
    source, fired = check_model(
        model, feeds, tmp_path, passes=[MatMulToLinear()], expect_nodes=["Linear", "Add", "Relu"]
    )
    assert "nn.Dense(6, 5, has_bias=False)" in source


def test_matmul_by_a_runtime_matrix_is_not_a_layer(tmp_path):
    source = check_op("MatMul", [x(2, 3, 4), x(4, 5, seed=3)], {}, tmp_path, passes=[MatMulToLinear()])
    assert "nn.Dense" not in source


# --- the fused Linear (FuseDenseBnAct: Gemm / Linear [+ BatchNorm1d] [+ activation]) ---


def dense_model(act, *, layer="Gemm", bn=False, x_shape=(3, 6), n=5, gemm_attrs=None, side=False, opset=17):
    """A Gemm (nn.Linear on (N, K)) or MatMul + Add (nn.Linear on a sequence), then BatchNorm and
    ``act`` (an op, or a formula as the exporter writes it; see test_conv.act_nodes)."""
    k = x_shape[-1]
    gemm_attrs = {"transB": 1} if gemm_attrs is None else gemm_attrs
    w_shape = (n, k) if gemm_attrs.get("transB") else (k, n)
    inits = [numpy_helper.from_array(rand(*(w_shape if layer == "Gemm" else (k, n)), seed=3), "w")]
    inits.append(numpy_helper.from_array(rand(n, seed=4), "b"))
    if layer == "Gemm":
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="/fc/Gemm", **gemm_attrs)]
    else:
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["mm"], name="/mlp/fc1/MatMul"),
            helper.make_node("Add", ["mm", "b"], ["h"], name="/mlp/fc1/Add"),
        ]
    last = "h"
    if bn:
        node, bn_inits = batchnorm("h", "bn", n, "/bn/BatchNormalization")
        nodes.append(node)
        inits += bn_inits
        last = "bn"
    outputs = ["y"]
    if act:
        more, more_inits = act_nodes(act, last, "y", n)
        if act.startswith("PRelu"):  # one slope per output feature, broadcast along the last axis
            more_inits = [numpy_helper.from_array(rand(n, seed=9, low=0.05, high=0.5), "y_slope")]
        nodes += more
        inits += more_inits
    else:
        nodes[-1].output[0] = "y"
    if side:
        nodes.append(helper.make_node("Sigmoid", [last], ["z"], name="/side/Sigmoid"))
        outputs.append("z")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model, {"x": rand(*x_shape, seed=1, low=-3, high=3)}


# name: (activation, dense_model keywords, the layer's spelling in network.py before folding)
DENSE_CASES = {
    "gemm_relu": ("Relu", {}, 'nn.Dense(6, 5, activation="relu")'),
    "gemm_plain_alpha_beta_sigmoid": (
        "Sigmoid",
        {"gemm_attrs": {"alpha": 0.5, "beta": 2.0}},
        'nn.Dense(6, 5, activation="sigmoid")',
    ),
    "gemm_bn_relu": ("Relu", {"bn": True}, 'nn.DenseBnAct(6, 5, has_bn=True, activation="relu")'),
    "gemm_bn": (None, {"bn": True}, "nn.DenseBnAct(6, 5, has_bn=True)"),
    "gemm_hardswish": ("HardSwish", {}, 'nn.Dense(6, 5, activation="hswish")'),
    "gemm_silu": ("silu", {}, 'nn.Dense(6, 5, activation="silu")'),
    "gemm_mish": ("mish", {}, 'nn.Dense(6, 5, activation="mish")'),
    "gemm_leaky": ("LeakyRelu", {}, "nn.Dense(6, 5, activation=nn.LeakyReLU(0.1))"),
    "gemm_bn_leaky": ("LeakyRelu", {"bn": True}, 'nn.DenseBnAct(6, 5, has_bn=True, activation="leakyrelu", alpha=0.1)'),
    "gemm_prelu": ("PRelu", {}, "nn.Dense(6, 5, activation=nn.PReLU(5))"),
    "seq_gelu": (
        "gelu",
        {"layer": "MatMul", "x_shape": (2, 7, 6)},
        "nn.Dense(6, 5, activation=nn.GELU(approximate=False))",
    ),
    "seq_gelu_tanh": ("gelu_tanh", {"layer": "MatMul", "x_shape": (7, 6)}, 'nn.Dense(6, 5, activation="gelu")'),
    "seq_prelu": ("PRelu", {"layer": "MatMul", "x_shape": (2, 3, 6)}, "nn.Dense(6, 5, activation=nn.PReLU(5))"),
    "seq_relu6": ("Clip", {"layer": "MatMul", "x_shape": (1, 4, 4, 6)}, 'nn.Dense(6, 5, activation="relu6")'),
}


@pytest.mark.parametrize("fold", [False, True], ids=["bn", "folded"])
@pytest.mark.parametrize("name", list(DENSE_CASES))
def test_dense_bn_act(name, fold, tmp_path):
    act, kw, spelled = DENSE_CASES[name]
    model, feeds = dense_model(act, **kw)
    passes = fold_passes() if fold else rebuild_passes()
    source, fired = check_model(model, feeds, tmp_path, passes=passes, rel_tol=2e-5, expect_nodes=["Linear"])
    assert fired["fuse_dense_bn_act"] == 1
    assert fired.get("fold_batchnorm", 0) == int(fold and kw.get("bn", False))
    init = " ".join(source[source.index("def __init__") : source.index("def construct")].split())
    if fold:  # BatchNorm folded into the weights: a plain nn.Dense with the same activation
        spelled = spelled.replace("nn.DenseBnAct(", "nn.Dense(").replace("has_bn=True, ", "").replace("has_bn=True", "")
        spelled = spelled.replace('activation="leakyrelu", alpha=0.1', "activation=nn.LeakyReLU(0.1)")
        spelled = spelled.replace("nn.Dense(6, 5, )", "nn.Dense(6, 5)")
    assert spelled in init, init
    assert "BatchNorm" not in init and "ops.sigmoid(" not in source and "ops.erf(" not in source


@pytest.mark.parametrize(
    "kw, left",
    [
        ({"side": True}, ["Gemm", "Relu", "Sigmoid"]),  # the Gemm output is also used by Sigmoid
        ({"bn": True, "x_shape": (2, 5, 6), "layer": "MatMul"}, ["Linear", "BatchNormalization", "Relu"]),
    ],
    ids=["output_used_twice", "bn_on_a_sequence"],
)
def test_dense_must_not_fuse(kw, left, tmp_path):
    """BatchNorm1d on (N, C, L) normalizes axis 1, not a Dense layer's features: it stays, and so
    does the activation after it."""
    model, feeds = dense_model("Relu", **kw)
    source, fired = check_model(model, feeds, tmp_path, passes=fold_passes(), rel_tol=2e-5, expect_nodes=left)
    assert fired["fuse_dense_bn_act"] == 0
