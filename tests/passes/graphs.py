"""The small ONNX graphs the pass tests share: Conv -> BatchNorm -> activation, loaded into the IR."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from torch2ms.graph.load import graph_from_model

RNG = np.random.default_rng(0)


def init(name, shape, low=-1.0, high=1.0):
    return numpy_helper.from_array(RNG.uniform(low, high, shape).astype(np.float32), name)


def conv_bn_model(act: str | None = "Relu", extra_use: bool = False, c: int = 4, spatial: int = 2) -> onnx.ModelProto:
    """x -> Conv -> BN -> act over ``spatial`` axes (8 long each), optionally with the conv output
    also feeding a second branch."""
    inits = [
        init("w", (c, 3) + (3,) * spatial),
        init("gamma", (c,), 0.5, 1.5),
        init("beta", (c,), -0.3, 0.3),
        init("mean", (c,), -0.3, 0.3),
        init("var", (c,), 0.5, 1.5),
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


def load(model):
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return graph_from_model(model, 17, {"x": tuple(d.dim_value for d in dims)})


def ort_outputs(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})
