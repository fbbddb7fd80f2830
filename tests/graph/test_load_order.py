"""The loader's onnxruntime shape run keeps only the live activations (execution order by node
index), and the order it runs in changes no inferred shape or folded constant."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
from onnx import TensorProto, helper

import torch2ms.graph.load as load
from torch2ms.graph import onnxrt

CHAIN = textwrap.dedent(
    """
    import resource
    from onnx import TensorProto, helper
    from torch2ms.graph.load import graph_from_model
    n = 40  # 40 activations of 8 MB: 320 MB if all stay alive until the appended Shape nodes run
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"x{i + 1}"], name=f"r{i}") for i in range(n)]
    io = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 8, 512, 512]) for i in (0, n)]
    model = helper.make_model(
        helper.make_graph(nodes, "chain", io[:1], io[1:]), opset_imports=[helper.make_opsetid("", 17)]
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    graph = graph_from_model(model, 17, {"x0": (1, 8, 512, 512)})
    assert graph.values[f"x{n}"].shape == (1, 8, 512, 512)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
    """
)


def test_shape_run_holds_only_live_activations():
    # a fresh process: its peak RSS is this load's (the default order measured 328 MB here)
    out = subprocess.run([sys.executable, "-c", CHAIN], capture_output=True, text=True, check=True)
    grew_mb = float(out.stdout.strip().splitlines()[-1])
    assert grew_mb < 100, f"the shape run grew the peak RSS by {grew_mb:.0f} MB"


def _reshaping_model():
    """Conv -> Shape -> Gather(0) -> Concat -> Reshape: a batch-following size folded to a constant."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.random.default_rng(0).random(108).tolist())
    idx = helper.make_tensor("idx", TensorProto.INT64, [1], [0])
    rest = helper.make_tensor("rest", TensorProto.INT64, [1], [-1])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx"], ["b"], name="gather", axis=0),
        helper.make_node("Concat", ["b", "rest"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, idx, rest],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_execution_order_changes_no_shape_or_constant(monkeypatch):
    def loaded(node_order, batch):
        monkeypatch.setattr(onnxrt, "SHAPES", dataclasses.replace(onnxrt.SHAPES, node_order=node_order))
        return load.graph_from_model(_reshaping_model(), 17, {"x": (batch, 3, 16, 16)})

    for batch in (1, 2):
        a, b = loaded(False, batch), loaded(True, batch)
        assert [(n.name, n.inputs) for n in a.nodes] == [(n.name, n.inputs) for n in b.nodes]
        assert a.values["y"].shape == b.values["y"].shape == (batch, 4 * 16 * 16)
        assert np.array_equal(a.values["target"].const, b.values["target"].const)
        assert list(b.values["target"].const) == [batch, -1]
        assert {k: v.shape for k, v in a.values.items()} == {k: v.shape for k, v in b.values.items()}


def matmul_add(w: np.ndarray, b: np.ndarray, rows: int):
    """``y = x @ w + b`` as a MatMul (output ``m``) and an Add, ``w`` and ``b`` initializers."""
    from onnx import numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    return helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, w.shape[0]])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, w.shape[1]])],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )


def test_large_weights_reach_onnxruntime_as_mapped_external_data(monkeypatch):
    """An initializer of ``EXTERNAL_TENSOR`` bytes or more goes to the session as external data (a
    file onnxruntime maps, not a second copy in the serialized model); the session computes the
    same values, and the caller's model is given back as it was, its temporary folder gone."""
    import tempfile
    from pathlib import Path

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)  # 8 KB; the threshold is lowered below
    small = rng.standard_normal((32,)).astype(np.float32)
    model = matmul_add(w, small, 2)
    before = model.SerializeToString()
    made = []
    real = tempfile.TemporaryDirectory

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(onnxrt, "EXTERNAL_TENSOR", w.nbytes)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", spy)
    sess = load.session_with_outputs(model, ["m", "y"])
    x = rng.standard_normal((2, 64)).astype(np.float32)
    m, y = sess.run(["m", "y"], {"x": x})
    np.testing.assert_allclose(m, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x @ w + small, rtol=1e-5, atol=1e-5)
    assert len(made) == 1 and not Path(made[0].name).exists()  # one folder, removed, the session still runs
    assert model.SerializeToString() == before


def test_a_loaded_model_gives_its_large_weights_to_the_graph_unchanged(tmp_path, monkeypatch):
    """``load_onnx`` moves each large weight out of the proto into the graph (no second copy) and
    hands it to the shape run as external data: every value's shape, dtype and constant must be
    what the copying path gives, and a whole conversion must pass with it."""
    from conftest import write_recipe

    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    recipe = load_recipe(write_recipe(tmp_path / "tiny.yaml"))
    first = pipeline_runner(recipe, log=lambda m: None).run(until="export")
    assert first.stages[0].status == "passed"
    onnx_path = first.root / "export" / "model.onnx"
    shapes = {i.name: tuple(i.shape) for i in recipe.inputs}
    copied = load.load_onnx(onnx_path, shapes)
    monkeypatch.setattr(onnxrt, "EXTERNAL_TENSOR", 64)  # every weight but the smallest biases
    taken = load.load_onnx(onnx_path, shapes)
    moved = [v for v in taken.values.values() if v.is_const and not v.const.flags.writeable]
    assert len(moved) >= 3, "no weight was moved out of the proto"
    assert copied.values.keys() == taken.values.keys()
    for name, v in copied.values.items():
        w = taken.values[name]
        assert (v.shape, v.dtype, v.is_const) == (w.shape, w.dtype, w.is_const), name
        if v.is_const:
            np.testing.assert_array_equal(v.const, w.const, err_msg=name)
    result = pipeline_runner(recipe, out_root=tmp_path / "again", log=lambda m: None).run(until="fold")
    assert [s.status for s in result.stages[:3]] == ["passed"] * 3


def test_a_model_past_the_serialized_limit_sends_every_weight_as_external_data(monkeypatch):
    """Past ``SERIALIZED_MAX`` bytes of initializers in all (protobuf serializes at most 2 GB), every
    one goes to the file, small ones too; the session computes the same values and the model is
    given back as it was."""
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((4,)).astype(np.float32)
    model = matmul_add(w, b, 3)
    before = model.SerializeToString()
    sent = []
    real = onnxrt._to_external
    monkeypatch.setattr(onnxrt, "SERIALIZED_MAX", 0)
    monkeypatch.setattr(onnxrt, "_to_external", lambda t, *a: sent.extend(x.name for x in t) or real(t, *a))
    sess = onnxrt.session(model, onnxrt.SHAPES)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], x @ w + b, rtol=1e-5, atol=1e-5)
    assert sorted(sent) == ["b", "w"]
    assert model.SerializeToString() == before
