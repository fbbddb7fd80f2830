"""The loader refuses by name what torch2ms cannot take, before onnxruntime or numpy fail on it
(ONNX's conformance cases crashed there: float8/int4/string values, sequence inputs, opset-28
models, integer inputs that set a shape), and accepts models stamped with a newer opset whose
ops did not change but for new element types."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from converters.helpers import check_model
from onnx import TensorProto, helper, numpy_helper

from torch2ms.converters.api import MS_DTYPES
from torch2ms.errors import OnnxError
from torch2ms.graph.load import graph_from_model, load_onnx
from torch2ms.graph.validate import MINDSPORE_TYPES, SUPPORTED_OPSETS
from torch2ms.graph.validate import check_model as check_onnx
from torch2ms.recipe import ExportSpec


def _model(nodes, inputs, outputs, opset=17, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vi(name, elem=TensorProto.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _refusal(model) -> str:
    with pytest.raises(OnnxError) as info:
        check_onnx(model, "m.onnx")
    return str(info.value)


def test_the_mindspore_types_are_the_converters_dtypes():
    names = {helper.tensor_dtype_to_np_dtype(t).name for t in MINDSPORE_TYPES}
    assert names == set(MINDSPORE_TYPES.values()) == set(MS_DTYPES)


def test_recipe_opset_bound_is_the_loaders():
    bounds = {type(m).__name__: m for m in ExportSpec.model_fields["opset"].metadata}
    assert (bounds["Ge"].ge, bounds["Le"].le) == (SUPPORTED_OPSETS.start, SUPPORTED_OPSETS.stop - 1) == (11, 23)


@pytest.mark.parametrize(
    "elem, name",
    [(TensorProto.FLOAT8E4M3FN, "float8e4m3fn"), (TensorProto.STRING, "string"), (TensorProto.COMPLEX64, "complex64")],
)
def test_input_of_a_type_mindspore_lacks_is_refused_by_name(elem, name):
    m = _model([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", elem)], [_vi("y", elem)])
    msg = _refusal(m)
    assert f"MindSpore has no tensor type for input 'x' ({name}); output 'y' ({name})" in msg


def test_initializer_attribute_and_cast_target_of_such_types_are_refused():
    w = numpy_helper.from_array(np.zeros((2, 3), np.int8), "w")
    w.data_type = TensorProto.INT4
    w.ClearField("int32_data")
    w.raw_data = bytes(3)
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], name="to_fp8", to=TensorProto.FLOAT8E5M2),
        helper.make_node("Constant", [], ["k"], name="text", value_string="hello"),
        helper.make_node(
            "Constant", [], ["z"], name="cz", value=helper.make_tensor("z", TensorProto.UINT4, [2], [1, 2])
        ),
        helper.make_node("Identity", ["x"], ["y"]),
    ]
    msg = _refusal(_model(nodes, [_vi("x")], [_vi("y")], inits=[w]))
    assert "initializer 'w' (int4)" in msg
    assert "attribute to=float8e5m2 of Cast node 'to_fp8'" in msg
    assert "attribute 'value_string' of Constant node 'text' (string)" in msg
    assert "attribute 'value' of Constant node 'cz' (uint4)" in msg


def test_sequence_input_and_foreign_domain_are_refused_by_name():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    m = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [seq], [_vi("n", TensorProto.INT64, ())])
    assert "input 's' is a sequence value (MindSpore code takes tensors)" in _refusal(m)
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_floats=[1.0], values_floats=[2.0])
    m = _model([node], [_vi("x")], [_vi("y")])
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 4))
    assert "ops outside the default ONNX domain cannot be converted (domain 'ai.onnx.ml': LabelEncoder)" in _refusal(m)


def test_newer_opset_is_accepted_when_its_ops_only_gained_element_types(tmp_path):
    """Reshape-25 and Transpose-25 are Reshape-23 and Transpose-23 plus int2/uint2/float8e8m0;
    Cast-25 changed more (new attributes): a model using it is refused, naming it."""
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Transpose", ["r"], ["y"])]
    model = _model(nodes, [_vi("x")], [_vi("y", shape=(2, 3))], opset=25, inits=[shape])
    onnx.save(model, tmp_path / "m.onnx")
    assert load_onnx(tmp_path / "m.onnx").opset == 25
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_model(model, {"x": x}, tmp_path)  # and it converts and matches onnxruntime
    cast = _model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)],
        [_vi("x")],
        [_vi("y", TensorProto.INT32)],
        opset=25,
    )
    msg = _refusal(cast)
    assert "opset 25 is outside the supported range 11-23, and Cast (opset 25) changed after opset 23" in msg


def test_integer_input_that_sets_a_shape_is_refused_with_placeholders_and_loads_with_values(tmp_path):
    """With placeholder values (ones) onnxruntime cannot reshape 2x3 into 1x1: a refusal that
    says which input; with the sample's values the shapes are the real ones."""
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [_vi("x"), _vi("shape", TensorProto.INT64, (2,))],
        [_vi("y", shape=(3, 2))],
    )
    with pytest.raises(OnnxError) as info:
        graph_from_model(model, 17, source="m.onnx")
    msg = str(info.value)
    assert "onnxruntime (which torch2ms runs to infer static shapes and fold constants) fails on placeholder" in msg
    assert "'shape'" in msg and "must be a constant (an initializer) of the ONNX" in msg
    values = {"x": np.zeros((2, 3), np.float32), "shape": np.array([3, 2], np.int64)}
    graph = graph_from_model(model, 17, source="m.onnx", input_values=values)
    assert graph.values["y"].shape == (3, 2)


def test_an_empty_input_has_a_static_shape():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=(2, 0, 4))], [_vi("y", shape=(2, 0, 4))])
    graph = graph_from_model(model, 17)
    assert graph.values["y"].shape == (2, 0, 4)


def test_an_output_folded_into_a_constant_is_returned_as_a_stored_tensor(tmp_path):
    """A model returning the Shape of its input: the loader folds it, the network returns it."""
    model = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [])
    model.graph.output.extend([_vi("s", TensorProto.INT64, (2,)), _vi("y")])
    source, _ = check_model(model, {"x": np.ones((2, 3), np.float32)}, tmp_path)
    construct = source.split("def construct")[1].split("def build")[0]
    assert construct.strip().splitlines()[-1].strip().startswith("return self.s, ")
