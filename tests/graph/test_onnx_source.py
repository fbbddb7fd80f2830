"""An ONNX file as the source (``model: {onnx: path}``): files written by the torch exporters and
built by hand with onnx.helper (ops no torch model emits) pass all five stages against
onnxruntime's outputs; bad files and mismatched inputs are named, exit 2, nothing written."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from conftest import write_recipe
from onnx import TensorProto, helper, numpy_helper
from pipeline.test_bad_input import cli, flat
from tiny_models import tiny_net

from torch2ms.errors import OnnxError, RecipeError
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, stage_names


def torch_onnx(path, opset: int, fold: bool, dynamo: bool = False):
    torch.manual_seed(0)
    model = tiny_net(num_classes=5).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = {} if dynamo else {"do_constant_folding": fold, "training": torch.onnx.TrainingMode.PRESERVE}
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, 32, 32),),
            str(path),
            input_names=["input"],
            output_names=["logits"],
            opset_version=opset,
            dynamo=dynamo,
            **kw,
        )
    return path


def hand_built(path):
    """Ops no torch export writes: Shrink, ThresholdedRelu, a three-way Mean, Max with a constant."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6), "w")
    nodes = [
        helper.make_node("Shrink", ["x"], ["s"], name="/hand/Shrink", lambd=0.3, bias=0.1),
        helper.make_node("ThresholdedRelu", ["x"], ["t"], name="/hand/ThresholdedRelu", alpha=0.5),
        helper.make_node("Mean", ["s", "t", "x"], ["m"], name="/hand/Mean"),
        helper.make_node("Max", ["m", "w"], ["y"], name="/hand/Max"),
    ]
    graph = helper.make_graph(
        nodes,
        "hand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def hand_built_tokens(path):
    """Token ids and per-row lengths through ops no torch export writes: ReverseSequence with
    sequence_lens, LpNormalization, Hardmax, a three-way Sum; an int64 ArgMax output beside the float one."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "table")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="/tok/Gather"),
        helper.make_node("ReverseSequence", ["emb", "lens"], ["rev"], name="/tok/Reverse", batch_axis=0, time_axis=1),
        helper.make_node("LpNormalization", ["rev"], ["unit"], name="/tok/LpNorm", axis=-1, p=2),
        helper.make_node("Hardmax", ["unit"], ["top"], name="/tok/Hardmax", axis=-1),
        helper.make_node("Sum", ["unit", "top", "emb"], ["y"], name="/tok/Sum"),
        helper.make_node("ArgMax", ["y"], ["label"], name="/tok/ArgMax", axis=-1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 6]),
            helper.make_tensor_value_info("lens", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 8]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [2, 6]),
        ],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def run(path, **overrides):
    recipe = write_recipe(path.parent / "r.yaml", **overrides)
    return pipeline_runner(load_recipe(recipe), log=lambda m: None).run()


def assert_all_passed(result, exporter="onnx file"):
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    for stage in stage_names():
        record = json.loads((result.root / stage / "stage.json").read_text())
        assert record["status"] == "passed" and record["worst"]["rel_error"] <= 1e-4, stage
    export = json.loads((result.root / "export" / "stage.json").read_text())
    assert export["extra"]["export_path"]["exporter"] == exporter
    return export


def test_torchscript_onnx_file_through_every_stage(tmp_path):
    path = torch_onnx(tmp_path / "tiny.onnx", opset=13, fold=False)
    result = run(path, model={"onnx": "tiny.onnx"})
    export = assert_all_passed(result)
    assert export["counts"]["batchnorm_nodes"] == 3  # kept by the exporter, as a torch source would
    rebuild = json.loads((result.root / "rebuild" / "stage.json").read_text())["counts"]
    assert rebuild["conv2d_bn_act"] == 3
    # the reference is onnxruntime's run of the file, which is PyTorch's to float32 noise
    ref = np.load(result.root / "export" / "reference.npz")
    x = torch.from_numpy(ref["input.input"][0])
    torch.manual_seed(0)
    with torch.no_grad():
        want = tiny_net(num_classes=5).eval()(x).numpy()
    got = ref["output.logits"][0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_hand_built_graph_through_every_stage(tmp_path):
    hand_built(tmp_path / "hand.onnx")
    result = run(tmp_path / "hand.onnx", model={"onnx": "hand.onnx"}, inputs=[{"name": "x", "shape": [2, 6]}])
    export = assert_all_passed(result)
    assert export["counts"]["onnx_ops"] == {"Max": 1, "Mean": 1, "Shrink": 1, "ThresholdedRelu": 1}


def test_hand_built_token_graph_through_every_stage(tmp_path):
    hand_built_tokens(tmp_path / "tokens.onnx")
    inputs = [
        {"name": "ids", "shape": [2, 6], "dtype": "int64", "range": [0, 50]},
        {"name": "lens", "shape": [2], "dtype": "int64", "range": [1, 7]},
    ]
    result = run(tmp_path / "tokens.onnx", model={"onnx": "tokens.onnx"}, inputs=inputs, task="embedding")
    export = assert_all_passed(result)
    assert export["counts"]["onnx_ops"] == {
        "ArgMax": 1, "Gather": 1, "Hardmax": 1, "LpNormalization": 1, "ReverseSequence": 1, "Sum": 1,
    }  # fmt: skip
    for stage in stage_names():
        record = json.loads((result.root / stage / "stage.json").read_text())
        by_name = {m["name"]: m for m in record["metrics"]}
        assert by_name["label"]["mismatched"] == 0, stage  # the int64 output, compared exactly
    lens = np.load(result.root / "export" / "reference.npz")["input.lens"]
    assert 1 <= lens.min() < 6  # some row reverses only its first tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    "opset, fold, dynamo", [(11, True, False), (17, True, False), (20, False, False), (18, True, True)]
)
def test_onnx_files_of_both_exporters(opset, fold, dynamo, tmp_path):
    path = torch_onnx(tmp_path / "tiny.onnx", opset=opset, fold=fold, dynamo=dynamo)
    assert_all_passed(run(path, model={"onnx": "tiny.onnx"}))


def _bad(tmp_path, kind):
    path = torch_onnx(tmp_path / "tiny.onnx", opset=13, fold=True)
    inputs = [{"name": "input", "shape": [1, 3, 32, 32]}]
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "external_data_missing":
        model = onnx.load(str(path))
        onnx.save(model, str(path), save_as_external_data=True, location="tiny.data", size_threshold=0)
        (tmp_path / "tiny.data").unlink()
    elif kind == "opset_too_old":
        model = onnx.load(str(path))
        model.opset_import[0].version = 9
        onnx.save(model, str(path))
    elif kind == "input_name":
        inputs = [{"name": "image", "shape": [1, 3, 32, 32]}]
    elif kind == "input_shape":
        inputs = [{"name": "input", "shape": [1, 3, 64, 64]}]
    return path, inputs


@pytest.mark.parametrize(
    "kind, error, words",
    [
        ("truncated", OnnxError, "not a readable ONNX model"),
        ("external_data_missing", OnnxError, "external data missing"),
        ("opset_too_old", OnnxError, "opset 9 is outside the supported range"),
        ("input_name", RecipeError, "takes ['input'], the recipe lists ['image']"),
        ("input_shape", RecipeError, "inputs.0.shape"),
    ],
)
def test_bad_onnx_sources_are_named_and_nothing_is_written(kind, error, words, tmp_path):
    path, inputs = _bad(tmp_path, kind)
    with pytest.raises(error) as err:
        run(path, model={"onnx": "tiny.onnx"}, inputs=inputs)
    assert words in str(err.value) and ("model.onnx" in str(err.value) or "inputs" in str(err.value))
    export = tmp_path / "runs" / "tiny" / "export"
    assert not (export / "model.onnx").exists() and not (export / "stage.json").exists()


def test_the_deeplab_onnx_recipe_says_to_convert_first(tmp_path):
    """recipes/deeplabv3plus_onnx.yaml reads build output: without it, exit 2 naming the file and
    ``make convert``, nothing written."""
    from conftest import REPO

    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "deeplabv3plus_onnx.yaml"
    recipe.write_text((REPO / "recipes" / "deeplabv3plus_onnx.yaml").read_text())
    done = cli("convert", "--recipe", str(recipe), cwd=tmp_path, timeout=120)
    text = flat(done.stdout + done.stderr)
    assert done.returncode == 2, text
    assert "runs/deeplabv3plus/export/model.onnx: file not found" in text and "make convert" in text
    assert not (tmp_path / "runs" / "deeplabv3plus_onnx" / "export" / "stage.json").exists()


def test_bad_onnx_source_exits_2_from_the_cli(tmp_path):
    path, _ = _bad(tmp_path, "truncated")
    recipe = write_recipe(tmp_path / "r.yaml", model={"onnx": "tiny.onnx"})
    done = cli("convert", "--recipe", str(recipe), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not a readable ONNX model" in flat(done.stdout + done.stderr)


@pytest.mark.parametrize(
    "model, words",
    [
        ({"onnx": "a.onnx", "factory": "tiny_models:tiny_net"}, "give one source"),
        ({}, "give one source"),
        ({"onnx": "a.onnx", "checkpoint": "w.pt"}, "an onnx source holds its weights"),
    ],
    ids=["both", "neither", "checkpoint"],
)
def test_model_source_fields(model, words, tmp_path):
    with pytest.raises(RecipeError, match=words):
        load_recipe(write_recipe(tmp_path / "r.yaml", model=model))
