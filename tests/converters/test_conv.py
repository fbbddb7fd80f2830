"""Conv (nn.Conv1d/2d/3d) and the fused torch2ms.ConvBnAct (nn.Conv2dBnAct, the generated
Conv3dBnAct) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from converters.helpers import batchnorm, check_model, check_op, check_unsupported, const, load, rand, x
from onnx import TensorProto, helper, numpy_helper

from torch2ms.converters.registry import analyse
from torch2ms.passes import FoldBatchNorm, FoldConvAffine, fold_passes, rebuild_passes

# (input shape, out channels, attrs): kernels, strides, dilations, groups, pads as in the zoo and past it
CONV_CASES = {
    "1x1": ((1, 4, 6, 6), 5, {}),
    "3x3_pad1": ((1, 3, 8, 8), 4, {"pads": [1, 1, 1, 1]}),
    "3x3_s2": ((1, 3, 9, 9), 4, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "5x5_pad2": ((1, 2, 9, 9), 3, {"pads": [2, 2, 2, 2]}),
    "7x7_s2_pad3": ((1, 3, 16, 16), 4, {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    "1x7": ((1, 4, 9, 9), 4, {"pads": [0, 3, 0, 3]}),
    "7x1": ((1, 4, 9, 9), 4, {"pads": [3, 0, 3, 0]}),
    "1x3_3x1_strides": ((1, 2, 9, 10), 3, {"kernel_shape": [1, 3], "strides": [2, 1]}),
    "4x4_s4_patchify": ((1, 3, 16, 16), 6, {"strides": [4, 4]}),
    "dil2": ((1, 3, 12, 12), 4, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "dil4": ((1, 3, 14, 14), 4, {"pads": [4, 4, 4, 4], "dilations": [4, 4]}),
    "dil_2x1": ((1, 3, 12, 12), 4, {"pads": [2, 1, 2, 1], "dilations": [2, 1]}),
    "group2": ((1, 4, 8, 8), 6, {"pads": [1, 1, 1, 1], "group": 2}),
    "depthwise": ((1, 4, 8, 8), 4, {"pads": [1, 1, 1, 1], "group": 4}),
    "depthwise_x2_s2": ((1, 4, 9, 9), 8, {"pads": [1, 1, 1, 1], "group": 4, "strides": [2, 2]}),
    "depthwise_dil2": ((1, 4, 10, 10), 4, {"pads": [2, 2, 2, 2], "group": 4, "dilations": [2, 2]}),
    "asym_pads": ((1, 3, 8, 8), 4, {"pads": [0, 1, 2, 3]}),
    "asym_pads_s2": ((1, 3, 9, 8), 4, {"pads": [1, 0, 0, 1], "strides": [2, 2]}),
    "same_upper_s2": ((1, 3, 8, 8), 4, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower_s2": ((1, 3, 8, 8), 4, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "same_upper_4x4": ((1, 3, 7, 7), 4, {"auto_pad": "SAME_UPPER", "kernel_shape": [4, 4]}),
    "same_lower_4x4_s3": ((1, 3, 10, 10), 4, {"auto_pad": "SAME_LOWER", "kernel_shape": [4, 4], "strides": [3, 3]}),
    "valid": ((1, 3, 8, 8), 4, {"auto_pad": "VALID", "strides": [2, 2]}),
}

_KERNELS = {
    "1x1": (1, 1),
    "5x5_pad2": (5, 5),
    "7x7_s2_pad3": (7, 7),
    "1x7": (1, 7),
    "7x1": (7, 1),
    "1x3_3x1_strides": (1, 3),
    "4x4_s4_patchify": (4, 4),
    "same_upper_4x4": (4, 4),
    "same_lower_4x4_s3": (4, 4),
    "dil_2x1": (3, 3),
}


def _weight(name: str, shape, out_ch: int, attrs: dict) -> np.ndarray:
    kh, kw = _KERNELS.get(name, (3, 3))
    return rand(out_ch, shape[1] // attrs.get("group", 1), kh, kw, seed=1, low=-0.5, high=0.5)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv(name, bias, tmp_path):
    shape, out_ch, attrs = CONV_CASES[name]
    inputs = [x(*shape), const(_weight(name, shape, out_ch, attrs))]
    if bias:
        inputs.append(const(rand(out_ch, seed=2)))
    check_op("Conv", inputs, attrs, tmp_path)


def test_conv_opset11(tmp_path):
    check_op(
        "Conv", [x(1, 3, 8, 8), const(rand(4, 3, 3, 3)), const(rand(4))], {"pads": [1, 1, 1, 1]}, tmp_path, opset=11
    )


@pytest.mark.parametrize("shape", [(1, 3, 8), (1, 3, 4, 4, 4)], ids=["1d", "3d"])
def test_conv_dynamic_weight_refused(shape):
    """A weight computed at run time (any rank)."""
    check_unsupported("Conv", [x(*shape), x(4, 3, *[3] * (len(shape) - 2))], {}, "weight")


# (input shape, out channels, kernel, attrs) for nn.Conv1d: odd lengths, asymmetric pads as ops.pad
CONV1D_CASES = {
    "k3": ((2, 3, 9), 4, 3, {}),
    "k3_pad1": ((1, 3, 8), 5, 3, {"pads": [1, 1]}),
    "k5_s2_pad2": ((1, 4, 11), 4, 5, {"pads": [2, 2], "strides": [2]}),
    "asym_pads": ((1, 3, 7), 4, 3, {"pads": [0, 2]}),
    "asym_pads_s3": ((1, 3, 10), 4, 4, {"pads": [2, 1], "strides": [3]}),
    "dil2": ((1, 3, 12), 4, 3, {"pads": [2, 2], "dilations": [2]}),
    "group2": ((1, 4, 9), 6, 3, {"pads": [1, 1], "group": 2}),
    "depthwise_s2": ((1, 4, 9), 4, 3, {"pads": [1, 1], "group": 4, "strides": [2]}),
    "same_upper_s2": ((1, 3, 8), 4, 4, {"auto_pad": "SAME_UPPER", "strides": [2]}),
    "same_lower": ((1, 3, 7), 4, 4, {"auto_pad": "SAME_LOWER"}),
    "valid": ((1, 3, 9), 4, 3, {"auto_pad": "VALID", "strides": [2]}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CONV1D_CASES))
def test_conv1d(name, bias, tmp_path):
    shape, out_ch, k, attrs = CONV1D_CASES[name]
    w = rand(out_ch, shape[1] // attrs.get("group", 1), k, seed=1, low=-0.5, high=0.5)
    inputs = [x(*shape), const(w)] + ([const(rand(out_ch, seed=2))] if bias else [])
    check_op("Conv", inputs, attrs, tmp_path)


# (input shape, out channels, kernel, attrs) for nn.Conv3d
CONV3D_CASES = {
    "k3": ((1, 3, 5, 6, 7), 4, (3, 3, 3), {}),
    "k3_pad1": ((2, 2, 5, 5, 5), 3, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    "k1x3x3_s2": ((1, 3, 4, 7, 9), 4, (1, 3, 3), {"pads": [0, 1, 1, 0, 1, 1], "strides": [1, 2, 2]}),
    "asym_pads": ((1, 3, 5, 6, 5), 2, (3, 2, 3), {"pads": [0, 1, 2, 1, 0, 1]}),
    "dil2": ((1, 2, 7, 7, 6), 3, (3, 3, 3), {"pads": [2, 2, 2, 2, 2, 2], "dilations": [2, 2, 2]}),
    "dil_mixed": ((1, 2, 7, 7, 6), 3, (3, 3, 3), {"dilations": [1, 2, 1]}),
    "group2": ((1, 4, 5, 5, 5), 6, (3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "group": 2}),
    "same_upper_s2": ((1, 2, 5, 6, 7), 3, (2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    "same_lower": ((1, 2, 5, 6, 7), 3, (2, 2, 2), {"auto_pad": "SAME_LOWER"}),
    "valid_s_mixed": ((1, 2, 6, 7, 8), 3, (3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2, 3]}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", list(CONV3D_CASES))
def test_conv3d(name, bias, tmp_path):
    shape, out_ch, k, attrs = CONV3D_CASES[name]
    w = rand(out_ch, shape[1] // attrs.get("group", 1), *k, seed=1, low=-0.5, high=0.5)
    inputs = [x(*shape), const(w)] + ([const(rand(out_ch, seed=2))] if bias else [])
    check_op("Conv", inputs, attrs, tmp_path)


# --- the fused ConvBnAct (made by FuseConvBnAct from Conv -> [BatchNormalization] -> activation) ---

_SIXTH = 1 / 6


def act_nodes(act: str, src: str, dst: str, channels: int, spatial: int = 2) -> tuple[list, list]:
    """ONNX nodes computing activation ``act`` of ``src`` into ``dst``, and their initializers: one
    op, or the formula the exporter writes (``silu``, ``gelu``, ``gelu_tanh``, ``mish``,
    ``hardswish_op13``), which the formula passes make one node before the fusion."""

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32), f"{dst}_{name}")

    n = f"/block/act/{act}"
    single = {
        "Relu": {},
        "Sigmoid": {},
        "Tanh": {},
        "HardSwish": {},
        "Elu": {"alpha": 1.0},
        "LeakyRelu": {"alpha": 0.1},
        "LeakyRelu_default": {},
        "HardSigmoid": {"alpha": _SIXTH, "beta": 0.5},
        "Gelu": {},
        "Gelu_tanh": {"approximate": "tanh"},
    }
    if act in single:
        return [helper.make_node(act.split("_")[0], [src], [dst], name=n, **single[act])], []
    if act == "Clip":
        inits = [c("lo", 0.0), c("hi", 6.0)]
        return [helper.make_node("Clip", [src, f"{dst}_lo", f"{dst}_hi"], [dst], name=n)], inits
    if act == "PRelu":
        return [helper.make_node("PRelu", [src, f"{dst}_slope"], [dst], name=n)], [
            c("slope", rand(channels, *[1] * spatial, seed=9, low=0.05, high=0.5))
        ]
    if act == "PRelu_shared":
        return [helper.make_node("PRelu", [src, f"{dst}_slope"], [dst], name=n)], [c("slope", [0.3])]
    if act == "silu":
        return [
            helper.make_node("Sigmoid", [src], [f"{dst}_s"], name=n + "/Sigmoid"),
            helper.make_node("Mul", [src, f"{dst}_s"], [dst], name=n + "/Mul"),
        ], []
    if act == "mish":
        return [
            helper.make_node("Softplus", [src], [f"{dst}_p"], name=n + "/Softplus"),
            helper.make_node("Tanh", [f"{dst}_p"], [f"{dst}_t"], name=n + "/Tanh"),
            helper.make_node("Mul", [src, f"{dst}_t"], [dst], name=n + "/Mul"),
        ], []
    if act == "hardswish_op13":
        return [
            helper.make_node("HardSigmoid", [src], [f"{dst}_h"], name=n + "/HardSigmoid", alpha=_SIXTH),
            helper.make_node("Mul", [src, f"{dst}_h"], [dst], name=n + "/Mul"),
        ], []
    if act == "gelu":
        return [
            helper.make_node("Div", [src, f"{dst}_sqrt2"], [f"{dst}_d"], name=n + "/Div"),
            helper.make_node("Erf", [f"{dst}_d"], [f"{dst}_e"], name=n + "/Erf"),
            helper.make_node("Add", [f"{dst}_e", f"{dst}_one"], [f"{dst}_a"], name=n + "/Add"),
            helper.make_node("Mul", [src, f"{dst}_a"], [f"{dst}_m"], name=n + "/Mul"),
            helper.make_node("Mul", [f"{dst}_m", f"{dst}_half"], [dst], name=n + "/Mul_1"),
        ], [c("sqrt2", np.sqrt(2.0)), c("one", 1.0), c("half", 0.5)]
    if act == "gelu_tanh":
        return [
            helper.make_node("Mul", [src, src], [f"{dst}_x2"], name=n + "/Mul"),
            helper.make_node("Mul", [src, f"{dst}_x2"], [f"{dst}_x3"], name=n + "/Mul_1"),
            helper.make_node("Mul", [f"{dst}_k", f"{dst}_x3"], [f"{dst}_kx3"], name=n + "/Mul_2"),
            helper.make_node("Add", [src, f"{dst}_kx3"], [f"{dst}_p"], name=n + "/Add"),
            helper.make_node("Mul", [f"{dst}_r", f"{dst}_p"], [f"{dst}_rp"], name=n + "/Mul_3"),
            helper.make_node("Tanh", [f"{dst}_rp"], [f"{dst}_t"], name=n + "/Tanh"),
            helper.make_node("Add", [f"{dst}_one", f"{dst}_t"], [f"{dst}_a"], name=n + "/Add_1"),
            helper.make_node("Mul", [src, f"{dst}_a"], [f"{dst}_m"], name=n + "/Mul_4"),
            helper.make_node("Mul", [f"{dst}_half", f"{dst}_m"], [dst], name=n + "/Mul_5"),
        ], [c("k", 0.044715), c("r", np.sqrt(2 / np.pi)), c("one", 1.0), c("half", 0.5)]
    raise ValueError(act)


def conv_bn_act_model(
    act: str | None,
    conv_attrs: dict,
    c_in: int = 4,
    c_out: int = 4,
    bias: bool = False,
    hw: int = 8,
    kernel=(3, 3),
    bn: bool = True,
    opset: int = 17,
    x_range: float = 4.0,
    depth: int | None = None,
) -> tuple[onnx.ModelProto, dict]:
    """x -> Conv [-> BatchNormalization] [-> ``act``]; 3-D (input ``1, c_in, depth, hw, hw``) when
    ``depth`` is given, with a 3-D ``kernel``."""
    spatial = (hw, hw) if depth is None else (depth, hw, hw)
    group = conv_attrs.get("group", 1)
    inits = [numpy_helper.from_array(rand(c_out, c_in // group, *kernel, seed=3, low=-0.5, high=0.5), "w")]
    conv_in = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rand(c_out, seed=4), "b"))
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["c"], name="/block/conv/Conv", **conv_attrs)]
    last = "c"
    if bn:
        node, bn_inits = batchnorm("c", "bn", c_out, "/block/bn/BatchNormalization", epsilon=1e-3, momentum=0.9)
        nodes.append(node)
        inits += bn_inits
        last = "bn"
    if act:
        more_nodes, more_inits = act_nodes(act, last, "y", c_out, len(spatial))
        nodes += more_nodes
        inits += more_inits
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, *spatial])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model, {"x": rand(1, c_in, *spatial, low=-x_range, high=x_range)}


# name: (activation, conv attributes, conv_bn_act_model keywords, nn.Conv2dBnAct's activation argument)
FUSED_CASES = {
    "relu_pad1": ("Relu", {"pads": [1, 1, 1, 1]}, {}, 'activation="relu"'),
    "relu6_s2": ("Clip", {"pads": [1, 1, 1, 1], "strides": [2, 2]}, {}, 'activation="relu6"'),
    "hardswish_depthwise": ("HardSwish", {"pads": [1, 1, 1, 1], "group": 4}, {}, 'activation="hswish"'),
    "sigmoid_bias": ("Sigmoid", {"pads": [1, 1, 1, 1]}, {"bias": True}, 'activation="sigmoid"'),
    "no_act_1x1": (None, {}, {"kernel": (1, 1), "c_out": 6}, None),
    "relu_asym_pads_dil2": ("Relu", {"pads": [1, 2, 2, 1], "dilations": [2, 2]}, {"hw": 9}, 'activation="relu"'),
    "relu_1x7": ("Relu", {"pads": [0, 3, 0, 3]}, {"kernel": (1, 7)}, 'activation="relu"'),
    "silu": ("silu", {"pads": [1, 1, 1, 1]}, {}, 'activation="silu"'),
    "silu_depthwise_s2": ("silu", {"pads": [1, 1, 1, 1], "group": 4, "strides": [2, 2]}, {}, 'activation="silu"'),
    "gelu_erf": ("gelu", {"pads": [1, 1, 1, 1]}, {}, "activation=nn.GELU(approximate=False)"),
    "gelu_tanh": ("gelu_tanh", {}, {"kernel": (1, 1)}, 'activation="gelu"'),
    "gelu_op20": ("Gelu", {}, {"kernel": (1, 1), "opset": 20}, "activation=nn.GELU(approximate=False)"),
    "gelu_tanh_op20": ("Gelu_tanh", {}, {"kernel": (1, 1), "opset": 20}, 'activation="gelu"'),
    "mish": ("mish", {"pads": [1, 1, 1, 1]}, {"bias": True}, 'activation="mish"'),
    "hardsigmoid": ("HardSigmoid", {"pads": [1, 1, 1, 1]}, {}, 'activation="hsigmoid"'),
    "hardswish_op13": ("hardswish_op13", {"pads": [1, 1, 1, 1]}, {"opset": 13}, 'activation="hswish"'),
    "elu": ("Elu", {"pads": [1, 1, 1, 1]}, {}, 'activation="elu"'),
    # MindSpore's CPU Tanh is off by up to 1e-4 for 4 < |x| < 6 (measured; ops.tanh alike): keep |x| small
    "tanh": ("Tanh", {"pads": [1, 1, 1, 1]}, {"x_range": 1.0}, 'activation="tanh"'),
    "leaky_relu": ("LeakyRelu", {"pads": [1, 1, 1, 1]}, {}, 'activation="leakyrelu", alpha=0.1'),
    "leaky_relu_onnx_default": ("LeakyRelu_default", {}, {}, 'activation="leakyrelu", alpha=0.01'),
    "prelu_per_channel": ("PRelu", {"pads": [1, 1, 1, 1]}, {"c_out": 6}, "activation=nn.PReLU(6)"),
    "prelu_shared": ("PRelu_shared", {}, {"kernel": (1, 1)}, "activation=nn.PReLU(4)"),
}


@pytest.mark.parametrize("fold", [False, True], ids=["bn", "folded"])
@pytest.mark.parametrize("name", list(FUSED_CASES))
def test_conv_bn_act(name, fold, tmp_path):
    act, conv_attrs, kw, spelled = FUSED_CASES[name]
    model, feeds = conv_bn_act_model(act, conv_attrs, **kw)
    passes = fold_passes() if fold else rebuild_passes()
    source, fired = check_model(model, feeds, tmp_path, passes=passes, rel_tol=2e-5, expect_nodes=["ConvBnAct"])
    assert fired["fuse_conv_bn_act"] == 1
    assert fired.get("fold_batchnorm", 0) == int(fold)
    init = " ".join(source[source.index("def __init__") : source.index("def construct")].split())
    assert "nn.Conv2dBnAct(" in init
    assert ("has_bn=True" in init) != fold
    assert spelled is None and "activation" not in init or spelled in init, init
    layers = init.count("nn.") - init.count("nn.GELU(") - init.count("nn.PReLU(")
    assert "BatchNormalization" not in source and layers == init.count("nn.Conv2dBnAct("), init


_P1 = [1, 1, 1, 1, 1, 1]
# 3-D: (activation, conv attributes, conv_bn_act_model keywords, Conv3dBnAct's activation argument)
FUSED_3D_CASES = {
    "relu_pad1": ("Relu", {"pads": _P1}, {}, 'activation="relu"'),
    "relu6_1x3x3_s2_bias": (
        "Clip",
        {"pads": [0, 1, 1, 0, 1, 1], "strides": [1, 2, 2]},
        {"kernel": (1, 3, 3), "bias": True},
        'activation="relu6"',
    ),
    "no_act_1x1x1": (None, {}, {"kernel": (1, 1, 1), "c_out": 6}, None),
    "silu_depthwise": ("silu", {"pads": _P1, "group": 4}, {}, 'activation="silu"'),
    "gelu_erf_asym_pads": ("gelu", {"pads": [0, 1, 1, 1, 0, 1]}, {}, "activation=nn.GELU(approximate=False)"),
    "leaky_relu": ("LeakyRelu", {"pads": _P1}, {}, 'activation="leakyrelu", alpha=0.1'),
    "prelu_per_channel": ("PRelu", {"pads": _P1}, {"c_out": 6}, "activation=nn.PReLU(6)"),
}


@pytest.mark.parametrize("fold", [False, True], ids=["bn", "folded"])
@pytest.mark.parametrize("name", list(FUSED_3D_CASES))
def test_conv3d_bn_act(name, fold, tmp_path):
    """Conv3d -> BatchNormalization -> activation: one generated Conv3dBnAct cell (MindSpore has no
    nn.Conv3dBnAct), its BatchNorm an nn.BatchNorm3d, or folded into the conv."""
    act, conv_attrs, kw, spelled = FUSED_3D_CASES[name]
    kw = {"kernel": (3, 3, 3), "depth": 5, "hw": 6, **kw}
    model, feeds = conv_bn_act_model(act, conv_attrs, **kw)
    passes = fold_passes() if fold else rebuild_passes()
    source, fired = check_model(model, feeds, tmp_path, passes=passes, rel_tol=2e-5, expect_nodes=["ConvBnAct"])
    assert fired["fuse_conv_bn_act"] == 1
    assert fired.get("fold_batchnorm", 0) == int(fold)
    assert source.count("class Conv3dBnAct(nn.Cell)") == 1
    net = source[source.index("class Network") :]
    init = " ".join(net[net.index("def __init__") : net.index("def construct")].split())
    assert init.count("Conv3dBnAct(") == 1 and "nn.Conv2dBnAct" not in init, init
    assert ("has_bn=True" in init) != fold
    assert spelled is None and "activation" not in init or spelled in init, init


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv3d_bn_folded_without_fusion(bias, tmp_path):
    """Conv3d -> BatchNormalization folded into one nn.Conv3d (fusion off)."""
    model, feeds = conv_bn_act_model(None, {"pads": _P1}, bias=bias, kernel=(3, 3, 3), depth=4, hw=6)
    source, fired = check_model(model, feeds, tmp_path, passes=[FoldBatchNorm()], rel_tol=2e-5, expect_nodes=["Conv"])
    assert fired == {"fold_batchnorm": 1}
    assert "nn.Conv3d(" in source and "BatchNorm" not in source.split('"""', 2)[2]


