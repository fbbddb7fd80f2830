"""FuseConvBnAct: Conv -> BatchNorm -> activation becomes one ConvBnAct node (nn.Conv2dBnAct / Conv3dBnAct)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from passes.graphs import conv_bn_model, load
from torch2ms.passes import EliminateIdentity, FuseConvBnAct, run_passes


@pytest.mark.parametrize(
    "act,kind", [("Relu", "Relu"), ("Clip", "Relu6"), ("HardSwish", "HardSwish"), ("Sigmoid", "Sigmoid"), (None, "")]
)
def test_fuse_fires_once_and_leaves_one_node(act, kind):
    g = load(conv_bn_model(act))
    fired = run_passes(g, [EliminateIdentity(), FuseConvBnAct()])
    assert fired == {"eliminate_identity": 1, "fuse_conv_bn_act": 1}
    assert [n.op_type for n in g.nodes] == ["ConvBnAct"]
    node = g.nodes[0]
    assert node.attrs["activation"] == kind
    assert node.attrs["epsilon"] == pytest.approx(1e-3)
    assert node.outputs == ["y"]  # the graph output keeps its name
    assert node.origin[:2] == ["/block/conv/Conv", "/block/bn/BatchNormalization"]


def test_fuse_fires_on_a_3d_conv():
    g = load(conv_bn_model("Relu", spatial=3))
    fired = run_passes(g, [EliminateIdentity(), FuseConvBnAct()])
    assert fired == {"eliminate_identity": 1, "fuse_conv_bn_act": 1}
    assert [n.op_type for n in g.nodes] == ["ConvBnAct"]
    assert g.nodes[0].attrs["activation"] == "Relu" and g.nodes[0].attrs["has_bn"] == 1


@pytest.mark.parametrize("spatial, extra_use, reason", [(1, False, "not a 2-D or 3-D"), (3, True, "used by more than")])
def test_fuse_does_not_fire_on_a_1d_conv_or_a_shared_3d_conv(spatial, extra_use, reason):
    g = load(conv_bn_model("Relu", extra_use=extra_use, spatial=spatial))
    p = FuseConvBnAct()
    assert p.apply(g) == 0
    assert [n.op_type for n in g.nodes].count("BatchNormalization") == 1
    assert p.skipped and reason in p.skipped[0][1]


def test_fuse_does_not_fire_when_conv_output_is_used_twice():
    g = load(conv_bn_model("Relu", extra_use=True))
    p = FuseConvBnAct()
    assert p.apply(g) == 0
    assert [n.op_type for n in g.nodes].count("Conv") == 1
    assert p.skipped and "used by more than" in p.skipped[0][1]


def test_fuse_leaves_activation_out_when_bn_output_is_shared():
    model = conv_bn_model("Relu")
    model.graph.node.append(helper.make_node("Sigmoid", ["bn_out"], ["side"], name="/side/Sigmoid"))
    model.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, None))
    g = load(model)
    assert FuseConvBnAct().apply(g) == 1
    fused = next(n for n in g.nodes if n.op_type == "ConvBnAct")
    assert fused.attrs["activation"] == ""  # ReLU stays a separate node
    assert sorted(n.op_type for n in g.nodes) == ["ConvBnAct", "Identity", "Relu", "Sigmoid"]
