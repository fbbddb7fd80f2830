"""Bad input, one case at a time: every error names the culprit (recipe field path, file, node,
state_dict key) and says what to do, maps to the documented exit code (2 for bad input, 1 for a
failed check), and leaves nothing in the run folder that looks complete.

Most cases run the Runner in-process up to the stage that must refuse (no MindSpore needed);
a few go through ``python -m torch2ms`` to pin the exit codes and the printed message.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import REPO, TESTS, write_recipe
from onnx import TensorProto, helper
from torch import nn

from torch2ms.compare import Tolerance, compare_arrays, compare_outputs
from torch2ms.errors import (
    EXIT_CHECK_FAILED,
    EXIT_USAGE,
    CheckFailed,
    ModelError,
    OnnxError,
    RecipeError,
    UnsupportedOpsError,
)
from torch2ms.graph.load import load_onnx
from torch2ms.pipeline.runner import raise_for
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

# --- helpers ----------------------------------------------------------------------------------


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), COLUMNS="400", GLOG_v="3")
    return subprocess.run(
        [sys.executable, "-m", "torch2ms", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def flat(text: str) -> str:
    """Rich wraps long lines; compare messages with whitespace collapsed."""
    return re.sub(r"\s+", " ", text)


def assert_nothing_looks_complete(root: Path, aborted: str | None = None) -> None:
    """No partial folder, no lock, and no passed record for the stage that was refused."""
    if not root.exists():
        return
    assert not [p.name for p in root.iterdir() if p.name.endswith(".partial") or p.name.endswith(".old")]
    assert not (root / ".lock").exists()
    if aborted:
        rec = root / aborted / "stage.json"
        assert not rec.exists() or json.loads(rec.read_text())["status"] != "passed"


def run_until(recipe_path: Path, until: str = "export", logs: list | None = None):
    return pipeline_runner(load_recipe(recipe_path), log=(logs.append if logs is not None else lambda m: None)).run(
        until=until
    )


# Factories the recipes below point at (importable as `test_bad_input:...`: tests/ is on sys.path).


def raising_factory(**kwargs):
    raise RuntimeError("weights server unreachable")


def not_a_module(**kwargs):
    return {"conv": nn.Conv2d(3, 4, 3)}


class _Eig(nn.Module):
    def forward(self, x):
        return torch.linalg.eigvals(x[0, 0]).real


def eig_model():
    return _Eig()


class _ReturnsInt(nn.Module):
    def forward(self, x):
        return 3


def returns_int():
    return _ReturnsInt()


def linear_model():
    return nn.Linear(10, 2)


class _Branchy(nn.Module):
    """Python control flow on a tensor value: the trace keeps only the branch sample 0 took."""

    def forward(self, x):
        if x[0, 0, 0, 0] > 0:
            return x * 2
        return x - 1


def branchy():
    return _Branchy()


class _LogOfInput(nn.Module):
    def forward(self, x):
        return torch.log(x)  # negative inputs -> NaN in PyTorch's own output


def log_of_input():
    return _LogOfInput()


class _Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        """Two NonZeros and a Unique: ops whose output shape depends on the data, which torch2ms refuses."""
        y = self.conv(x)
        above, below = torch.nonzero(y > 0), torch.nonzero(y < 0)
        return above.float().sum(), below.float().sum(), torch.unique(y.round()).sum()


def unsupported_ops():
    return _Unsupported()


# --- recipe -----------------------------------------------------------------------------------


def test_cli_missing_recipe_file(tmp_path):
    r = cli("convert", "--recipe", "nope.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    msg = flat(r.stderr)
    assert "nope.yaml: recipe file not found" in msg and "pass an existing YAML file with --recipe" in msg
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()


def test_cli_invalid_yaml_names_line_and_column(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: tiny\nmodel:\n  factory: [unclosed\ninputs: []\n")
    r = cli("convert", "--recipe", "bad.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert re.search(r"bad\.yaml: not valid YAML at line \d+, column \d+", flat(r.stderr)), r.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_unknown_nested_key_suggests_the_field(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml", compile={"graph_kernal": "off"})
    r = cli("convert", "--recipe", "tiny.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    msg = flat(r.stderr)
    assert "tiny.yaml: invalid recipe (1 problem)" in msg
    assert (
        "compile.graph_kernal: unknown key; did you mean 'graph_kernel'?" in msg
        and "allowed here: graph_kernel," in msg
    )
    assert not (tmp_path / "runs").exists() and path.exists()


def test_cli_unknown_stage_and_unknown_option(tmp_path):
    write_recipe(tmp_path / "tiny.yaml")
    r = cli("convert", "--recipe", "tiny.yaml", "--from", "bogus", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "--from 'bogus' is not a stage; choose one of export, rebuild, fold, compile, mindir" in flat(r.stderr)
    assert not (tmp_path / "runs").exists()
    r = cli("convert", "--recipe", "tiny.yaml", "--frmo", "fold", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and "No such option: --frmo" in flat(r.stderr), r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            {"compile": {"warmup": "two"}},
            "compile.warmup: Input should be a valid integer, unable to parse string as an integer (got 'two')",
        ),
        (
            {"inputs": [{"name": "input", "shape": [1, 3, 0, 32]}]},
            "inputs.0.shape: Value error, every dimension must be a positive integer, got [1, 3, 0, 32]",
        ),
        (
            {"inputs": [{"name": "input", "shape": [1, -3, 32, 32]}]},
            "inputs.0.shape: Value error, every dimension must be a positive integer, got [1, -3, 32, 32]",
        ),
        (
            {"inputs": [{"name": "input", "shape": "1x3x32x32"}]},
            "inputs.0.shape: Input should be a valid tuple (got '1x3x32x32')",
        ),
        ({"check": {"rel_error": 0}}, "check.rel_error: Input should be greater than 0 (got 0)"),
        ({"check": {"rel_error": 2}}, "check.rel_error: Input should be less than or equal to 1 (got 2)"),
        ({"check": {"cosine": 1.5}}, "check.cosine: Input should be less than or equal to 1 (got 1.5)"),
        ({"check": {"sampels": 3}}, "check.sampels: unknown key; did you mean 'samples'?"),
        (
            {"model": {"factory": "tiny_models.tiny_net"}},
            "model.factory: Value error, expected 'module:callable', got 'tiny_models.tiny_net'",
        ),
        (
            {"compile": {"graph_kernel": "maybe"}},
            "compile.graph_kernel: Input should be 'auto', 'on' or 'off' (got 'maybe')",
        ),
    ],
    ids=[
        "wrong-type",
        "shape-0",
        "shape-negative",
        "shape-string",
        "rel-error-0",
        "rel-error-2",
        "cosine-1.5",
        "nested-typo",
        "factory-form",
        "literal",
    ],
)
def test_invalid_recipe_field_is_named_with_its_path(tmp_path, overrides, expected):
    path = write_recipe(tmp_path / "tiny.yaml", **overrides)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.exit_code == EXIT_USAGE
    msg = str(info.value)
    assert msg.startswith(f"{path}: invalid recipe (1 problem)"), msg
    assert expected in msg


def test_all_recipe_problems_are_listed_at_once(tmp_path):
    path = write_recipe(
        tmp_path / "tiny.yaml",
        check={"rel_error": 0, "cosine": 1.5},
        compile={"graph_kernal": "off"},
        inputs=[{"shape": [0]}],
    )
    with pytest.raises(RecipeError, match=r"invalid recipe \(4 problems\)") as info:
        load_recipe(path)
    for field in ("check.rel_error", "check.cosine", "compile.graph_kernal", "inputs.0.shape"):
        assert f"  {field}: " in str(info.value)


def test_recipe_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- name: tiny\n")
    with pytest.raises(RecipeError, match=r"list\.yaml: a recipe must be a YAML mapping, got list"):
        load_recipe(path)


# --- model ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory, expected",
    [
        ("no_such_module_t2ms:net", "model.factory: cannot import module 'no_such_module_t2ms': ModuleNotFoundError"),
        ("tiny_models:no_such_net", "model.factory: module 'tiny_models' has no attribute 'no_such_net'"),
        (
            "pipeline.test_bad_input:raising_factory",
            "model.factory: pipeline.test_bad_input:raising_factory(**{}) raised RuntimeError: "
            "weights server unreachable",
        ),
        (
            "pipeline.test_bad_input:not_a_module",
            "model.factory: pipeline.test_bad_input:not_a_module returned dict, not a torch.nn.Module",
        ),
        (
            "pipeline.test_bad_input:returns_int",
            "the model returned int; torch2ms needs tensors, a tuple or a dict of tensors",
        ),
        (
            "pipeline.test_bad_input:linear_model",
            (
                "pipeline.test_bad_input:linear_model: the model raised on the recipe's inputs (input [1, 3, 32, 32]): "
                "RuntimeError: mat1 and mat2 shapes cannot be multiplied"
            ),
        ),
    ],
    ids=["not-importable", "no-attribute", "raises", "not-a-module", "returns-int", "wrong-input-shape"],
)
def test_bad_model_factory(tmp_path, factory, expected):
    path = write_recipe(tmp_path / "tiny.yaml", model={"factory": factory})
    with pytest.raises(ModelError) as info:
        run_until(path)
    assert info.value.exit_code == EXIT_USAGE
    assert expected in str(info.value), str(info.value)
    assert_nothing_looks_complete(tmp_path / "runs" / "tiny", "export")
    assert not (tmp_path / "runs" / "tiny" / "export").exists()


def test_a_recipe_refused_before_its_first_stage_leaves_no_run_folder(tmp_path):
    """The run folder (and the ``output`` folder made for it) goes when the refusal left it empty;
    a folder that was there before stays, and so does one a stage wrote into."""
    path = write_recipe(tmp_path / "tiny.yaml", model={"factory": "pipeline.test_bad_input:no_such_factory"})
    with pytest.raises(ModelError):
        run_until(path)
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    with pytest.raises(ModelError):
        run_until(path)
    assert (tmp_path / "runs" / "tiny").is_dir() and not any((tmp_path / "runs" / "tiny").iterdir())
    (tmp_path / "runs" / "tiny").rmdir()
    (tmp_path / "runs").rmdir()
    r = cli("convert", "--recipe", "tiny.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and "no_such_factory" in flat(r.stderr), r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_cli_model_that_fails_onnx_export_gives_the_exporters_reason(tmp_path):
    write_recipe(tmp_path / "tiny.yaml", model={"factory": "pipeline.test_bad_input:eig_model"})
    r = cli("convert", "--recipe", "tiny.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE, r.stderr
    msg = flat(r.stderr)
    assert (
        "torch.onnx.export failed for pipeline.test_bad_input:eig_model on every path (export.exporter: auto): "
        "torchscript opset 17: UnsupportedOperatorError: Exporting the operator 'aten::linalg_eigvals' to ONNX "
        "opset version 17 is not supported (opsets 18-20 not tried: no opset has a symbolic for it) "
        "dynamo opset 18: "
    ) in msg
    assert "hint:" in msg and "Traceback" not in r.stderr
    root = tmp_path / "runs" / "tiny"
    assert_nothing_looks_complete(root, "export")
    assert not (root / "export").exists()


def test_data_dependent_branch_is_warned_about_and_caught_by_the_check(tmp_path):
    path = write_recipe(
        tmp_path / "tiny.yaml", model={"factory": "pipeline.test_bad_input:branchy"}, check={"samples": 4, "seed": 0}
    )
    from torch2ms.samples import sample_inputs

    signs = {bool(s["input"][0, 0, 0, 0] > 0) for s in sample_inputs(load_recipe(path))}
    assert signs == {True, False}, "the samples must take both branches for this test to mean anything"
    logs: list[str] = []
    result = run_until(path, logs=logs)
    assert any(
        "export: the trace may not generalize to other inputs" in m
        and "test_bad_input.py" in m
        and "Python boolean" in m
        for m in logs
    ), logs
    export = result.stages[0]
    assert export.status == "failed" and "relative error" in export.reason
    assert export.record["extra"]["tracer_warnings"]
    with pytest.raises(CheckFailed) as info:
        raise_for(result)
    assert info.value.exit_code == EXIT_CHECK_FAILED


# --- checkpoint -------------------------------------------------------------------------------


def _ckpt_recipe(tmp_path: Path, name: str = "weights.pt") -> Path:
    return write_recipe(
        tmp_path / "tiny.yaml",
        model={"factory": "tiny_models:tiny_net", "kwargs": {"num_classes": 5}, "checkpoint": name},
    )


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(RecipeError) as info:
        run_until(_ckpt_recipe(tmp_path))
    assert info.value.exit_code == EXIT_USAGE
    assert f"model.checkpoint: {tmp_path / 'weights.pt'}: file not found" in str(info.value)
    assert "relative path starts at the recipe's folder" in str(info.value)
    assert_nothing_looks_complete(tmp_path / "runs" / "tiny", "export")


@pytest.mark.parametrize(
    "content, expected",
    [
        ([torch.zeros(3), torch.ones(2)], "is not a state_dict (a mapping of names to tensors)"),
        (torch.zeros(4, 4), "is not a state_dict (a mapping of names to tensors)"),
        ({"stem.0.weight": "not a tensor"}, "is not a state_dict (a mapping of names to tensors)"),
        (b"just some text, not a zip or a pickle", "is not a PyTorch checkpoint"),
    ],
    ids=["list", "tensor", "dict-of-str", "text-file"],
)
def test_checkpoint_that_is_not_a_state_dict(tmp_path, content, expected):
    path = _ckpt_recipe(tmp_path)
    if isinstance(content, bytes):
        (tmp_path / "weights.pt").write_bytes(content)
    else:
        torch.save(content, tmp_path / "weights.pt")
    with pytest.raises(ModelError) as info:
        run_until(path)
    assert info.value.exit_code == EXIT_USAGE
    assert f"model.checkpoint: {tmp_path / 'weights.pt'} " in str(info.value) and expected in str(info.value)
    assert_nothing_looks_complete(tmp_path / "runs" / "tiny", "export")
    assert not (tmp_path / "runs" / "tiny" / "export").exists()


def test_checkpoint_mismatch_lists_every_missing_unexpected_and_misshaped_key(tmp_path):
    from tiny_models import tiny_net

    state = tiny_net(num_classes=5).state_dict()
    del state["stem.1.running_var"], state["head.bias"]
    state["extra.weight"] = torch.zeros(1)
    state["module.stem.0.weight"] = torch.zeros(1)
    state["head.weight"] = torch.zeros(7, 8)
    state["block.0.weight"] = torch.zeros(8, 8, 5, 5)
    torch.save(state, tmp_path / "weights.pt")
    with pytest.raises(ModelError) as info:
        run_until(_ckpt_recipe(tmp_path))
    msg = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert "missing keys (2): head.bias, stem.1.running_var" in msg
    assert "unexpected keys (2): extra.weight, module.stem.0.weight" in msg
    assert (
        "shape mismatches (2): block.0.weight: checkpoint [8, 8, 5, 5] vs model [8, 8, 3, 3], head.weight: "
        "checkpoint [7, 8] vs model [5, 8]"
    ) in msg
    assert "is it the checkpoint of this model and these model.kwargs?" in msg
    assert not (tmp_path / "runs" / "tiny" / "export").exists()


class _RunsCode:
    """Unpickling this runs a shell command (the classic malicious checkpoint)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"
    torch.save({"stem.0.weight": torch.zeros(1), "payload": _RunsCode(marker)}, tmp_path / "weights.pt")
    with pytest.raises(ModelError) as info:
        run_until(_ckpt_recipe(tmp_path))
    msg = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert f"model.checkpoint: {tmp_path / 'weights.pt'} was refused by torch.load(weights_only=True)" in msg
    assert re.search(r"GLOBAL (posix|os)\.system", msg), msg
    assert "weights_only` set to `False`" not in msg and "save only model.state_dict()" in msg
    assert not marker.exists(), "the checkpoint's code ran"
    assert not (tmp_path / "runs" / "tiny" / "export").exists()
    # control: the same file executes its payload when loaded without weights_only
    torch.load(tmp_path / "weights.pt", weights_only=False)
    assert marker.exists()


