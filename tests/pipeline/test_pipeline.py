"""The runner: all five stages on a small model, skipping what is up to date, re-running what a
changed option or artifact invalidates, --from/--force, interrupted writes, a failed check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_recipe

from torch2ms.errors import CheckFailed
from torch2ms.pipeline.report import write_reports
from torch2ms.pipeline.runner import raise_for
from torch2ms.pipeline.workspace import load_npz
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner, stage_names


def run(recipe_path, **kw):
    result = pipeline_runner(load_recipe(recipe_path), log=lambda m: None).run(**kw)
    write_reports(result)
    return result


def statuses(result):
    return {s.stage: s.status for s in result.stages}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One full conversion shared by the read-only tests below, with Python writing .pyc files as it
    does by default (an environment may say PYTHONDONTWRITEBYTECODE=1)."""
    path = write_recipe(tmp_path_factory.mktemp("shared") / "tiny.yaml")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "dont_write_bytecode", False)
        return path, run(path)


def test_all_stages_pass_and_write_their_artifacts(converted):
    path, result = converted
    assert result.passed, statuses(result)
    # importing network.py left no bytecode cache among a stage's artifacts (it holds network.py's mtime)
    assert not list(result.root.rglob("__pycache__")) and not list(result.root.rglob("*.pyc"))
    assert statuses(result) == dict.fromkeys(stage_names(), "passed")
    root = result.root
    for stage, files in {
        "export": ["model.onnx", "reference.npz"],
        "rebuild": ["network.py", "network.ckpt", "tensor_map.json", "conversion.json"],
        "fold": ["network.py", "network.ckpt"],
        "compile": ["compile.json"],
        "mindir": ["network.mindir"],
    }.items():
        record = json.loads((root / stage / "stage.json").read_text())
        assert record["status"] == "passed" and record["fingerprint"]
        for f in files:
            assert (root / stage / f).is_file(), f"{stage}/{f}"
            assert f in record["artifacts"]
        assert record["worst"]["rel_error"] <= 1e-4 and record["worst"]["cosine"] >= 0.99999
    rebuild = json.loads((root / "rebuild" / "stage.json").read_text())["counts"]
    fold = json.loads((root / "fold" / "stage.json").read_text())["counts"]
    assert rebuild["conv2d_bn_act"] == 3 and rebuild["batchnorm_layers"] == 0
    assert fold["batchnorm_folded"] == 3 and fold["batchnorm_left"] == 0
    src = (root / "rebuild" / "network.py").read_text()
    assert (
        src.count("nn.Conv2dBnAct(") == 3
        and "has_bn=True" in src
        and "BatchNorm" not in src.split("class ")[1].split("def construct")[0].replace("Conv2dBnAct", "")
    )
    assert "has_bn=True" not in (root / "fold" / "network.py").read_text()
    report = json.loads((root / "report.json").read_text())
    assert report["passed"] and [s["stage"] for s in report["stages"]] == list(stage_names())
    assert "| rebuild | passed |" in (root / "report.md").read_text()


def test_reference_outputs_are_pytorchs(converted):
    path, result = converted
    ref = load_npz(result.root / "export" / "reference.npz")
    from tiny_models import tiny_net

    from torch2ms.model_loader import calibrate_norm

    torch.manual_seed(0)
    model = tiny_net(num_classes=5)
    assert calibrate_norm(model, [(1, 3, 32, 32)], 0) > 0  # the recipe's default init, done independently
    model.eval()
    with torch.no_grad():
        expect = model(torch.from_numpy(ref["input.input"][0])).numpy()
    np.testing.assert_allclose(ref["output.output"][0], expect, rtol=1e-6, atol=1e-6)


