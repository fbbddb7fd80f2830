"""``torch2ms check``: every unsupported op or attribute value of a model, without converting.

Unreadable files and opsets outside 11-23 through this command are tested in
tests/pipeline/test_bad_input.py (test_cli_check_command_on_bad_onnx)."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import onnx
import pytest
import torch
from conftest import run_cli, write_recipe
from onnx import TensorProto, helper

from torch2ms.errors import EXIT_USAGE
from torch2ms.pipeline.workspace import sha256_file


@pytest.fixture(autouse=True)
def _wide(wide_console):
    """Messages are compared unwrapped (see conftest.wide_console)."""


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def unsupported_model() -> onnx.ModelProto:
    """Two RandomNormalLikes (no converter), two NonZeros and a Unique (refused: data-dependent
    output shapes), a Conv whose weight is a runtime input (a value the converter refuses), and a
    supported Conv before them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])
    outs = [
        helper.make_tensor_value_info(name, elem, None)
        for name, elem in (("y", TensorProto.FLOAT), ("nz", TensorProto.INT64), ("nz2", TensorProto.INT64))
        + (("u", TensorProto.FLOAT), ("k", TensorProto.FLOAT))
    ]
    inits = [helper.make_tensor("w2", TensorProto.FLOAT, [3, 3, 3, 3], np.ones(81, np.float32))]
    nodes = [
        helper.make_node("Conv", ["x", "w2"], ["c0"], name="/stem/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("RandomNormalLike", ["c0"], ["g1"], name="/head/RandomNormalLike", seed=1.0),
        helper.make_node("RandomNormalLike", ["g1"], ["y"], name="/head/RandomNormalLike_1", seed=2.0),
        helper.make_node("NonZero", ["c0"], ["nz"], name="/mask/NonZero"),
        helper.make_node("NonZero", ["x"], ["nz2"], name="/mask/NonZero_1"),
        helper.make_node("Unique", ["x"], ["u"], name="/vals/Unique"),
        helper.make_node("Conv", ["x", "w"], ["k"], name="/dyn/Conv"),
    ]
    graph = helper.make_graph(nodes, "g", [x, w], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_unsupported_op_and_value_is_reported_grouped(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save(unsupported_model(), path)
    assert run_cli("check", str(path), "--shape", "w=4,3,3,3") == EXIT_USAGE
    captured = capsys.readouterr()
    msg = captured.err
    assert f"error: 4 op types in {path} (opset 17) cannot be converted:" in flat(msg)
    assert re.search(r"RandomNormalLike\s+x2\s+no converter\s+first node: /head/RandomNormalLike\n", msg), msg
    assert re.search(r"NonZero\s+x2\s+refused: its output shape depends on the data.*first node: /mask/NonZero\n", msg)
    assert re.search(r"Unique\s+x1\s+refused: its output shape depends on the data.*first node: /vals/Unique\n", msg)
    assert re.search(r"Conv\s+x1\s+weight \(input 1\) must be a constant\s+first node: /dyn/Conv\n", msg), msg
    assert "/stem/Conv" not in msg  # the supported node is not listed
    assert "hint: see `torch2ms ops` for the supported operators" in msg
    assert "OK" not in captured.out


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> tuple:
    from tiny_models import tiny_net

    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    buf = io.BytesIO()
    torch.onnx.export(
        tiny_net().eval(),
        (torch.randn(1, 3, 32, 32),),
        buf,
        dynamo=False,
        opset_version=17,
        input_names=["input"],
        training=torch.onnx.TrainingMode.PRESERVE,
    )
    path.write_bytes(buf.getvalue())
    return path, onnx.load(str(path))


def test_convertible_model_gets_an_ok_line(tiny_onnx, capsys):
    path, model = tiny_onnx
    assert run_cli("check", str(path)) == 0
    out = flat(capsys.readouterr().out)
    ops: dict[str, int] = {}
    const = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if all(i in const for i in n.input if i):  # Constant, Identity of a weight: folded away
            const.update(n.output)
        else:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    assert {"Conv", "BatchNormalization", "Add", "Resize", "Gemm"} <= set(ops)
    listing = ", ".join(f"{op} x{k}" for op, k in sorted(ops.items()))
    assert (
        f"OK {path} (opset 17): {sum(ops.values())} nodes of {len(ops)} op types, all convertible: {listing}" in out
    ), out


def test_a_dynamic_input_needs_its_shape(tmp_path, tiny_onnx, capsys):
    _, model = tiny_onnx
    dyn = onnx.ModelProto()
    dyn.CopyFrom(model)
    dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(dyn, path)
    assert run_cli("check", str(path)) == EXIT_USAGE
    err = flat(capsys.readouterr().err)
    assert (
        "input 'input' has a dynamic shape [None, 3, 32, 32]" in err
        and "hint: give its static shape with --shape NAME=1,3,224,224" in err
    )
    assert run_cli("check", str(path), "--shape", "input=2,3,32,32") == 0
    assert "all convertible" in capsys.readouterr().out
    assert run_cli("check", str(path), "--shape", "input=2,x") == EXIT_USAGE
    assert "--shape 'input=2,x': expected NAME=positive integers" in flat(capsys.readouterr().err)


def test_recipe_is_exported_once_then_reused(tmp_path, capsys):
    recipe = write_recipe(tmp_path / "tiny.yaml")
    onnx_path = tmp_path / "runs" / "tiny" / "export" / "model.onnx"
    assert run_cli("check", "--recipe", str(recipe)) == 0
    captured = capsys.readouterr()
    assert "export passed" in flat(captured.err) and f"OK {onnx_path} (opset 17)" in flat(captured.out)
    assert json.loads((onnx_path.parent / "stage.json").read_text())["status"] == "passed"
    digest, mtime = sha256_file(onnx_path), onnx_path.stat().st_mtime_ns
    assert run_cli("check", "--recipe", str(recipe)) == 0
    assert "export up to date" in flat(capsys.readouterr().err)
    assert sha256_file(onnx_path) == digest and onnx_path.stat().st_mtime_ns == mtime
    assert not (tmp_path / "runs" / "tiny" / "rebuild").exists()  # nothing converted


def test_recipe_with_unsupported_ops(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path / "bad.yaml",
        name="bad",
        model={"factory": "pipeline.test_bad_input:unsupported_ops"},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8]}],
    )
    assert run_cli("check", "--recipe", str(recipe)) == EXIT_USAGE
    msg = capsys.readouterr().err
    assert "2 op types in" in msg and "model.onnx (opset 17) cannot be converted" in flat(msg)
    assert re.search(r"NonZero\s+x2\s+refused: its output shape depends on the data", msg), msg
    assert re.search(r"Unique\s+x1\s+refused: its output shape depends on the data", msg), msg


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "error: nothing to check"),
        (["m.onnx", "--recipe", "r.yaml"], "error: give an ONNX file or --recipe, not both"),
        (["--recipe", "r.yaml", "--shape", "x=1"], "--shape is for an ONNX file"),
    ],
)
def test_argument_errors(tmp_path, monkeypatch, capsys, args, expected):
    write_recipe(tmp_path / "r.yaml")
    monkeypatch.chdir(tmp_path)
    assert run_cli("check", *args) == EXIT_USAGE
    assert expected in flat(capsys.readouterr().err)