@pytest.mark.parametrize("name", [name for name, case in FUSED_CASES.items() if case[0]])
def test_conv_act_without_batchnorm(name, tmp_path):
    """Conv -> activation with no BatchNorm between, for every activation nn.Conv2dBnAct applies:
    nn.Conv2dBnAct(has_bn=False, activation=...)."""
    act, conv_attrs, kw, spelled = FUSED_CASES[name]
    model, feeds = conv_bn_act_model(act, conv_attrs, bn=False, **{**kw, "bias": True})
    source, fired = check_model(model, feeds, tmp_path, passes=fold_passes(), rel_tol=2e-5, expect_nodes=["ConvBnAct"])
    assert fired["fuse_conv_bn_act"] == 1 and fired["fold_batchnorm"] == 0
    init = " ".join(source[source.index("def __init__") : source.index("def construct")].split())
    assert spelled in init and "has_bn" not in init and "has_bias=True" in init, init


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"activation": "Softplus"}, "activation 'Softplus'"),
        ({"activation": "Gelu", "approximate": "x"}, "approximate"),
    ],
    ids=["softplus", "gelu_approximate"],
)
def test_conv_bn_act_refuses(attrs, match, tmp_path):
    """A ConvBnAct node with an activation nn.Conv2dBnAct cannot apply (the pass never makes one)."""
    model, feeds = conv_bn_act_model("Relu", {})
    graph, _ = load(model, feeds, rebuild_passes())
    graph.nodes[0].attrs.update(attrs)
    reasons = [p.reason for p in analyse(graph)]
    assert len(reasons) == 1 and match in reasons[0], reasons


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv_bn_folded_without_fusion(bias, tmp_path):
    """Conv -> BatchNormalization folded into one nn.Conv2d (fusion off)."""
    model, feeds = conv_bn_act_model(None, {"pads": [1, 1, 1, 1]}, bias=bias)
    source, fired = check_model(model, feeds, tmp_path, passes=[FoldBatchNorm()], rel_tol=2e-5, expect_nodes=["Conv"])
    assert fired == {"fold_batchnorm": 1}
    assert "nn.Conv2d(" in source and "BatchNorm" not in source.split('"""', 2)[2]