def test_rerun_skips_everything_and_options_invalidate_from_their_stage(tmp_path, monkeypatch):
    path = write_recipe(tmp_path / "tiny.yaml")
    first = run(path)
    assert first.passed
    # a person imports the generated networks by hand: the __pycache__ it leaves is not an artifact
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    for stage in ("rebuild", "fold"):
        with monkeypatch.context() as mp:
            mp.syspath_prepend(str(first.root / stage))
            __import__("network")
            del sys.modules["network"]  # not mp.delitem: its undo would put it back for the next stage
        assert list((first.root / stage / "__pycache__").glob("network.*.pyc")), stage
    again = run(path)
    assert statuses(again) == dict.fromkeys(stage_names(), "up to date")

    write_recipe(path, compile={"graph_kernel": "off", "warmup": 1, "runs": 4})
    changed = run(path)
    assert statuses(changed) == {
        "export": "up to date",
        "rebuild": "up to date",
        "fold": "up to date",
        "compile": "passed",
        "mindir": "passed",
    }

    write_recipe(path, compile={"graph_kernel": "off", "warmup": 1, "runs": 4}, rebuild={"fuse_conv_bn_act": False})
    unfused = run(path)
    assert statuses(unfused) == {"export": "up to date", **dict.fromkeys(stage_names()[1:], "passed")}
    counts = json.loads((unfused.root / "rebuild" / "stage.json").read_text())["counts"]
    assert counts["conv2d_bn_act"] == 0 and counts["batchnorm_layers"] == 3

    from_fold = run(path, from_stage="fold")
    assert statuses(from_fold) == {
        "export": "up to date",
        "rebuild": "up to date",
        "fold": "passed",
        "compile": "passed",
        "mindir": "passed",
    }
    assert statuses(run(path, force=True)) == dict.fromkeys(stage_names(), "passed")


def test_changed_conversion_code_reconverts(tmp_path, monkeypatch):
    """A fixed converter must not leave old conversions 'up to date' at the same version number."""
    import torch2ms.pipeline.fingerprint as fingerprint

    path = write_recipe(tmp_path / "tiny.yaml")
    assert run(path).passed
    assert fingerprint.source_hash() == fingerprint.source_hash()  # stable within a process
    monkeypatch.setattr(fingerprint, "_source_hash", "0123456789abcdef")
    assert statuses(run(path)) == dict.fromkeys(stage_names(), "passed")


