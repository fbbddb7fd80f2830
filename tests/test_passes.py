"""Rewrite passes: how often they fire, what graph is left, that the numbers still match
onnxruntime, and the cases where they must not fire."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from torch2ms.graph.load import graph_from_model
from torch2ms.passes import EliminateIdentity, FoldBatchNorm, FuseConvBnAct, fold_bn_weights, run_passes

RNG = np.random.default_rng(0)


def _init(name, shape, low=-1.0, high=1.0):
    return numpy_helper.from_array(RNG.uniform(low, high, shape).astype(np.float32), name)


def conv_bn_model(act: str | None = "Relu", extra_use: bool = False, c: int = 4, spatial: int = 2) -> onnx.ModelProto:
    """x -> Conv -> BN -> act over ``spatial`` axes (8 long each), optionally with the conv output
    also feeding a second branch."""
    inits = [
        _init("w", (c, 3) + (3,) * spatial),
        _init("gamma", (c,), 0.5, 1.5),
        _init("beta", (c,), -0.3, 0.3),
        _init("mean", (c,), -0.3, 0.3),
        _init("var", (c,), 0.5, 1.5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv_out"], name="/block/conv/Conv", pads=[1] * 2 * spatial),
        helper.make_node(
            "BatchNormalization",
            ["conv_out", "gamma", "beta", "mean", "var"],
            ["bn_out"],
            name="/block/bn/BatchNormalization",
            epsilon=1e-3,
            momentum=0.9,
        ),
    ]
    last = "bn_out"
    if act == "Clip":
        inits += [
            numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
            numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        ]
        nodes.append(helper.make_node("Clip", ["bn_out", "lo", "hi"], ["act_out"], name="/block/act/Clip"))
        last = "act_out"
    elif act:
        nodes.append(helper.make_node(act, ["bn_out"], ["act_out"], name=f"/block/act/{act}"))
        last = "act_out"
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    nodes.append(helper.make_node("Identity", [last], ["y"], name="/out/Identity"))
    if extra_use:
        nodes.append(helper.make_node("Sigmoid", ["conv_out"], ["side"], name="/side/Sigmoid"))
        outputs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3] + [8] * spatial)], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _load(model):
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return graph_from_model(model, 17, {"x": tuple(d.dim_value for d in dims)})


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


@pytest.mark.parametrize(
    "act,kind", [("Relu", "Relu"), ("Clip", "Relu6"), ("HardSwish", "HardSwish"), ("Sigmoid", "Sigmoid"), (None, "")]
)
def test_fuse_fires_once_and_leaves_one_node(act, kind):
    g = _load(conv_bn_model(act))
    fired = run_passes(g, [EliminateIdentity(), FuseConvBnAct()])
    assert fired == {"eliminate_identity": 1, "fuse_conv_bn_act": 1}
    assert [n.op_type for n in g.nodes] == ["ConvBnAct"]
    node = g.nodes[0]
    assert node.attrs["activation"] == kind
    assert node.attrs["epsilon"] == pytest.approx(1e-3)
    assert node.outputs == ["y"]  # the graph output keeps its name
    assert node.origin[:2] == ["/block/conv/Conv", "/block/bn/BatchNormalization"]


def test_fuse_fires_on_a_3d_conv():
    g = _load(conv_bn_model("Relu", spatial=3))
    fired = run_passes(g, [EliminateIdentity(), FuseConvBnAct()])
    assert fired == {"eliminate_identity": 1, "fuse_conv_bn_act": 1}
    assert [n.op_type for n in g.nodes] == ["ConvBnAct"]
    assert g.nodes[0].attrs["activation"] == "Relu" and g.nodes[0].attrs["has_bn"] == 1


@pytest.mark.parametrize("spatial, extra_use, reason", [(1, False, "not a 2-D or 3-D"), (3, True, "used by more than")])
def test_fuse_does_not_fire_on_a_1d_conv_or_a_shared_3d_conv(spatial, extra_use, reason):
    g = _load(conv_bn_model("Relu", extra_use=extra_use, spatial=spatial))
    p = FuseConvBnAct()
    assert p.apply(g) == 0
    assert [n.op_type for n in g.nodes].count("BatchNormalization") == 1
    assert p.skipped and reason in p.skipped[0][1]


def test_fuse_does_not_fire_when_conv_output_is_used_twice():
    g = _load(conv_bn_model("Relu", extra_use=True))
    p = FuseConvBnAct()
    assert p.apply(g) == 0
    assert [n.op_type for n in g.nodes].count("Conv") == 1
    assert p.skipped and "used by more than" in p.skipped[0][1]


def test_fuse_leaves_activation_out_when_bn_output_is_shared():
    model = conv_bn_model("Relu")
    model.graph.node.append(helper.make_node("Sigmoid", ["bn_out"], ["side"], name="/side/Sigmoid"))
    model.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    g = _load(model)
    assert FuseConvBnAct().apply(g) == 1
    fused = next(n for n in g.nodes if n.op_type == "ConvBnAct")
    assert fused.attrs["activation"] == ""  # ReLU stays a separate node
    assert sorted(n.op_type for n in g.nodes) == ["ConvBnAct", "Identity", "Relu", "Sigmoid"]


def test_fold_bn_weights_matches_torch_fusion():
    conv = torch.nn.Conv2d(3, 5, 3, bias=True)
    bn = torch.nn.BatchNorm2d(5, eps=1e-3)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    conv.eval(), bn.eval()
    fused = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
    t = lambda p: p.detach().numpy()  # noqa: E731
    w, b = fold_bn_weights(
        t(conv.weight), t(conv.bias), t(bn.weight), t(bn.bias), t(bn.running_mean), t(bn.running_var), bn.eps
    )
    np.testing.assert_allclose(w, t(fused.weight), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, t(fused.bias), rtol=1e-5, atol=1e-6)
    x = torch.randn(2, 3, 9, 9)
    y_ref = bn(conv(x)).detach().numpy()
    y = torch.nn.functional.conv2d(x, torch.from_numpy(w), torch.from_numpy(b)).numpy()
    assert np.abs(y - y_ref).max() <= 1e-5 * np.abs(y_ref).max()


def test_fold_bn_weights_without_conv_bias():
    w = RNG.standard_normal((2, 1, 1, 1)).astype(np.float32)
    wf, bf = fold_bn_weights(
        w, None, np.array([2.0, 1.0]), np.array([0.5, 0.0]), np.array([1.0, -1.0]), np.array([3.0, 0.0]), 1.0
    )
    np.testing.assert_allclose(wf.ravel(), w.ravel() * np.array([1.0, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(bf, [(0 - 1) * 1.0 + 0.5, (0 + 1) * 1.0], rtol=1e-6)


@pytest.mark.parametrize("spatial", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("fuse", [True, False])
def test_fold_removes_every_batchnorm_and_keeps_numbers(fuse, spatial):
    model = conv_bn_model("Relu", spatial=spatial)
    g = _load(model)
    passes = [EliminateIdentity()] + ([FuseConvBnAct()] if fuse else []) + [FoldBatchNorm()]
    fired = run_passes(g, passes)
    assert fired["fold_batchnorm"] == 1
    assert not any(n.op_type == "BatchNormalization" for n in g.nodes)
    conv = next(n for n in g.nodes if n.op_type in ("Conv", "ConvBnAct"))
    assert len(conv.inputs) == 3  # x, W', b'
    # Evaluate the rewritten conv with torch: it must equal onnxruntime on the original model.
    x = RNG.standard_normal((1, 3) + (8,) * spatial).astype(np.float32)
    w, b = (g.const(i) for i in conv.inputs[1:])
    conv_nd = torch.nn.functional.conv2d if spatial == 2 else torch.nn.functional.conv3d
    y = torch.relu(conv_nd(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1)).numpy()
    (ref,) = _ort(model, x)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_fold_does_not_fire_on_batchnorm_without_conv():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    inits = [_init(n, (3,), 0.5, 1.5) for n in ("g", "b", "m", "v")]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu/Relu"),
        helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["y"], name="/bn/BatchNormalization"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    g = _load(model)
    assert FoldBatchNorm().apply(g) == 0
    assert [n.op_type for n in g.nodes] == ["Relu", "BatchNormalization"]