# --- ONNX given directly ----------------------------------------------------------------------


def _relu_model(opset: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.fixture(scope="module")
def good_onnx_bytes() -> bytes:
    import io

    from tiny_models import tiny_net

    buf = io.BytesIO()
    torch.onnx.export(
        tiny_net().eval(), (torch.randn(1, 3, 32, 32),), buf, dynamo=False, opset_version=17, input_names=["input"]
    )
    return buf.getvalue()


@pytest.mark.parametrize("fraction", [0.001, 0.1, 0.5, 0.9, 0.999])
def test_truncated_onnx(tmp_path, good_onnx_bytes, fraction):
    path = tmp_path / "model.onnx"
    path.write_bytes(good_onnx_bytes[: max(1, int(len(good_onnx_bytes) * fraction))])
    with pytest.raises(OnnxError) as info:
        load_onnx(path, {"input": (1, 3, 32, 32)})
    assert info.value.exit_code == EXIT_USAGE
    assert str(info.value).startswith(f"{path}: not a readable ONNX model")
    assert "is the file truncated? re-export it" in str(info.value)


@pytest.mark.parametrize(
    "content", [b"", b"hello, I am a text file\n", b"PK\x03\x04" + bytes(200)], ids=["empty", "text", "zip"]
)
def test_non_onnx_file(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(OnnxError) as info:
        load_onnx(path)
    assert str(info.value).startswith(f"{path}: not "), str(info.value)
    assert "hint:" in str(info.value)


def test_missing_onnx_file(tmp_path):
    with pytest.raises(OnnxError, match=r"nothere\.onnx: file not found"):
        load_onnx(tmp_path / "nothere.onnx")


@pytest.mark.parametrize("opset", [9, 10])
def test_opset_outside_supported_range(tmp_path, opset):
    path = tmp_path / "model.onnx"
    onnx.save(_relu_model(opset), path)
    with pytest.raises(OnnxError) as info:
        load_onnx(path)
    assert f"{path}: opset {opset} is outside the supported range 11-23" in str(info.value)
    assert "re-export with opset_version between 11 and 23 (recipe field export.opset)" in str(info.value)


def test_opset_bounds_are_accepted(tmp_path):
    for opset in (11, 23, 28):  # 28: Relu is the same op as at 23 (tests/conformance/test_loader.py)
        onnx.save(_relu_model(opset), tmp_path / f"m{opset}.onnx")
        assert load_onnx(tmp_path / f"m{opset}.onnx").opset == opset


def test_unsupported_ops_are_all_listed_grouped_by_op(tmp_path):
    from commands.test_check import unsupported_model

    from torch2ms.codegen.convert import convert_graph

    path = tmp_path / "model.onnx"
    onnx.save(unsupported_model(), path)
    g = load_onnx(path, {"w": (4, 3, 3, 3)})
    with pytest.raises(UnsupportedOpsError) as info:
        convert_graph(g, "Net", "model.onnx", "0" * 64, "net")
    msg = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert msg.startswith("4 op types in model.onnx (opset 17) cannot be converted:"), msg
    assert re.search(r"RandomNormalLike\s+x2\s+no converter\s+first node: /head/RandomNormalLike\n", msg), msg
    assert re.search(r"NonZero\s+x2\s+refused: .*first node: /mask/NonZero\n", msg), msg
    assert re.search(r"Conv\s+x1\s+weight \(input 1\) must be a constant\s+first node: /dyn/Conv", msg), msg
    assert {p.op_type for p in info.value.problems} == {"RandomNormalLike", "NonZero", "Unique", "Conv"}
    assert "torch2ms ops" in msg  # the hint: where to see what is supported


def test_unsupported_ops_in_the_rebuild_stage_abort_it_cleanly(tmp_path):
    path = write_recipe(
        tmp_path / "tiny.yaml",
        model={"factory": "pipeline.test_bad_input:unsupported_ops"},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8]}],
    )
    with pytest.raises(UnsupportedOpsError) as info:
        run_until(path, until="rebuild")
    msg = str(info.value)
    assert "2 op types in model.onnx (opset 17) cannot be converted" in msg
    assert re.search(r"NonZero\s+x2\s+refused: its output shape depends on the data", msg) and "Unique" in msg, msg
    root = tmp_path / "runs" / "tiny"
    assert json.loads((root / "export" / "stage.json").read_text())["status"] == "passed"
    assert_nothing_looks_complete(root, "rebuild")
    assert not (root / "rebuild").exists()


