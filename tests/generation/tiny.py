"""Tiny transformers causal LMs for the generation tests (2 layers, hidden 64, vocabulary 1000),
seeded random weights, and seeded prompts of different lengths (so left padding is exercised)."""

from __future__ import annotations

import numpy as np

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
