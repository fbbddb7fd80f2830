"""Dynamic batch (``inputs[].batch``): generated code that follows the input's batch, one MindIR
serving every listed size, the board tools' settings in the bundle, and ``verify`` at every size
against PyTorch. Plus the pieces: the batch-literal rewrite, the targets' refusals."""

from __future__ import annotations

import json
import re
import tarfile

import numpy as np
import pytest
import torch
from conftest import unpack_bundle, write_recipe

from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.targets import TARGETS, check_batch
from torch2ms.bundle.verify import verify_bundle
from torch2ms.codegen.batch import BatchDependent, batch_expr, merge_all
from torch2ms.errors import Torch2msError
from torch2ms.model_loader import build_model, flatten_outputs
from torch2ms.pipeline.workspace import load_npz, split_batches
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

SIZES = [1, 2, 4]


# --- the rewrite of batch-carrying integers ---
def merge(first: str, second: str, name: str, where: str):
    """The code of two conversions, at batch 1 and 2, merged in the symbol ``name``."""
    return merge_all([first, second], [(1,), (2,)], [name], where)


def test_merge_writes_the_sizes_that_move_with_the_batch():
    code, used = merge("ops.reshape(x, (1, 1024))", "ops.reshape(x, (2, 1024))", "batch", "n")
    assert (code, used) == ("ops.reshape(x, (batch, 1024))", {"batch"})
    # a flattened batch (B * 3) and an offset; a compound expression inside an operator gets parentheses
    code, _ = merge("ops.zeros((3, 5), ms.float32) * 4", "ops.zeros((6, 5), ms.float32) * 5", "b", "n")
    assert code == "ops.zeros((b * 3, 5), ms.float32) * (b + 3)"
    assert batch_expr(4, -1, "batch") == "batch * 4 - 1"
    assert merge("ops.relu(x)", "ops.relu(x)", "batch", "n") == ("ops.relu(x)", set())


@pytest.mark.parametrize(
    "first, second",
    [
        ("ops.mul(x, 0.5)", "ops.mul(x, 0.25)"),  # a float that moves: not a size
        ("ops.reshape(x, (1, 8))", "ops.reshape(x, (1, 8, 1))"),  # a different structure
        ("ops.add(x, self.a)", "ops.add(x, self.b)"),  # a different name
    ],
)
def test_merge_refuses_what_a_batch_symbol_cannot_express(first, second):
    with pytest.raises(BatchDependent, match="differs beyond its sizes"):
        merge(first, second, "batch", "node X")


# --- the board tools' limits ---
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_targets_refuse_more_profiles_than_atc_takes(target):
    inputs = [{"name": "input", "shape": [1, 3, 8, 8], "batch": list(range(1, 102))}]
    with pytest.raises(Torch2msError, match=r"101 sizes; .*at most 100 profiles"):
        check_batch(TARGETS[target], inputs)
    assert check_batch(TARGETS[target], [{"name": "input", "shape": [1, 3, 8, 8], "batch": [1, 2]}]) == (1, 2)
    assert check_batch(TARGETS[target], [{"name": "input", "shape": [1, 3, 8, 8]}]) is None


def test_targets_refuse_a_batch_without_a_dimension_for_it():
    with pytest.raises(Torch2msError, match="N first in a shape of rank 2"):
        check_batch(TARGETS["atlas-300i-pro"], [{"name": "v", "shape": [1], "batch": [1, 2]}])


def test_shape_ranges_are_off_on_310b_only():
    # ATC --input_shape docs: Atlas 200I/500 A2 inference products cannot set a shape range; torch2ms
    # writes profiles (--dynamic_batch_size), which every target takes
    assert {t.name for t in TARGETS.values() if not t.shape_ranges} == {"atlas-200i-dk-a2", "atlas-200i-a2"}


# --- the whole path on the tiny model ---
@pytest.fixture(scope="module")
def batch_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    path = write_recipe(
        d / "tinyb.yaml", name="tinyb", inputs=[{"name": "input", "shape": [1, 3, 32, 32], "batch": SIZES}]
    )
    recipe = load_recipe(path)
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, d / "dist", log=lambda m: None).path
    return recipe, result, bundle


def test_generated_code_has_no_batch_literal(batch_bundle):
    _, result, _ = batch_bundle
    for stage in ("rebuild", "fold"):
        src = (result.root / stage / "network.py").read_text()
        construct = src.split("def construct")[-1]  # the network's class is the last
        assert "batch = input.shape[0]" in construct  # the recipe input's own name
        # the classifier's flatten: written (1, 8) before; the batch comes from the input now
        assert "ops.reshape(global_average_pool, (batch, 8))" in construct
        assert not re.search(r"ops\.(reshape|broadcast_to|zeros|full)\([^\n]*\(1, ", construct), construct


