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
import yaml

from torch2ms.generation.cache import update_blend
from torch2ms.generation.check import judge
from torch2ms.generation.loop import Generated
from torch2ms.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
STAGES = ("export", "rebuild", "fold", "compile", "mindir")


def _recipe(tmp_path, name: str, generate: dict | None = None, **compile_spec) -> Path:
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    data["compile"].update(compile_spec)
    data["generate"].update(generate or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _record(root: Path, graph: str, stage: str) -> dict:
    return json.loads((root / graph / stage / "stage.json").read_text())


# make test converts the Llama in this process, two prompts of one row each at two prompt gears (the
# 3-token prompt at 4, the 7-token one at 8: one prefill graph, checked at both), no graph-kernel
# build; the shipped recipes as they are, through the command, are slow
QUICK = {"prompt_lengths": [7, 3], "max_new_tokens": 6, "cache_length": 14, "prompt_gears": [4, 8], "batch": 1}


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


def test_a_tiny_llama_generates_transformers_tokens_in_every_stage(tmp_path):
    from torch2ms.generation.convert import generation_runners, run_generation

    recipe = load_recipe(_recipe(tmp_path, "llama_tiny_generate", QUICK, graph_kernel="off"))
    results = run_generation(generation_runners(recipe, None, lambda m: None, own_processes=False))
    assert [s.status for s in results["decode"].stages] == ["passed"] * 5
    _check_run(tmp_path / "runs" / recipe.name, recipe.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_tiny_generate", "qwen2_tiny_generate", "gpt2_tiny_generate"])
def test_convert_generates_transformers_tokens_in_every_stage(tmp_path, name):
    """A shipped recipe through ``torch2ms convert`` (the export stages in their own processes, where
    the generation check runs too)."""
    path = _recipe(tmp_path, name)
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
    recipe = load_recipe(_recipe(tmp_path, "gpt2_tiny_generate"))
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
