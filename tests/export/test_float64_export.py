"""``model.onnx`` in float64 (``torch2ms.export.float64``), the export stage's evidence past
``check.ceiling``: a right graph agrees with PyTorch in float64 far inside the 1e-5 it is held to,
once its float32 attributes and scalars take back the numbers they were rounded from."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from torch2ms.export import float64


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        (1e-3, 1e-3),
        (1e-5, 1e-5),
        (1 / 6, 1 / 6),
        (2 / 3, 2 / 3),
        (32**-0.5, 32**-0.5),
        (0.044715, 0.044715),
        (3.0, 3.0),
    ],
)
def test_a_float32_scalar_takes_back_the_number_it_was_rounded_from(written, meant):
    stored = float(np.float32(written))
    assert stored != meant or written == 3.0  # float32 moved it (3.0 is exact)
    assert float64.exact(stored) == meant


def test_a_scalar_without_a_simple_form_stays_within_float32s_rounding():
    stored = float(np.float32(np.pi))
    assert np.float32(float64.exact(stored)) == np.float32(stored)


class Scaled(nn.Module):
    """What moved a right graph away from PyTorch in float64 before its constants were taken back:
    BatchNorm's epsilon 1e-3, HardSwish (1/6 in its function body), an attention scale 1/sqrt(32)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32, eps=1e-3)
        self.act = nn.Hardswish()

    def forward(self, x):
        h = self.act(self.bn(self.conv(x))).flatten(2)  # [1, 32, 64]
        attn = (h.transpose(1, 2) @ h) * 32**-0.5
        return attn.softmax(-1) @ h.transpose(1, 2)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Scaled().eval()
    with torch.no_grad():
        model.bn.running_var.uniform_(1e-3, 1e-2)  # small variances: the epsilon matters
    x = torch.randn(1, 3, 8, 8)
    path = tmp_path_factory.mktemp("f64") / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(  # as the export stage does: TorchScript, BatchNorm kept (not folded in float32)
            model,
            (x,),
            str(path),
            input_names=["x"],
            output_names=["y"],
            opset_version=17,
            dynamo=False,
            training=torch.onnx.TrainingMode.PRESERVE,
        )
    with torch.no_grad():
        wide = model.double()(x.double()).numpy()
    return path, x.numpy(), wide


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_graph_in_float64_agrees_with_pytorch_in_float64(exported):
    path, x, wide = exported
    got = float64.run(path, [{"x": x}], ["y"])[0]["y"]
    assert got.dtype == np.float64
    assert _rel(got, wide) < 1e-13


def test_without_the_numbers_taken_back_the_float32_constants_show(exported, monkeypatch):
    """The same run with each scalar left as float32 stores it: float32's rounding of the constants
    alone, ~1e-8 here, is what the 1e-5 bound would otherwise have to absorb on a deep network."""
    path, x, wide = exported
    monkeypatch.setattr(float64, "exact", lambda v: float(np.float32(v)))
    monkeypatch.setattr(float64, "OPS", tuple(op for op in float64.OPS if op is not float64.HardSwish))
    got = float64.run(path, [{"x": x}], ["y"])[0]["y"]
    assert _rel(got, wide) > 1e-10


class TopQueries(nn.Module):
    """RT-DETR's query selection: the 10 best of 100 candidates, gathered (GatherElements over an
    axis of 100, more than the 32 positions the evaluator's own GatherElements takes)."""

    def forward(self, x):
        scores = x.sum(-1)  # [1, 100]
        index = scores.topk(10, dim=1).indices.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        return torch.gather(x, 1, index)


def test_gather_elements_over_more_than_32_positions(tmp_path):
    x = torch.randn(1, 100, 4, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TopQueries(), (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False
        )
    assert "GatherElements" in {n.op_type for n in onnx.load(str(path)).graph.node}
    got = float64.run(path, [{"x": x.numpy()}], ["y"])[0]["y"]
    expected = TopQueries()(x.double()).numpy()
    assert np.array_equal(got, expected)


class Sampled(nn.Module):
    """Deformable attention's GridSample, with modes, paddings and corner alignments that differ
    (a node run with another node's attributes gives other numbers)."""

    def forward(self, x, grid):
        a = nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        b = nn.functional.grid_sample(x, grid * 1.5, mode="nearest", padding_mode="border", align_corners=True)
        c = nn.functional.grid_sample(x, grid * 1.5, mode="bilinear", padding_mode="reflection", align_corners=True)
        return a + 2 * b + 3 * c


def test_grid_sample_keeps_each_nodes_mode_padding_and_alignment(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, grid = torch.randn(1, 2, 6, 7, generator=g), torch.rand(1, 5, 4, 2, generator=g) * 2 - 1
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Sampled(),
            (x, grid),
            str(path),
            input_names=["x", "grid"],
            output_names=["y"],
            opset_version=17,
            dynamo=False,
        )
    assert sum(n.op_type == "GridSample" for n in onnx.load(str(path)).graph.node) == 3
    got = float64.run(path, [{"x": x.numpy(), "grid": grid.numpy()}], ["y"])[0]["y"]
    assert _rel(got, Sampled()(x.double(), grid.double()).numpy()) < 1e-14


def test_the_freeing_run_gives_what_the_evaluators_own_run_gives():
    """``float64._run`` drops each value after its last reader; it must compute what
    ``ReferenceEvaluator.run`` computes, for a requested intermediate, a value read by two nodes far
    apart, an optional input left out ("") and an output no node reads."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Add", ["a", "a"], ["b"]),
        helper.make_node("Clip", ["b", "", "hi"], ["c"]),
        helper.make_node("Split", ["c"], ["s0", "s1"], axis=1),  # s1: read by no node
        helper.make_node("Concat", ["s0", "s0"], ["dd"], axis=1),
        helper.make_node("Sub", ["dd", "a"], ["d"]),  # a: read again, long after Add
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 4])],
        [helper.make_tensor_value_info("d", TensorProto.DOUBLE, None)],
        [helper.make_tensor("hi", TensorProto.DOUBLE, [], [1.5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    evaluator = ReferenceEvaluator(model)
    x = np.random.default_rng(0).standard_normal((2, 4))
    names = ["d", "b"]
    want = evaluator.run(names, {"x": x})
    got = float64._run(evaluator, names, {"x": x})
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
    assert np.abs(want[0]).max() > 0
    with pytest.raises(RuntimeError, match="no value for"):
        float64._run(evaluator, ["nowhere"], {"x": x})


@pytest.mark.parametrize("opset", [9, 12, 15])
def test_batch_normalization_with_a_momentum_attribute_runs_in_inference_mode(tmp_path, opset):
    """PaddlePaddle's exporter (rapidocr's PP-OCR models, opset 12) writes ``momentum`` on inference
    BatchNorms; the evaluator's own version 9 then normalises by the batch's statistics."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 5, 6)).astype(np.float32) * 4 + 2
    scale, bias, mean = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 3).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in zip((scale, bias, mean, var), ("s", "b", "m", "v"))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5, momentum=0.9)
    graph = helper.make_graph(
        [node],
        "bn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, x.shape)],
        inits,
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    got = float64.run(path, [{"x": x}], ["y"])[0]["y"]
    scale, bias, mean, var = (a.astype(np.float64).reshape(1, 3, 1, 1) for a in (scale, bias, mean, var))
    expected = (x.astype(np.float64) - mean) / np.sqrt(var + 1e-5) * scale + bias
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
