"""``torch2ms.models.hf.from_config``: transformers models from their config classes, a class only
reachable under its module path (Whisper's encoder), inputs passed by keyword (GPT-2), and a
misspelt class named in the error."""

from __future__ import annotations

import pytest
import torch

from torch2ms.errors import RecipeError
from torch2ms.models.hf import from_config

transformers = pytest.importorskip("transformers")
GPT2 = dict(config="GPT2Config", vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=16, use_cache=False)


def test_keywords_pass_the_inputs_by_name():
    torch.manual_seed(0)
    wrapped = from_config("GPT2LMHeadModel", keywords=["input_ids", "attention_mask"], **GPT2)
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    with torch.no_grad():
        got = wrapped(ids, mask)["logits"]
        want = wrapped.model(input_ids=ids, attention_mask=mask)["logits"]
        unmasked = wrapped.model(input_ids=ids)["logits"]
    assert torch.equal(got, want) and not torch.allclose(got[1], unmasked[1])  # the mask reached the model
    with pytest.raises(TypeError, match=r"expected 2 inputs \(input_ids, attention_mask\), got 1"):
        wrapped(ids)


def test_a_class_under_its_module_path():
    enc = from_config(
        "models.whisper.modeling_whisper.WhisperEncoder", "WhisperConfig", d_model=16, encoder_layers=1,
        encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=8, max_source_positions=4,
    )  # fmt: skip
    assert type(enc).__name__ == "WhisperEncoder" and not enc.training
    with torch.no_grad():
        assert enc(torch.randn(1, 8, 8))["last_hidden_state"].shape == (1, 4, 16)


@pytest.mark.parametrize(
    "model, config, field",
    [("BertForNothing", "BertConfig", "model"), ("models.whisper.nowhere.WhisperEncoder", "WhisperConfig", "model"),
     ("BertModel", "NoConfig", "config")],
)  # fmt: skip
def test_an_unknown_class_is_named(model, config, field):
    with pytest.raises(RecipeError, match=rf"model.kwargs.{field}: transformers \S+ has no"):
        from_config(model, config)