def _package_copy(tmp_path, monkeypatch):
    """A copy of the torch2ms package whose source hash ``fresh()`` computes anew."""
    import shutil

    import torch2ms
    import torch2ms.pipeline.fingerprint as fingerprint

    pkg = tmp_path / "torch2ms"
    shutil.copytree(Path(torch2ms.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fingerprint, "package_root", lambda: pkg)

    def fresh():
        monkeypatch.setattr(fingerprint, "_source_hash", None)
        return fingerprint.source_hash()

    return pkg, fresh


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.mark.parametrize(
    "tool",
    [
        "commands/convert.py",
        "cli_app.py",
        "tools/ops_table.py",
        "zoo/launch.py",
        "bench/core.py",
    ],
)
def test_editing_a_tool_keeps_a_run_up_to_date(tmp_path, monkeypatch, tool):
    pkg, fresh = _package_copy(tmp_path, monkeypatch)
    base = fresh()
    _append(pkg / tool, "\n# help text\n")
    assert fresh() == base


@pytest.mark.parametrize(
    "code", ["converters/activation.py", "passes/fold_bn.py", "export/floor.py", "graph/load.py", "compare.py"]
)
def test_editing_conversion_code_reconverts(tmp_path, monkeypatch, code):
    pkg, fresh = _package_copy(tmp_path, monkeypatch)
    base = fresh()
    _append(pkg / code, "\n# fix\n")
    assert fresh() != base


def test_fingerprint_allowlist_covers_what_the_stages_import():
    """Every torch2ms module loaded by importing the stages, the runner and every converter is inside
    the hashed allowlist: a conversion module outside it would leave stale runs up to date."""
    import subprocess
    import sys

    from torch2ms.pipeline.fingerprint import CONVERSION_CODE

    code = (
        "import sys, torch2ms.stages, torch2ms.pipeline.runner, torch2ms.converters.registry as r; r.registrations(); "
        "print(' '.join(m for m in sys.modules if m.startswith('torch2ms')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert len(loaded) > 50
    covered = {e.removesuffix(".py") for e in CONVERSION_CODE}
    outside = [m for m in loaded if m != "torch2ms" and m.split(".")[1] not in covered]
    assert not outside, f"imported by the stages but outside pipeline.fingerprint.CONVERSION_CODE: {outside}"


def test_weight_free_model_converts_through_every_stage(tmp_path):
    path = write_recipe(tmp_path / "free.yaml", model={"factory": "tiny_models:weight_free"})
    result = run(path)
    assert result.passed, statuses(result)
    source = (result.root / "fold" / "network.py").read_text()
    assert "load_checkpoint" not in source and "import os" not in source


def test_edited_artifact_is_detected_and_its_stage_reruns(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml")
    first = run(path)
    net = first.root / "fold" / "network.py"
    net.write_text(net.read_text() + "\n# edited by hand\n")
    again = run(path)
    assert statuses(again)["fold"] == "passed" and statuses(again)["rebuild"] == "up to date"
    assert "edited by hand" not in net.read_text()


def test_torch2ms_imports_network_py_without_writing_bytecode(tmp_path, monkeypatch):
    """A stage folder is hashed into its record: loading its network.py writes no __pycache__ (a .pyc
    holds network.py's mtime), and Python's own setting is left as it was."""
    from torch2ms.runtime.msutil import load_network_module

    (tmp_path / "network.py").write_text("WIDTH = 3\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert load_network_module(tmp_path / "network.py", "bytecode").WIDTH == 3
    assert not (tmp_path / "__pycache__").exists() and sys.dont_write_bytecode is False


def test_crashed_stage_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    from torch2ms.errors import StageFailed
    from torch2ms.stages.fold import FoldStage

    path = write_recipe(tmp_path / "tiny.yaml")

    def boom(self, ctx, out):
        (out / "network.py").write_text("half written")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(FoldStage, "run", boom)
    with pytest.raises(
        StageFailed, match=r"stage 'fold' failed after \['export', 'rebuild'\]: RuntimeError: disk on fire"
    ):
        run(path)
    root = tmp_path / "runs" / "tiny"
    assert not (root / "fold").exists() and not (root / ".fold.partial").exists()
    assert not (root / ".lock").exists()
    monkeypatch.undo()
    resumed = run(path)
    assert statuses(resumed) == {
        "export": "up to date",
        "rebuild": "up to date",
        "fold": "passed",
        "compile": "passed",
        "mindir": "passed",
    }


def test_leftover_partial_folder_is_cleaned_and_not_trusted(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml")
    root = tmp_path / "runs" / "tiny"
    partial = root / ".export.partial"
    partial.mkdir(parents=True)
    (partial / "stage.json").write_text('{"status": "passed"}')
    result = run(path)
    assert statuses(result)["export"] == "passed" and not partial.exists()


def test_out_of_tolerance_stage_fails_the_run_and_keeps_its_artifacts(tmp_path):
    path = write_recipe(
        tmp_path / "tiny.yaml", check={"samples": 1, "rel_error": 1e-12, "cosine": 0.99999, "noise_factor": 0}
    )
    result = run(path)
    st = statuses(result)
    assert not result.passed and "failed" in st.values()
    failed = result.failed_stage
    assert all(v == "not run" for k, v in st.items() if stage_names().index(k) > stage_names().index(failed.stage))
    record = json.loads((result.root / failed.stage / "stage.json").read_text())
    assert record["status"] == "failed" and "relative error" in record["violations"][0]
    with pytest.raises(CheckFailed, match=f"stage '{failed.stage}' is out of tolerance"):
        raise_for(result)


def test_checkpoint_weights_are_used(tmp_path):
    from tiny_models import tiny_net

    torch.manual_seed(123)
    model = tiny_net(num_classes=5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ckpt = tmp_path / "weights.pt"
    torch.save(model.state_dict(), ckpt)
    path = write_recipe(
        tmp_path / "tiny.yaml",
        model={"factory": "tiny_models:tiny_net", "kwargs": {"num_classes": 5}, "checkpoint": "weights.pt"},
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run(until="rebuild")
    assert statuses(result)["rebuild"] == "passed"
    ref = load_npz(result.root / "export" / "reference.npz")
    with torch.no_grad():
        expect = model.eval()(torch.from_numpy(ref["input.input"][0])).numpy()
    np.testing.assert_allclose(ref["output.output"][0], expect, rtol=1e-6, atol=1e-6)
