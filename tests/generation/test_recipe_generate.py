"""A text_generation recipe: its generate section's refusals name the field (exit 2, nothing
written), the checks that need the model (``generation.plan``), and the stage commands refusing it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.generation.tiny import build
from torch2ms.errors import EXIT_USAGE, RecipeError, Torch2msError
from torch2ms.generation.plan import cache_geometry, generation_plan, prompt_ids, read_plan, write_plan
from torch2ms.recipe import parse_recipe

REPO = Path(__file__).resolve().parents[2]
LLAMA = {
    "factory": "torch2ms.models.hf:from_config",
    "kwargs": {
        "model": "LlamaForCausalLM",
        "config": "LlamaConfig",
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
    },
}
BASE = {
    "name": "gen",
    "task": "text_generation",
    "model": LLAMA,
    "generate": {"prompts": [[1, 2, 3], [4, 5]], "max_new_tokens": 8, "cache_length": 16},
}


def _with(**generate):
    data = copy.deepcopy(BASE)
    data["generate"].update(generate)
    return {k: v for k, v in data.items()}


def _refused(data, tmp_path) -> str:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data, "r.yaml", tmp_path)
    return str(err.value)


def test_a_generation_recipe_parses_without_inputs(tmp_path):
    r = parse_recipe(BASE, "r.yaml", tmp_path)
    assert r.inputs == () and r.generate.lengths() == (3, 2) and r.generate.batch_size() == 2


@pytest.mark.parametrize(
    "generate,expect",
    [
        (
            {"cache_length": 10},
            "cache_length 10 is below the longest prompt (3) plus max_new_tokens (8): give cache_length >= 11",
        ),
        ({"prompt_lengths": [3]}, "give prompts (token-id lists) or prompt_lengths"),
        ({"prompts": [[1], []]}, "prompts: every prompt needs at least one token id"),
        ({"prompts": [[1, -2]]}, "prompts: token ids are non-negative"),
        ({"batch": 3}, "batch 3: 2 prompts do not make batches of 3"),
        ({"max_new_tokens": 0}, "generate.max_new_tokens"),
        ({"range": [0, 10]}, "range is for prompt_lengths"),
        ({"prompt_gears": [4, 2]}, "prompt_gears [4, 2]: give increasing positive lengths"),
        ({"prompt_gears": [2]}, "prompt_gears [2]: the largest gear is below the longest prompt (3)"),
        (
            {"prompt_gears": [4, 8], "cache_length": 12},
            "cache_length 12 is below the largest prompt gear (8) plus max_new_tokens (8): give cache_length >= 16",
        ),
    ],
)
def test_generate_refusals_name_the_field(generate, expect, tmp_path):
    message = _refused(_with(**generate), tmp_path)
    assert message.startswith("r.yaml: invalid recipe") and "generate" in message and expect in message


def test_the_task_and_the_section_go_together(tmp_path):
    assert "task: text_generation needs a generate section" in _refused({**BASE, "generate": None}, tmp_path)
    other = {**BASE, "task": "language_model", "inputs": [{"name": "x", "shape": [1, 4]}]}
    assert "generate is for task: text_generation" in _refused(other, tmp_path)
    given = {**BASE, "inputs": [{"name": "x", "shape": [1, 4]}]}
    assert "inputs: Value error, task: text_generation takes no inputs" in _refused(given, tmp_path)
    assert "inputs: required field is missing" in _refused({**BASE, "task": "other", "generate": None}, tmp_path)


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def test_plan_checks_prompts_against_the_model(llama, tmp_path):
    plan = generation_plan(parse_recipe(BASE, "r.yaml", tmp_path), llama)
    assert plan.prompts == ((1, 2, 3), (4, 5)) and plan.prompt_length == 3 and plan.geometry.kv_heads == 2
    cases = [
        (
            {"prompts": [list(range(70))], "cache_length": 80},
            "generate.prompts.0: 70 tokens, longer than the model's 64",
        ),
        ({"prompts": [[1, 2], [3, 1000]]}, "generate.prompts.1: token id 1000 is outside the model's vocabulary"),
        ({"max_new_tokens": 62, "cache_length": 80}, "generate.max_new_tokens: 62 new tokens after a 3-token prompt"),
        ({"prompts": None, "prompt_lengths": [65], "cache_length": 80}, "generate.prompt_lengths.0: 65 tokens"),
    ]
    for generate, expect in cases:
        with pytest.raises(RecipeError, match=expect.replace("(", r"\(").replace(")", r"\)")):
            generation_plan(parse_recipe(_with(**generate), "r.yaml", tmp_path), llama)


def test_the_plan_reads_back_as_written_and_a_run_without_one_is_named(llama, tmp_path):
    plan = generation_plan(parse_recipe(_with(prompt_gears=[2, 3]), "r.yaml", tmp_path), llama)
    write_plan(tmp_path / "run", plan)
    assert read_plan(tmp_path / "run") == plan and plan.gears == (2, 3)
    with pytest.raises(Torch2msError, match="generation/plan.json: not found"):
        read_plan(tmp_path / "other")


def test_drawn_prompts_follow_the_seed(tmp_path):
    spec = parse_recipe(_with(prompts=None, prompt_lengths=[4, 6], seed=3, range=[10, 20]), "r.yaml", tmp_path).generate
    first = prompt_ids(spec, 1000)
    assert [len(p) for p in first] == [4, 6] and all(10 <= t < 20 for p in first for t in p)
    assert prompt_ids(spec, 1000) == first
    other = parse_recipe(_with(prompts=None, prompt_lengths=[4, 6], seed=4, range=[10, 20]), "r.yaml", tmp_path)
    assert prompt_ids(other.generate, 1000) != first


def test_a_model_without_a_cache_interface_is_refused():
    import torch

    from torch2ms.models.hf import from_config

    with pytest.raises(RecipeError, match="model.factory: Sequential has no cache interface"):
        cache_geometry(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    bert = from_config(
        "BertForSequenceClassification",
        "BertConfig",
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    with pytest.raises(RecipeError, match="BertForSequenceClassification has no cache interface"):
        cache_geometry(bert)
    sliding = from_config(
        "MistralForCausalLM",
        "MistralConfig",
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        sliding_window=8,
    )
    with pytest.raises(RecipeError, match="layers of type sliding_attention"):
        cache_geometry(sliding)


REFUSED = (
    "cannot run it yet: it takes one graph, and a generation recipe has two (prefill and decode); `torch2ms convert`"
)


@pytest.mark.parametrize(
    "command,expect",
    [
        (["precision"], f"torch2ms precision {REFUSED}"),
        (
            ["package", "--precision", "int8"],
            "--precision 'int8': a text_generation bundle takes fp16, cube-fp16, fp32",
        ),
    ],
)
def test_stage_commands_refuse_a_generation_recipe(command, expect, tmp_path):
    """Before any stage runs: ``precision`` takes one graph; ``package`` does not quantize the graphs."""
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump({**BASE, "output": str(tmp_path / "runs")}))
    env = dict(os.environ, COLUMNS="400", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "torch2ms", command[0], "--recipe", str(path), *command[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == EXIT_USAGE, text
    assert expect in text
    assert not (tmp_path / "runs").exists()
