"""Recipe validation: every problem names its field path."""

from __future__ import annotations

import pytest

from torch2ms.errors import RecipeError
from torch2ms.recipe import load_recipe, parse_recipe

BASE = {"name": "m", "model": {"factory": "tiny_models:tiny_net"}, "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}]}


def _with(path: str, value):
    import copy

    data = copy.deepcopy(BASE)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


def test_minimal_recipe_gets_defaults(tmp_path):
    r = parse_recipe(BASE, "r.yaml", tmp_path)
    assert r.check.rel_error == 1e-4 and r.check.cosine == 0.99999
    assert r.export.opset == 17 and r.rebuild.fuse_conv_bn_act and r.compile.graph_kernel == "auto"
    assert r.export.exporter == "auto"
    assert r.resolve("w.pt") == tmp_path / "w.pt"


@pytest.mark.parametrize(
    "path,value,expect",
    [
        ("compile.graph_kernal", True, "compile.graph_kernal: unknown key"),
        ("colour", "red", "colour: unknown key"),
        ("check.rel_error", 0, "check.rel_error"),
        ("check.rel_error", 2, "check.rel_error"),
        ("check.cosine", 1.5, "check.cosine"),
        ("export.opset", "seventeen", "export.opset"),
        ("export.exporter", "onnxscript", "export.exporter: Input should be 'auto', 'torchscript' or 'dynamo'"),
        ("model.factory", "no_colon", "model.factory"),
        ("compile.graph_kernel", "maybe", "compile.graph_kernel"),
    ],
)
def test_invalid_fields_are_named(path, value, expect, tmp_path):
    with pytest.raises(RecipeError) as err:
        parse_recipe(_with(path, value), "r.yaml", tmp_path)
    assert expect in str(err.value)
    assert str(err.value).startswith("r.yaml: invalid recipe")


@pytest.mark.parametrize("shape", [[1, 3, 0, 8], [1, -3, 8, 8]])  # [] is a scalar: tests/stages/test_scalar_inputs.py
def test_bad_shapes_are_rejected(shape, tmp_path):
    with pytest.raises(RecipeError, match=r"inputs\.0\.shape"):
        parse_recipe(_with("inputs", [{"name": "input", "shape": shape}]), "r.yaml", tmp_path)


def test_batch_sizes_single_or_list(tmp_path):
    one = parse_recipe(_with("inputs", [{"name": "input", "shape": [2, 3, 8, 8], "batch": 2}]), "r.yaml", tmp_path)
    assert one.batch_sizes() is None and one.inputs[0].batch_sizes() == (2,)
    many = parse_recipe(_with("inputs", [{"name": "input", "shape": [1, 3, 8, 8], "batch": [8, 1, 4]}]), "r.yaml")
    assert many.batch_sizes() == (1, 4, 8)
    assert parse_recipe(BASE, "r.yaml").batch_sizes() is None


@pytest.mark.parametrize(
    "batch, expect",
    [
        ([0, 1], r"inputs\.0\.batch: .*integers from 1 to 2048.*\[0\]"),
        ([1, 4096], r"inputs\.0\.batch: .*integers from 1 to 2048.*\[4096\]"),
        ([1, 2, 2], r"inputs\.0\.batch: .*lists a size twice"),
        ([], r"inputs\.0\.batch: .*an empty list"),
        ([2, 4], r"inputs\.0: .*batch \[2, 4\] does not include shape\[0\]=1"),
        (4, r"inputs\.0: .*batch \[4\] does not include shape\[0\]=1"),
        ("many", r"inputs\.0\.batch"),
    ],
)
def test_bad_batch_values_are_named(batch, expect, tmp_path):
    with pytest.raises(RecipeError, match=expect):
        parse_recipe(_with("inputs", [{"name": "input", "shape": [1, 3, 8, 8], "batch": batch}]), "r.yaml", tmp_path)


def test_inputs_with_different_batch_lists_are_refused(tmp_path):
    inputs = [
        {"name": "a", "shape": [1, 3, 8, 8], "batch": [1, 2]},
        {"name": "b", "shape": [1, 4], "batch": [1, 4]},
    ]
    with pytest.raises(RecipeError, match=r"inputs list different batch sizes \(\[1, 2\] vs \[1, 4\]\)"):
        parse_recipe(_with("inputs", inputs), "r.yaml", tmp_path)


def test_missing_required_fields_are_listed_together(tmp_path):
    with pytest.raises(RecipeError) as err:
        parse_recipe({"name": "m"}, "r.yaml", tmp_path)
    msg = str(err.value)
    assert "model: required field is missing" in msg and "inputs: required field is missing" in msg


def test_file_errors(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: not valid YAML at line"):
        load_recipe(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(RecipeError, match="must be a YAML mapping"):
        load_recipe(scalar)


def test_shipped_recipes_are_valid():
    from pathlib import Path

    for path in sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml")):
        assert load_recipe(path).name == path.stem
