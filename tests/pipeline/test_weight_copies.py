"""The weights are held as few times as the stages need (memory grows with the model, not with the
pipeline): the ONNX graph's constants are shared between the cached graph, each stage's copy and the
graph at another batch size; dtype inference does not carry the weights; the float64 reference does
not copy a float32 model.

Numpy allocations are traced (``tracemalloc``), so "no second copy" is measured, not assumed.
"""

from __future__ import annotations

import copy
import tracemalloc

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from torch2ms.export.floor import float64_outputs
from torch2ms.graph.cache import onnx_graph
from torch2ms.graph.load import _inferred_dtypes, _without_large_initializers, load_onnx
from torch2ms.pipeline.context import RunContext
from torch2ms.pipeline.workspace import RunDir
from torch2ms.recipe import parse_recipe

WIDTH = 512  # 4 x 512 x 512 float32 = 4 MB of weights


def _mlp_onnx(path, layers: int = 4) -> int:
    """x [N, 512] -> (MatMul W_i, Add b_i, Relu) x layers, with a Reshape whose shape is a small
    initializer; returns the bytes of the weights."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / np.sqrt(WIDTH)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(WIDTH, np.float32), f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    inits.append(numpy_helper.from_array(np.array([-1, WIDTH], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", [x, "shape"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return layers * WIDTH * WIDTH * 4


def _ctx(tmp_path):
    recipe = parse_recipe(
        {"name": "mlp", "model": {"factory": "x:y"}, "inputs": [{"name": "x", "shape": [1, WIDTH]}]}, "test"
    )
    return RunContext(recipe, RunDir(tmp_path / "run"), log=lambda m: None)


def _traced(fn):
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_stage_copies_share_the_weights(tmp_path):
    path = tmp_path / "model.onnx"
    weights = _mlp_onnx(path)
    ctx = _ctx(tmp_path)
    first = onnx_graph(ctx, path)
    (second, other_batch), grown = _traced(lambda: (onnx_graph(ctx, path), onnx_graph(ctx, path, {"x": 2})))
    # a second stage's copy and the graph at batch 2 hold no weights of their own (the batch-2 load
    # itself allocates them once, then swaps them for the shared ones)
    assert grown < weights / 4, (grown, weights)
    for name in ("w0", "w3"):
        assert second.values[name].const is first.values[name].const is other_batch.values[name].const
    assert other_batch.values["x"].shape == (2, WIDTH) and first.values["x"].shape == (1, WIDTH)
    # a pass that wrote into a weight in place would change every copy: it raises instead
    with pytest.raises(ValueError, match="read-only"):
        second.values["w0"].const[0, 0] = 1.0
    # the copies are otherwise their own
    second.nodes.pop()
    assert len(onnx_graph(ctx, path).nodes) == len(first.nodes)


def test_dtype_inference_without_the_weights_gives_the_same_dtypes(tmp_path):
    path = tmp_path / "model.onnx"
    _mlp_onnx(path)
    model = onnx.load(str(path))
    # the Reshape's shape (small) stays, the weights (1 MB each) become typed inputs
    lean = _without_large_initializers(model)
    assert [t.name for t in lean.graph.initializer] == [f"b{i}" for i in range(4)] + ["shape"]
    assert {"w0", "w1", "w2", "w3"} <= {vi.name for vi in lean.graph.input}
    assert lean.ByteSize() < model.ByteSize() / 50
    assert (
        _inferred_dtypes(model) == {k: v for k, v in _inferred_dtypes(lean).items() if k in _inferred_dtypes(model)}
        and _inferred_dtypes(model)["y"] == np.float32
    )
    graph = load_onnx(path, {"x": (1, WIDTH)})
    assert graph.values["y"].shape == (1, WIDTH) and graph.values["y"].dtype == np.float32


def test_float64_reference_widens_in_place_and_restores_the_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.GELU()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = [id(p) for p in model.parameters()]
    samples = [{"x": np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32)}]
    wide = float64_outputs(model, samples)
    x = torch.from_numpy(samples[0]["x"]).double()
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(x).numpy()
    np.testing.assert_array_equal(wide[0]["output"], expected)
    assert wide[0]["output"].dtype == np.float64
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert [id(p) for p in model.parameters()] == ids  # the same Parameters: tied weights stay tied


def test_float64_reference_of_a_half_model_copies_it():
    model = torch.nn.Linear(8, 8).half().eval()
    assert float64_outputs(model, [{"x": np.ones((1, 8), np.float32)}]) is not None
    assert next(model.parameters()).dtype == torch.float16


def test_a_load_that_failed_is_not_tried_again(tmp_path, monkeypatch):
    """A model with its batch baked in (the Reshape's shape says 1) fails at batch 2 in onnxruntime;
    a second stage asking for batch 2 gets the same error without a second load."""
    from torch2ms.errors import OnnxError
    from torch2ms.graph import cache

    path = tmp_path / "model.onnx"
    _mlp_onnx(path)
    model = onnx.load(str(path))
    shape = next(t for t in model.graph.initializer if t.name == "shape")
    shape.CopyFrom(numpy_helper.from_array(np.array([1, WIDTH], np.int64), "shape"))
    onnx.save(model, str(path))
    loads = []
    real = cache.load_onnx
    monkeypatch.setattr(cache, "load_onnx", lambda *a, **k: loads.append(a[1]) or real(*a, **k))
    ctx = _ctx(tmp_path)
    onnx_graph(ctx, path)
    errors = []
    for _ in range(2):
        with pytest.raises(OnnxError, match="Reshape") as raised:
            onnx_graph(ctx, path, {"x": 2})
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert [s["x"] for s in loads] == [(1, WIDTH), (2, WIDTH)]  # batch 2 loaded once
    assert onnx_graph(ctx, path).values["x"].shape == (1, WIDTH)  # the batch-1 graph is still served