def test_cli_check_command_on_bad_onnx(tmp_path):
    (tmp_path / "trunc.onnx").write_bytes(onnx.shape_inference.infer_shapes(_relu_model(17)).SerializeToString()[:20])
    onnx.save(_relu_model(10), tmp_path / "old.onnx")
    r = cli("check", "trunc.onnx", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and "trunc.onnx" in r.stderr + r.stdout, r.stderr
    r = cli("check", "old.onnx", cwd=tmp_path)
    assert r.returncode == EXIT_USAGE and "opset 10" in flat(r.stderr + r.stdout), r.stderr


# --- NaN / Inf --------------------------------------------------------------------------------


LOOSEST = Tolerance(rel_error=1.0, cosine=0.5)


def test_nan_or_inf_is_never_within_tolerance():
    ref = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    cases = {
        "reference NaN": (ref, np.where(ref > 0.5, np.nan, ref).astype(np.float32), "reference output has 3 NaN"),
        "same NaN both sides": (
            np.where(ref > 0.5, np.nan, ref),
            np.where(ref > 0.5, np.nan, ref),
            "reference output has 3 NaN",
        ),
        "stage Inf": (np.where(ref == ref.max(), np.inf, ref), ref, "stage output has 1 Inf"),
        "stage -Inf and NaN": (
            np.where(ref < -0.5, -np.inf, np.where(ref > 0.9, np.nan, ref)),
            ref,
            "stage output has 1 NaN and 3 Inf",
        ),
    }
    for label, (actual, reference, expected) in cases.items():
        m = compare_arrays("out", actual, reference)
        assert m.nonfinite == expected, label
        assert LOOSEST.violations(m) == [expected], label
        assert all(isinstance(v, str) or v is None or math.isfinite(v) for v in m.to_dict().values()), label
        json.dumps(m.to_dict(), allow_nan=False)


def test_compare_outputs_flags_per_output_name():
    ref = [{"a": np.ones((1, 3), np.float32), "b": np.ones((1, 2), np.float32)}]
    act = [{"a": np.ones((1, 3), np.float32), "b": np.array([[1.0, np.inf]], np.float32)}]
    ma, mb = compare_outputs(act, ref)
    assert ma.nonfinite is None and LOOSEST.violations(ma) == []
    assert mb.nonfinite == "stage output has 1 Inf"


def test_cli_nan_in_pytorch_reference_fails_the_export_stage(tmp_path):
    write_recipe(
        tmp_path / "tiny.yaml",
        model={"factory": "pipeline.test_bad_input:log_of_input"},
        inputs=[{"name": "input", "shape": [1, 3, 4, 4]}],
    )
    r = cli("convert", "--recipe", "tiny.yaml", cwd=tmp_path)
    assert r.returncode == EXIT_CHECK_FAILED, r.stderr
    msg = flat(r.stderr)
    assert re.search(
        r"stage 'export' failed: PyTorch's own output is not finite on the sample inputs \(output 'output': reference "
        r"output has \d+ NaN\)",
        msg,
    ), msg
    assert "fix the model, its weights" in msg and "within tolerance" not in msg
    root = tmp_path / "runs" / "tiny"
    record = json.loads((root / "export" / "stage.json").read_text())
    assert record["status"] == "failed" and "NaN" in record["violations"][0]
    assert record["worst"]["nonfinite"].startswith("reference output has")
    report = json.loads((root / "report.json").read_text())
    assert not report["passed"] and [s["status"] for s in report["stages"]] == ["failed"] + ["not run"] * 4
    assert_nothing_looks_complete(root)


def test_stage_output_with_inf_fails_that_stage(tmp_path, monkeypatch):
    from torch2ms.pipeline.report import write_reports
    from torch2ms.stages.fold import FoldStage

    original = FoldStage.run

    def fold_with_inf(self, ctx, out):
        produced = original(self, ctx, out)
        produced.outputs[1]["output"].flat[2] = np.inf
        return produced

    monkeypatch.setattr(FoldStage, "run", fold_with_inf)
    path = write_recipe(tmp_path / "tiny.yaml", check={"samples": 2, "rel_error": 1.0, "cosine": 0.5})
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    write_reports(result)
    status = {s.stage: s.status for s in result.stages}
    assert status == {
        "export": "passed",
        "rebuild": "passed",
        "fold": "failed",
        "compile": "not run",
        "mindir": "not run",
    }
    assert result.failed_stage.reason == "output 'output': stage output has 1 Inf"
    record = json.loads((result.root / "fold" / "stage.json").read_text())
    assert record["status"] == "failed" and record["worst"]["rel_error"] == "nan"
    with pytest.raises(
        CheckFailed, match="stage 'fold' is out of tolerance against PyTorch: output 'output': stage output has 1 Inf"
    ) as info:
        raise_for(result)
    assert info.value.exit_code == EXIT_CHECK_FAILED
    assert "| fold | failed |" in (result.root / "report.md").read_text()
    assert_nothing_looks_complete(result.root)


def test_stage_output_of_the_wrong_shape_fails_the_stage_cleanly(tmp_path, monkeypatch):
    from torch2ms.errors import StageFailed
    from torch2ms.pipeline.stage import StageOutput
    from torch2ms.stages.rebuild import RebuildStage

    def wrong_shape(self, ctx, out):
        (out / "network.py").write_text("# half\n")
        return StageOutput([{"output": np.zeros((1, 4), np.float32)} for _ in ctx.reference_inputs()])

    monkeypatch.setattr(RebuildStage, "run", wrong_shape)
    path = write_recipe(tmp_path / "tiny.yaml")
    with pytest.raises(
        StageFailed,
        match=(
            r"stage 'rebuild' failed after \['export'\]: its outputs cannot be compared with PyTorch's: output "
            r"'output': shape \(1, 4\) differs from the reference's \(1, 5\)"
        ),
    ) as info:
        run_until(path, until="rebuild")
    assert info.value.exit_code == EXIT_CHECK_FAILED
    root = tmp_path / "runs" / "tiny"
    assert_nothing_looks_complete(root, "rebuild")
    assert not (root / "rebuild").exists()


def test_missing_sample_data_file(tmp_path):
    path = write_recipe(
        tmp_path / "tiny.yaml", inputs=[{"name": "input", "shape": [1, 3, 32, 32], "data": "missing.npy"}]
    )
    with pytest.raises(RecipeError) as info:
        run_until(path)
    assert info.value.exit_code == EXIT_USAGE
    assert f"inputs.input.data: {tmp_path / 'missing.npy'}: file not found" in str(info.value)
    assert_nothing_looks_complete(tmp_path / "runs" / "tiny", "export")


def test_sample_data_of_the_wrong_shape(tmp_path):
    np.save(tmp_path / "sample.npy", np.zeros((1, 3, 16, 16), np.float32))
    path = write_recipe(
        tmp_path / "tiny.yaml", inputs=[{"name": "input", "shape": [1, 3, 32, 32], "data": "sample.npy"}]
    )
    with pytest.raises(
        RecipeError,
        match=r"inputs\.input\.data: .*sample\.npy has shape \[1, 3, 16, 16\], the recipe says \[1, 3, 32, 32\]",
    ):
        run_until(path)
    assert not (tmp_path / "runs" / "tiny" / "export").exists()