# --- a per-channel constant Mul / Add / Sub after a Conv (a "frozen" BatchNorm written out) ---


def conv_affine_model(steps, *, rank: int = 2, bias: bool = True, c: int = 4, also_output: bool = False):
    """x -> Conv -> each of ``steps`` -> Relu -> y. A step is (op, constant shape, constant first):
    HF RT-DETR's and torchvision's FrozenBatchNorm2d export as Mul([1, C, 1, 1]) then Add([1, C, 1, 1])."""
    spatial = (7,) * rank
    inits = [numpy_helper.from_array(rand(c, 3, *(3,) * rank, seed=5, low=-0.5, high=0.5), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rand(c, seed=6), "b"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["t0"], name="/conv/Conv")]
    for i, (op, shape, first) in enumerate(steps):
        inits.append(numpy_helper.from_array(rand(*shape, seed=10 + i, low=0.5, high=1.5), f"k{i}"))
        args = [f"k{i}", f"t{i}"] if first else [f"t{i}", f"k{i}"]
        nodes.append(helper.make_node(op, args, [f"t{i + 1}"], name=f"/bn/{op}_{i}"))
    nodes.append(helper.make_node("Relu", [f"t{len(steps)}"], ["y"], name="/act/Relu"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if also_output:
        outputs.append(helper.make_tensor_value_info("t0", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *spatial])], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, {"x": rand(1, 3, *spatial)}


AFFINE_CASES = {
    "frozen_bn": ([("Mul", (1, 4, 1, 1), False), ("Add", (1, 4, 1, 1), False)], {}),
    "frozen_bn_no_conv_bias": ([("Mul", (1, 4, 1, 1), False), ("Add", (1, 4, 1, 1), False)], {"bias": False}),
    "chw_constant_first_then_sub": ([("Mul", (4, 1, 1), True), ("Sub", (1, 4, 1, 1), False)], {}),
    "one_value_for_every_channel": ([("Add", (1, 1, 1, 1), True), ("Mul", (1,), False)], {}),
    # no Conv1dBnAct: the 1-D conv stays a Conv, its Relu apart
    "conv1d": ([("Mul", (1, 4, 1), False), ("Add", (4, 1), False)], {"rank": 1}, ["Conv", "Relu"]),
}


@pytest.mark.parametrize("name", list(AFFINE_CASES))
def test_per_channel_affine_after_a_conv_folds_into_it(name, tmp_path):
    """The fold stage's passes take the Mul / Add / Sub into the conv's weights and bias (in float64),
    leaving one fused conv; the rebuild keeps them, as PyTorch wrote them. Both match onnxruntime.
    (MindSpore's CPU Mul / Add keep 16 bytes per output element for a broadcast operand in
    GRAPH_MODE: RT-DETR's 110 such nodes held 3 GB.)"""
    steps, kw, *nodes = AFFINE_CASES[name]
    model, feeds = conv_affine_model(steps, **kw)
    expect = nodes[0] if nodes else ["ConvBnAct"]
    source, fired = check_model(model, feeds, tmp_path / "fold", passes=fold_passes(), expect_nodes=expect)
    assert fired["fold_conv_affine"] == len(steps)
    _, fired = check_model(model, feeds, tmp_path / "rebuild", passes=rebuild_passes())
    assert "fold_conv_affine" not in fired


@pytest.mark.parametrize(
    "steps, kw, reason",
    [
        ([("Sub", (1, 4, 1, 1), True)], {}, "constant minus the conv"),
        ([("Mul", (1, 1, 1, 5), False)], {}, "is not per output channel"),
        ([("Add", (2, 4, 1, 1), False)], {}, "is not per output channel"),
        ([("Div", (1, 4, 1, 1), False)], {}, None),
        ([("Mul", (1, 4, 1, 1), False)], {"also_output": True}, None),
    ],
    ids=["const_minus_conv", "per_column", "batch_of_constants", "div", "conv_output_also_read"],
)
def test_what_is_not_per_channel_after_a_conv_stays(steps, kw, reason, tmp_path):
    """Not folded: ``c - x``, a constant that broadcasts along another axis (or widens the batch),
    ``Div``, and a conv whose output is read elsewhere too. The network still matches onnxruntime."""
    model, feeds = conv_affine_model(steps, **kw)
    graph, fired = load(model, feeds, fold_passes())
    assert fired["fold_conv_affine"] == 0
    assert steps[0][0] in [n.op_type for n in graph.nodes]
    if reason:
        affine = FoldConvAffine()
        assert affine.apply(load(model, feeds)[0]) == 0
        assert len(affine.skipped) == 1 and reason in affine.skipped[0][1], affine.skipped
    check_model(model, feeds, tmp_path, passes=fold_passes())


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torchvisions_frozen_batchnorm_folds_and_matches_pytorch(dynamo, tmp_path):
    """torchvision's FrozenBatchNorm2d (detection backbones) exports as Conv -> Mul -> Add with either
    exporter; folded, the conv + ReLU is one nn.Conv2dBnAct that matches PyTorch's own output."""
    import io

    import torch
    from converters.helpers import assert_close, convert_and_run
    from torchvision.ops import FrozenBatchNorm2d

    torch.manual_seed(0)
    bn = FrozenBatchNorm2d(8)
    for name in ("weight", "bias", "running_mean"):
        getattr(bn, name).uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), bn, torch.nn.ReLU()).eval()
    feed = rand(1, 3, 12, 12, seed=7)
    buf = io.BytesIO()
    torch.onnx.export(module, (torch.from_numpy(feed),), buf, dynamo=dynamo, opset_version=18, input_names=["x"])
    model = onnx.load_from_string(buf.getvalue())
    assert [n.op_type for n in model.graph.node] == ["Conv", "Mul", "Add", "Relu"]
    graph, fired = load(model, {"x": feed}, fold_passes())
    assert fired["fold_conv_affine"] == 2 and [n.op_type for n in graph.nodes] == ["ConvBnAct"]
    with torch.no_grad():
        expected = module(torch.from_numpy(feed)).numpy()
    results, _ = convert_and_run(graph, {"x": feed}, tmp_path / "net")
    for mode, (actual,) in results.items():
        assert_close(actual, expected, 2e-6, f"{mode} mode")