def test_every_listed_size_is_checked_against_pytorch(batch_bundle):
    recipe, result, bundle = batch_bundle
    batches = split_batches(load_npz(result.root / "export" / "reference.npz"))
    assert sorted(batches) == [2, 4]
    # the stored reference at each size is PyTorch's, recomputed here
    model = build_model(recipe)
    with torch.no_grad():
        for size, (ins, outs) in batches.items():
            assert ins["input"].shape == (size, 3, 32, 32)
            got = flatten_outputs(model(torch.from_numpy(ins["input"])))
            np.testing.assert_allclose(got["output"].numpy(), outs["output"], rtol=0, atol=1e-6)
    for stage in ("export", "mindir"):
        record = next(s.record for s in result.stages if s.stage == stage)
        assert sorted(record["batches"]) == ["2", "4"]
        assert all(m["rel_error"] < 1e-5 for m in record["batches"].values()), record["batches"]
    verified = verify_bundle(bundle, log=lambda m: None)
    assert sorted(verified.batches) == [2, 4]
    for metrics in verified.batches.values():
        assert all(m.rel_error < 1e-5 and m.cosine > 0.99999 for m in metrics)


def test_bundle_carries_the_board_tools_settings(batch_bundle):
    _, _, bundle = batch_bundle
    with tarfile.open(bundle) as tar:
        atc = tar.extractfile("targets/atlas-200i-dk-a2/atc.sh").read().decode()
        cfg = tar.extractfile("targets/atlas-200i-dk-a2/converter_lite.cfg").read().decode()
        lite = tar.extractfile("targets/atlas-200i-dk-a2/converter_lite.sh").read().decode()
        warnings = json.loads(tar.extractfile("compatibility.json").read())["warnings"]
    # the served batch is not the "fix it at export time" kind of dynamic shape
    assert not [w for w in warnings if "dynamic shape" in w], warnings
    assert '--input_shape="input:-1,3,32,32"' in atc and '--dynamic_batch_size="1,2,4"' in atc
    assert "input_shape=input:[-1,3,32,32]\ndynamic_dims=[1],[2],[4]\n" in cfg  # one input: one group
    assert "--inputShape" not in lite  # converter_lite takes a dynamic batch's shape from the config


def test_verify_fails_when_a_batch_size_is_wrong(batch_bundle, tmp_path):
    """The extra sizes are really compared: a bundle whose batch-4 reference is off fails verify."""
    from torch2ms.bundle.archive import write_archive

    _, _, bundle = batch_bundle
    root = tmp_path / "x"
    unpack_bundle(bundle, root)  # the project's checked extraction: tarfile's filter= is Python >= 3.11.4
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    arrays = load_npz(root / "samples" / "reference.npz")
    arrays["batch4.output.output"] = arrays["batch4.output.output"] + 1.0
    import hashlib
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    files["samples/reference.npz"] = buf.getvalue()
    manifest = json.loads(files["manifest.json"])
    manifest["files"]["samples/reference.npz"] = hashlib.sha256(buf.getvalue()).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    write_archive(tmp_path / "bad.tar.gz", files)
    with pytest.raises(Torch2msError, match=r"at batch 4, output 'output'"):
        verify_bundle(tmp_path / "bad.tar.gz", log=lambda m: None)


def test_a_model_whose_code_cannot_follow_the_batch_is_refused_by_name(tmp_path):
    path = write_recipe(
        tmp_path / "fixed.yaml",
        name="fixed",
        model={"factory": "stages.test_dynamic_batch:fixed_batch_net"},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8], "batch": [1, 2]}],
    )
    result = None
    with pytest.raises(Torch2msError, match=r"cannot serve several batch sizes") as err:
        result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert result is None and "hint" in str(err.value)


