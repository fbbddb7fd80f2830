"""``load-weights`` on a generation recipe: a transformers state_dict (its own keys) into both
converted graphs, which then generate what transformers generates with those weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.generation.tiny import build
from torch2ms.errors import Torch2msError
from torch2ms.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_transformers_state_dict_generates_in_the_converted_graphs(tmp_path):
    import torch

    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.generation.plan import prompt_ids
    from torch2ms.generation.reference import transformers_generate
    from torch2ms.generation.weights import load_generation_weights

    data = yaml.safe_load((REPO / "recipes" / "llama_tiny_generate.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    runners = generation_runners(recipe, None, lambda m: None, own_processes=False)
    results = run_generation(runners, until="fold")
    assert [s.status for s in results["decode"].stages[:3]] == ["passed"] * 3
    root = tmp_path / "runs" / recipe.name
    converted = np.load(root / "generation" / "reference.npz")["tokens"]

    trained = tmp_path / "trained.pt"
    torch.save(build("llama", seed=1).state_dict(), trained)  # transformers' own keys
    written = load_generation_weights(recipe, root, trained, log=lambda m: None)
    for stage in ("rebuild", "fold"):
        record = written["generation"][stage]
        total = converted.size
        assert record["tokens_equal"] == f"{total}/{total}", record
        assert record["worst_step"]["rel_error"] <= record["logits_bound"]["rel_error"]
        for graph in ("prefill", "decode"):
            assert (root / graph / stage / "network.trained.ckpt").is_file()
    # the new weights generate other tokens than the converted ones: the check compared with those
    spec = recipe.generate
    retrained = transformers_generate(
        build("llama", seed=1), prompt_ids(spec, 1000), spec.max_new_tokens, spec.cache_length, spec.batch
    )
    assert not np.array_equal(retrained.tokens, converted)

    wrong = tmp_path / "wrong.pt"
    state = build("llama", seed=1).state_dict()
    state["lm_head.bias"] = torch.zeros(1000)
    torch.save(state, wrong)
    with pytest.raises(Torch2msError, match=r"unexpected keys \(1\): lm_head\.bias"):
        load_generation_weights(recipe, root, wrong, log=lambda m: None)