# --- ConvInteger (float32, exact within the checked bound) ---


def _int_data(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, endpoint=True).astype(dtype)


CONV_INTEGER_CASES = {
    "2d": ((1, 3, 7, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_s2_asym": ((1, 2, 9, 8), (3, 2, 3, 2), {"pads": [0, 1, 1, 0], "strides": [2, 2]}),
    "2d_group": ((1, 4, 6, 6), (4, 2, 3, 3), {"group": 2}),
    "1d": ((2, 3, 11), (4, 3, 3), {"pads": [2, 0]}),
    "3d": ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), {"dilations": [1, 2, 1]}),
}


@pytest.mark.parametrize("zero_points", ["none", "x", "x_w"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("name", list(CONV_INTEGER_CASES))
def test_conv_integer(name, dtype, zero_points, tmp_path):
    x_shape, w_shape, attrs = CONV_INTEGER_CASES[name]
    inputs = [x(data=_int_data(x_shape, dtype, 1)), const(_int_data(w_shape, dtype, 2))]
    if zero_points != "none":
        inputs.append(const(np.array(37, dtype)))
    if zero_points == "x_w":
        inputs.append(const(np.array(200 if dtype == np.uint8 else -57, dtype)))
    check_op("ConvInteger", inputs, attrs, tmp_path, opset=10)


def test_conv_integer_inexact_refused():
    """1024 input channels of 255 * 255: partial sums past 2^24 would round in float32."""
    inputs = [x(data=_int_data((1, 1024, 3, 3), np.uint8, 1)), const(np.full((1, 1024, 1, 1), 255, np.uint8))]
    check_unsupported("ConvInteger", inputs, {}, "2^24", opset=10)


# --- DeformConv (ops.deformable_conv2d) ---

DEFORM_CASES = {
    "k3_pad1": ((1, 4, 6, 7), (3, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    "k3x2_offset_group2": ((1, 4, 6, 7), (3, 4, 3, 2), {"pads": [1, 1, 1, 1], "offset_group": 2}),
    "s2_asym_pads": ((2, 3, 7, 8), (2, 3, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]}),
    "dil2_group2": ((1, 4, 8, 8), (4, 2, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2], "group": 2}),
}


@pytest.mark.parametrize("extras", ["none", "bias", "mask", "bias_mask"])
@pytest.mark.parametrize("name", list(DEFORM_CASES))
def test_deform_conv(name, extras, tmp_path):
    x_shape, w_shape, attrs = DEFORM_CASES[name]
    model_out = _deform_out(x_shape, w_shape, attrs)
    taps = attrs.get("offset_group", 1) * w_shape[2] * w_shape[3]
    offset = rand(x_shape[0], 2 * taps, *model_out, seed=3, low=-1.5, high=1.5)
    inputs = [x(*x_shape), const(rand(*w_shape, seed=1, low=-0.5, high=0.5)), x(data=offset)]
    inputs.append(const(rand(w_shape[0], seed=2)) if "bias" in extras else None)
    if "mask" in extras:
        inputs.append(x(data=rand(x_shape[0], taps, *model_out, seed=4, low=0.0, high=1.0)))
    check_op("DeformConv", inputs, attrs, tmp_path, opset=19)


def _deform_out(x_shape, w_shape, attrs):
    pads, strides = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    return tuple(
        (x_shape[2 + a] + pads[a] + pads[a + 2] - (w_shape[2 + a] - 1) * dilations[a] - 1) // strides[a] + 1
        for a in range(2)
    )


@pytest.mark.parametrize("shape", [(1, 3, 9), (1, 3, 7, 8), (1, 3, 4, 5, 6)], ids=["1d", "2d", "3d"])
def test_conv_float16(shape, tmp_path):
    """float16 runs as float32 between casts (onnxruntime has no float64 Conv)."""
    w = rand(4, 3, *[3] * (len(shape) - 2), seed=1, low=-0.5, high=0.5, dtype=np.float16)
    pads = [1] * (2 * (len(shape) - 2))
    inputs = [x(data=rand(*shape, dtype=np.float16)), const(w), const(rand(4, seed=2, dtype=np.float16))]
    check_op("Conv", inputs, {"pads": pads}, tmp_path, rel_tol=2e-3)
