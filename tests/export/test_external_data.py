"""The export's tidy pass on a model whose weights live in external files (a model over protobuf's
2 GB, which the exporter writes so): the weights stay external references, renamed and unmerged,
and onnxruntime computes the same outputs from the tidied file."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from torch2ms.export.exporters import _tidy


class _Keys:
    """What ``_tidy`` asks of the PyTorch model: its state_dict keys."""

    def state_dict(self):
        return {"w1": None, "w2": None}


def _model(path):
    """z = (x + w1) + w2, with w2 = Identity(w1) as the TorchScript exporter merges equal weights,
    every initializer saved in an external file."""
    w1 = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "inner.w1")
    nodes = [
        helper.make_node("Identity", ["inner.w1"], ["inner.w2"], name="/inner/Identity"),
        helper.make_node("Add", ["x", "inner.w1"], ["y"], name="/inner/Add"),
        helper.make_node("Add", ["y", "inner.w2"], ["z"], name="/inner/Add_1"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1024]) for n in ("x", "z")]
    graph = helper.make_graph(nodes, "g", [io[0]], [io[1]], [w1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)


def _run(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_tidy_keeps_external_weights_external(tmp_path):
    path = tmp_path / "model.onnx"
    _model(path)
    x = np.linspace(-1, 1, 1024, dtype=np.float32)
    before = _run(path, x)
    _tidy(path, _Keys())
    bare = onnx.load(str(path), load_external_data=False)
    inits = {t.name: t for t in bare.graph.initializer}
    assert set(inits) == {"w1", "w2"} and uses_external_data(inits["w1"])  # renamed, still a reference
    assert not [n for n in bare.graph.node if n.op_type == "Identity"]  # w2 is an initializer of its own
    np.testing.assert_array_equal(numpy_helper.to_array(inits["w2"]), np.arange(1024, dtype=np.float32))
    np.testing.assert_array_equal(_run(path, x), before)
