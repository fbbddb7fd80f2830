"""FoldBatchNorm and its weight math: W' = W * gamma / std, b' = (b - mean) * gamma / std + beta."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from passes.graphs import RNG, conv_bn_model, init, load, ort_outputs
from torch2ms.passes import EliminateIdentity, FoldBatchNorm, FuseConvBnAct, fold_bn_weights, run_passes


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
    g = load(model)
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
    (ref,) = ort_outputs(model, x)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_fold_does_not_fire_on_batchnorm_without_conv():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    inits = [init(n, (3,), 0.5, 1.5) for n in ("g", "b", "m", "v")]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/relu/Relu"),
        helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["y"], name="/bn/BatchNormalization"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    g = load(model)
    assert FoldBatchNorm().apply(g) == 0
    assert [n.op_type for n in g.nodes] == ["Relu", "BatchNormalization"]