@pytest.mark.slow
def test_the_dynamo_exporter_writes_a_dynamic_batch(tmp_path):
    """export.exporter: dynamo with inputs[].batch: dimension 0 of the ONNX input is symbolic, and
    every listed size passes the export and mindir checks against PyTorch."""
    import onnx

    path = write_recipe(
        tmp_path / "dyn.yaml",
        name="dyn",
        export={"exporter": "dynamo", "opset": 18},
        inputs=[{"name": "input", "shape": [2, 3, 32, 32], "batch": [1, 2, 4]}],
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    export = next(s.record for s in result.stages if s.stage == "export")
    assert export["extra"]["export_path"]["exporter"] == "dynamo"
    (dim0, *_) = onnx.load(str(result.root / "export" / "model.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert dim0.dim_param and not dim0.dim_value
    for stage in ("export", "mindir"):
        record = next(s.record for s in result.stages if s.stage == stage)
        assert sorted(record["batches"]) == ["1", "4"]
        assert all(m["rel_error"] < 1e-5 for m in record["batches"].values()), record["batches"]


def test_the_dynamo_exporter_refuses_a_dynamic_batch_from_an_example_of_one(tmp_path):
    path = write_recipe(
        tmp_path / "dyn1.yaml",
        name="dyn1",
        export={"exporter": "dynamo", "opset": 18},
        inputs=[{"name": "input", "shape": [1, 3, 32, 32], "batch": [1, 2]}],
    )
    with pytest.raises(Torch2msError, match=r"example's is 1 .*give shape\[0\] >= 2"):
        pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert not (tmp_path / "runs" / "dyn1" / "export" / "model.onnx").exists()


def test_shape_ops_follow_the_batch(tmp_path):
    """Expand, Split, Reshape from Shape, Resize and a folded ConstantOfShape: checked at batch 3 too."""
    path = write_recipe(
        tmp_path / "ops.yaml",
        name="batchops",
        task="other",
        model={"factory": "stages.test_dynamic_batch:batch_ops_net"},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8], "batch": [1, 3]}],
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    construct = (result.root / "fold" / "network.py").read_text().split("def construct")[1]
    # the expanded parameter and torch.zeros(x.shape[0], 6), both folded: stored as one row each
    assert re.search(r"conv \+ ops\.broadcast_to\(self\.\w+, \(batch, 4, 8, 8\)\)", construct), construct
    assert re.search(r"fc \+ ops\.broadcast_to\(self\.\w+, \(batch, 6\)\)", construct), construct
    assert "ops.reshape(" in construct and "(batch, 256)" in construct
    mindir = next(s.record for s in result.stages if s.stage == "mindir")
    assert mindir["batches"]["3"]["rel_error"] < 1e-5


class _BatchOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 1, 1))
        self.fc = torch.nn.Linear(4 * 8 * 8, 6)

    def forward(self, x):
        y = self.conv(x) + self.bias.expand(x.shape[0], 4, 8, 8)
        a, b = torch.split(y, [1, 3], dim=1)
        y = torch.cat([b, a * 2], 1)
        y = torch.nn.functional.interpolate(y, size=(16, 16), mode="nearest")[:, :, ::2, ::2]
        return self.fc(y.reshape(x.shape[0], -1)) + torch.zeros(x.shape[0], 6)


def batch_ops_net():
    return _BatchOps()


class _FixedBatch(torch.nn.Module):
    """Adds a constant of the export's batch (a stored tensor of shape 1x3x8x8): the code cannot follow."""

    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.ones(1, 3, 8, 8))

    def forward(self, x):
        return x + self.c.expand(x.shape[0], 3, 8, 8).sum(0, keepdim=True)


def fixed_batch_net():
    return _FixedBatch()


def test_two_inputs_get_one_dynamic_dims_group_each(tmp_path):
    """Two inputs served at batch 1, 2, 4: ATC takes one --dynamic_batch_size for both, converter_lite
    one ``dynamic_dims`` group per input separated by ';' (MindSpore Lite "converter_tool_ascend",
    Dynamic Batch Size), and the MindIR matches PyTorch at every size."""
    recipe = load_recipe(
        write_recipe(
            tmp_path / "two.yaml",
            name="two",
            model={"factory": "tiny_models:two_inputs", "seed": 0},
            inputs=[
                {"name": "image", "shape": [1, 3, 16, 16], "batch": SIZES},
                {"name": "extra", "shape": [1, 4], "batch": SIZES},
            ],
        )
    )
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", log=lambda m: None).path
    with tarfile.open(bundle) as tar:
        atc = tar.extractfile("targets/atlas-200i-dk-a2/atc.sh").read().decode()
        cfg = tar.extractfile("targets/atlas-200i-dk-a2/converter_lite.cfg").read().decode()
    assert '--input_shape="image:-1,3,16,16;extra:-1,4"' in atc and '--dynamic_batch_size="1,2,4"' in atc
    assert "input_shape=image:[-1,3,16,16];extra:[-1,4]\ndynamic_dims=[1],[2],[4];[1],[2],[4]\n" in cfg
    verified = verify_bundle(bundle, log=lambda m: None)
    assert sorted(verified.batches) == [2, 4]
    assert all(m.rel_error < 1e-5 for metrics in verified.batches.values() for m in metrics)
