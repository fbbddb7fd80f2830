"""The prefill and decode graphs generate transformers' tokens: in PyTorch for Llama (grouped-query
attention, rotary positions), Qwen2 and GPT-2 (learned positions), in onnxruntime on the exported
files for Llama; a cache written one position off is caught by the token comparison."""

from __future__ import annotations

import numpy as np
import pytest

from tests.generation.tiny import CACHE_LENGTH, MAX_NEW_TOKENS, build, prompts
from torch2ms.generation.cache import UPDATES, update_blend
from torch2ms.generation.compare import first_divergence, step_errors
from torch2ms.generation.graphs import Decode, Prefill
from torch2ms.generation.loop import greedy_batches, torch_runner
from torch2ms.generation.plan import cache_geometry
from torch2ms.generation.reference import transformers_generate

BATCH = 2


@pytest.fixture(scope="module")
def llama():
    model = build("llama")
    return model, transformers_generate(model, prompts(), MAX_NEW_TOKENS, CACHE_LENGTH, BATCH)


def _graphs(model, write=update_blend):
    layers = cache_geometry(model).layers
    return Prefill(model, layers, CACHE_LENGTH), Decode(model, layers, CACHE_LENGTH, write)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2"])
def test_torch_graphs_generate_transformers_tokens(name):
    model = build(name)
    reference = transformers_generate(model, prompts(), MAX_NEW_TOKENS, CACHE_LENGTH, BATCH)
    got = greedy_batches(torch_runner(*_graphs(model)), prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH)
    assert first_divergence(reference, got) is None
    assert max(e.rel_error for e in step_errors(reference, got)) < 1e-5


def test_each_prompt_runs_at_the_smallest_gear_that_holds_it(llama):
    """Prompts of 7, 3, 5 and 8 tokens, one per batch, at gears 4, 6 and 8 (each padded to 8, 4, 6, 8):
    transformers' tokens, and the same tokens as with every prompt padded to 8."""
    from torch2ms.generation.loop import gear_for

    model, padded_to_8 = llama
    assert [gear_for((4, 6, 8), [p]) for p in prompts()] == [8, 4, 6, 8]
    with pytest.raises(ValueError, match="a 8-token prompt is longer than the largest prompt gear"):
        gear_for((4, 6), prompts())
    reference = transformers_generate(model, prompts(), MAX_NEW_TOKENS, CACHE_LENGTH, 1, (4, 6, 8))
    got = greedy_batches(torch_runner(*_graphs(model)), prompts(), 1, MAX_NEW_TOKENS, CACHE_LENGTH, gears=(4, 6, 8))
    assert first_divergence(reference, got) is None
    assert (reference.tokens == padded_to_8.tokens).all()


def test_geometry_is_the_models_cache():
    g = cache_geometry(build("llama"))
    assert (g.layers, g.kv_heads, g.head_dim, g.vocab, g.positions) == (2, 2, 16, 1000, 64)
    assert cache_geometry(build("gpt2")).kv_heads == 4  # no grouped-query attention


@pytest.mark.parametrize("write", sorted(UPDATES))
def test_every_cache_write_is_the_same_write(write, llama):
    model, reference = llama
    got = greedy_batches(torch_runner(*_graphs(model, UPDATES[write])), prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH)
    assert first_divergence(reference, got) is None


def test_onnxruntime_on_the_exported_graphs_generates_transformers_tokens(llama, tmp_path):
    from torch2ms.generation.export import export_graphs, onnx_runner

    model, reference = llama
    geometry = cache_geometry(model)
    exported = export_graphs(*_graphs(model), geometry, BATCH, max(map(len, prompts())), tmp_path)
    got = greedy_batches(onnx_runner(exported), prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH)
    assert first_divergence(reference, got) is None
    assert max(e.rel_error for e in step_errors(reference, got)) < 1e-5


def test_a_cache_written_one_position_off_is_caught(llama):
    model, reference = llama

    def one_off(cache, new, slot):
        return update_blend(cache, new, slot + 1)

    got = greedy_batches(torch_runner(*_graphs(model, one_off)), prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH)
    found = first_divergence(reference, got)
    assert found is not None and found.step >= 1  # the prefill writes no decode slot: step 0 agrees
    assert found.got != found.expected and found.gap > 1e-4  # a real difference, not a near-tie
    assert f"token {found.got} instead of {found.expected}" in found.describe()


def test_teacher_forcing_feeds_the_given_tokens(llama):
    model, reference = llama
    runner = torch_runner(*_graphs(model))
    teacher = np.roll(reference.tokens, 1, axis=1)  # other tokens: the logits after step 0 must change
    forced = greedy_batches(runner, prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH, teacher=teacher)
    free = greedy_batches(runner, prompts(), BATCH, MAX_NEW_TOKENS, CACHE_LENGTH)
    np.testing.assert_array_equal(forced.logits[:, 0], free.logits[:, 0])
    assert not np.allclose(forced.logits[:, 1:], free.logits[:, 1:])
