"""Tiny transformers causal LMs for the generation tests (2 layers, hidden 64, vocabulary 1000),
seeded random weights, and seeded prompts of different lengths (so left padding is exercised);
the shipped generation recipes with test sizes (``recipe_file``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]

CACHE_LENGTH = 32
MAX_NEW_TOKENS = 10

# model class, config class, config keywords
MODELS = {
    "llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64},
    ),
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64},
    ),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"n_head": 4, "n_positions": 64}),
}


def build(name: str, seed: int = 0):
    import torch

    from torch2ms.models.hf import from_config

    model, config, kwargs = MODELS[name]
    torch.manual_seed(seed)
    return from_config(model, config, vocab_size=1000, hidden_size=64, num_hidden_layers=2, **kwargs)


def prompts(lengths=(7, 3, 5, 8), seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 1000, n)] for n in lengths]


# make test converts the Llama once in its process (conftest.converted_llama), two prompts of one row
# each at two prompt gears (the 3-token prompt at 4, the 7-token one at 8: one prefill graph, checked
# at both), no graph-kernel build; the shipped recipes as they are, through the command, are slow
QUICK = {"prompt_lengths": [7, 3], "max_new_tokens": 6, "cache_length": 14, "prompt_gears": [4, 8], "batch": 1}


def recipe_file(tmp_path: Path, name: str, generate: dict | None = None, **compile_spec) -> Path:
    """``recipes/<name>.yaml`` with its output in ``tmp_path``, ``generate`` and ``compile`` updated."""
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    data["compile"].update(compile_spec)
    data["generate"].update(generate or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
