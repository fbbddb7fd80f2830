"""``torch2ms convert`` on a generation recipe: both graphs through the five stages, each stage's
own prefill and decode graphs generating transformers' ``generate`` tokens; a wrong cache write
fails the stage; the near-tie policy of ``generation.check.judge``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.generation.tiny import recipe_file
from torch2ms.generation.cache import update_blend
from torch2ms.generation.check import judge
from torch2ms.generation.loop import Generated
from torch2ms.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
STAGES = ("export", "rebuild", "fold", "compile", "mindir")


def _record(root: Path, graph: str, stage: str) -> dict:
    return json.loads((root / graph / stage / "stage.json").read_text())


def _check_run(root: Path, name: str) -> None:
    """Every stage of both graphs passed; every decode stage's check generated transformers' tokens."""
    reference = np.load(root / "generation" / "reference.npz")
    total = reference["tokens"].size
    for stage in STAGES:
        assert _record(root, "prefill", stage)["status"] == "passed"
        generation = _record(root, "decode", stage)["extra"]["generation"]
        assert generation["tokens_equal"] == f"{total}/{total}", (stage, generation)
        assert generation["worst_step"]["rel_error"] <= generation["logits_bound"]["rel_error"]
    # the rebuild's module classes are transformers' (from the wrapper's module tree)
    layer = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer", "gpt2": "GPT2Block"}[name.split("_")[0]]
    assert f"class {layer}(nn.Cell)" in (root / "decode" / "rebuild" / "network.py").read_text()


def test_a_tiny_llama_generates_transformers_tokens_in_every_stage(converted_llama):
    """``tiny.QUICK``: two prompts at two prompt gears through one prefill graph (conftest.py)."""
    recipe, results = converted_llama
    assert [s.status for s in results["decode"].stages] == ["passed"] * 5
    assert results["prefill"].stages[-1].record["counts"]["sequence_lengths"] == [4, 8]
    _check_run(results["prefill"].root.parent, recipe.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_tiny_generate", "qwen2_tiny_generate", "gpt2_tiny_generate"])
def test_convert_generates_transformers_tokens_in_every_stage(tmp_path, name):
    """A shipped recipe through ``torch2ms convert`` (the export stages in their own processes, where
    the generation check runs too)."""
    path = recipe_file(tmp_path, name)
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "torch2ms", "convert", "--recipe", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _check_run(tmp_path / "runs" / name, name)


def _one_position_off(cache, new, slot):
    return update_blend(cache, new, slot + 1)


def test_a_cache_write_one_position_off_fails_the_export(tmp_path, monkeypatch):
    """GPT-2's decode graph writing its cache one slot late: PyTorch's graph is the tensor check's
    reference, so only generation sees it, and for GPT-2 not by its tokens but by its logits."""
    from torch2ms.generation import cache
    from torch2ms.generation.convert import generation_runners, run_generation

    monkeypatch.setitem(cache.UPDATES, "one_position_off", _one_position_off)
    recipe = load_recipe(recipe_file(tmp_path, "gpt2_tiny_generate"))
    runners = generation_runners(recipe, None, lambda m: None, own_processes=False, write="one_position_off")
    results = run_generation(runners, until="export")
    assert results["prefill"].stages[0].status == "passed"
    export = results["decode"].stages[0]
    assert export.status == "failed", export.reason
    assert "generation: the logits of step" in export.reason
    assert [s.status for s in results["decode"].stages[1:]] == ["not run"] * 4
    generation = export.record["extra"]["generation"]
    assert generation["worst_step"]["rel_error"] > generation["logits_bound"]["rel_error"]


def _generated(tokens_logits):
    logits = np.asarray(tokens_logits, dtype=np.float32)
    return Generated(logits.argmax(-1), logits)


def test_a_difference_within_the_noise_is_a_near_tie_and_one_beyond_it_fails():
    """One row, two steps, three tokens. The reference's step 0 is a near-tie (its top-2 gap, float32's
    step above 1, within the noise); at step 1 its gap is 0.5 and the candidate chose otherwise."""
    bound = {"rel_error": 1.0, "cosine": 0.0}
    reference = _generated([[[1.0, 1.0 + 1e-7, 0.0], [0.0, 1.0, 0.5]]])
    tie = _generated([[[1.0 + 2e-7, 1.0, 0.0], [0.0, 1.0, 0.5]]])
    violations, record = judge(reference, tie, tie, bound, noise=1e-6)
    assert violations == [] and len(record["near_ties"]) == 1 and record["tokens_equal"] == "1/2"
    wrong = _generated([[[1.0, 1.0 + 1e-7, 0.0], [0.0, 1.0, 1.5]]])
    violations, record = judge(reference, wrong, wrong, bound, noise=1e-6)
    assert len(violations) == 1 and "step 1, row 0: token 2 instead of 1" in violations[0]
    assert record["near_ties"] == []


def test_check_places_both_graphs_of_a_converted_generation_recipe(converted_llama):
    """``torch2ms check --recipe --target ascend310`` on the converted run: each graph's ONNX
    analysed and placed (the export stages up to date: nothing converted again)."""
    from typer.testing import CliRunner

    from torch2ms.cli import _load_commands
    from torch2ms.cli_app import app

    recipe, results = converted_llama
    _load_commands()
    path = Path(recipe.base_dir) / f"{recipe.name}.yaml"
    done = CliRunner().invoke(app, ["check", "--recipe", str(path), "--target", "ascend310"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    for graph in ("prefill", "decode"):
        assert f"{graph} export   up to date" in done.output
        assert f"OK {results[graph].root / 'export' / 'model.onnx'} (opset" in done.output
    assert done.output.count("Placement on the Ascend310 (fp16)") == 2
