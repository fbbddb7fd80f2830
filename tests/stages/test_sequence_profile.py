"""Sequence-length profile (``inputs[].sequence``) and dynamic batch for token-id models: the recipe
field and its refusals, the two-symbol size fit of the generated code, and a tiny BERT converted at
batch 1 / length 16 whose generated network is checked against PyTorch at batch 3 and lengths 8
and 32."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import run_cli

from torch2ms.codegen.batch import fit_expr, grid_fits, merge_all
from torch2ms.errors import RecipeError
from torch2ms.recipe import parse_recipe

BERT = {
    "factory": "torch2ms.models.hf:from_config",
    "kwargs": {
        "model": "BertForSequenceClassification",
        "config": "BertConfig",
        "vocab_size": 100,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 32,
        "num_labels": 3,
    },
    "seed": 0,
}
IDS = {"name": "input_ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100]}
MASK = {"name": "attention_mask", "shape": [1, 16], "dtype": "int64", "lengths": [6]}


def bert_recipe(tmp_path, sequence=(8, 16, 32), batch=(1, 3), **model_kwargs) -> dict:
    model = {**BERT, "kwargs": {**BERT["kwargs"], **model_kwargs}}
    extra = {"sequence": list(sequence), "batch": list(batch)}
    return {
        "name": "bert_seq",
        "task": "sequence_classification",
        "model": model,
        "inputs": [{**IDS, **extra}, {**MASK, **extra}],
        "check": {"samples": 1, "seed": 0},
        "compile": {"graph_kernel": "off", "warmup": 1, "runs": 2},
        "output": str(tmp_path / "runs"),
    }


# --- the recipe field ---
@pytest.mark.parametrize(
    "ids, mask, expect",
    [
        ({"sequence": [8, 32]}, {"sequence": [8, 32]}, "does not include shape[1]=16"),
        ({"sequence": [16, 16]}, {"sequence": [16, 16]}, "lists a length twice"),
        ({"sequence": [0, 16]}, {"sequence": [0, 16]}, "positive integers"),
        ({"sequence": [4, 16]}, {"sequence": [4, 16]}, "longer than the shortest sequence length 4"),
        ({"sequence": [8, 16]}, {"sequence": [16, 32]}, "inputs list different sequence lengths"),
        ({"sequence": [8, 16]}, {}, "have the (batch, sequence) shape of 'input_ids' but no sequence list"),
    ],
    ids=["shape_not_listed", "repeat", "zero", "mask_too_long", "two_lists", "one_input_unlisted"],
)
def test_bad_sequence_specs_are_named(ids, mask, expect, tmp_path):
    data = {"name": "m", "model": BERT, "inputs": [{**IDS, **ids}, {**MASK, **mask}]}
    with pytest.raises(RecipeError) as err:
        parse_recipe(data, "r.yaml", tmp_path)
    assert expect in str(err.value) and "sequence" in str(err.value), str(err.value)


def test_sequence_lengths_are_sorted_and_default_to_the_shape(tmp_path):
    r = parse_recipe({"name": "m", "model": BERT, "inputs": [IDS, MASK]}, "r.yaml", tmp_path)
    assert r.sequence_lengths() is None and r.inputs[0].sequence_lengths() == (16,)
    r = parse_recipe(bert_recipe(tmp_path, sequence=(32, 16, 8)), "r.yaml", tmp_path)
    assert r.sequence_lengths() == (8, 16, 32) and r.batch_sizes() == (1, 3)


# --- the size fit ---
def test_two_symbols_fit_products_and_offsets():
    b, s = 1, 16
    points = [(b, s), (b + 1, s), (b, s + 1), (b + 1, s + 1)]
    names = ["batch", "seq"]

    def at(f):
        return [f(x, y) for x, y in points]

    assert fit_expr(at(lambda x, y: x * y), points, names) == "batch * seq"
    assert fit_expr(at(lambda x, y: x * y * 4), points, names) == "batch * seq * 4"
    assert fit_expr(at(lambda x, y: y - 1), points, names) == "seq - 1"
    assert fit_expr(at(lambda x, y: 3 * x + 2 * y + 5), points, names) == "batch * 3 + seq * 2 + 5"
    # the recipe's length is the longest listed: the other load is one shorter
    down = [(b, s), (b + 1, s), (b, s - 1), (b + 1, s - 1)]
    assert fit_expr([x * y * 4 + y for x, y in down], down, names) == "batch * seq * 4 + seq"
    exprs = [f"ops.reshape(x, ({x * y}, {y}, 32))" for x, y in points]
    assert merge_all(exprs, points, names, "n") == ("ops.reshape(x, (batch * seq, seq, 32))", {"batch", "seq"})


def test_index_grid_takes_a_size_one_axis_stride_from_the_longer_load():
    # flatten(mask)[b * seq + s] at batch 1 says nothing about the batch stride; batch 2 gives it
    grids = [np.arange(n)[None, :] + np.arange(m)[:, None] * n for m, n in [(1, 16), (2, 16), (1, 17), (2, 17)]]
    fits = grid_fits(grids)
    assert [f[1] for f in fits] == [(16, 1), (16, 1), (17, 1), (17, 1)]
    assert grid_fits([np.array([[0, 5, 1]]), np.array([[0, 5, 1, 2]])]) is None  # not affine


# --- a tiny BERT end to end ---
@pytest.mark.slow
def test_tiny_bert_follows_batch_and_length(tmp_path):
    """All five stages at 1x16, the MindIR checked at batch 3 and lengths 8 and 32 by the pipeline;
    the generated code against PyTorch here at 3x8 and 3x32; the bundle's verify at every size."""
    import mindspore as ms
    import torch

    from torch2ms.bundle.build import build_bundle
    from torch2ms.bundle.verify import verify_bundle
    from torch2ms.model_loader import build_model
    from torch2ms.runtime import msutil
    from torch2ms.stages import pipeline_runner

    recipe = parse_recipe(bert_recipe(tmp_path), "r.yaml", tmp_path)
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    src = (result.root / "fold" / "network.py").read_text()
    assert "seq = input_ids.shape[1]" in src and "batch = input_ids.shape[0]" in src
    assert "(batch * seq," in src  # the padding mask, flattened over both sizes
    mindir = next(s.record for s in result.stages if s.stage == "mindir")
    assert sorted(mindir["batches"]) == ["3"] and sorted(mindir["lengths"]) == ["32", "8"]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = msutil.build_network(result.root / "fold", "seqtest")
    model = build_model(recipe)
    rng = np.random.default_rng(1)
    for b, s in [(3, 8), (3, 32), (1, 16)]:
        ids = rng.integers(0, 100, (b, s))
        mask = np.ones((b, s), np.int64)
        mask[-1, s // 2 :] = 0  # a padded row: the mask must really apply
        with torch.no_grad():
            want = model(torch.from_numpy(ids), torch.from_numpy(mask)).logits.numpy()
        got = net(ms.Tensor(ids), ms.Tensor(mask)).asnumpy()
        assert got.shape == want.shape == (b, 3)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    verified = verify_bundle(build_bundle(result, tmp_path / "dist", log=lambda m: None).path, log=lambda m: None)
    assert sorted(verified.batches) == [3] and sorted(verified.lengths) == [8, 32]
    assert all(m.rel_error < 1e-5 for ms_ in verified.lengths.values() for m in ms_)


def test_a_length_above_the_position_embeddings_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(bert_recipe(tmp_path, max_position_embeddings=24)))
    assert run_cli("convert", "--recipe", str(path)) == 2
    run = tmp_path / "runs" / "bert_seq"
    assert not run.exists() or not any(p.is_file() for p in run.rglob("*"))


# --- the board tools' settings ---
def test_atc_compiles_batch_and_length_profiles_into_one_model():
    from torch2ms.bundle.targets import TARGETS, atc_sh, dims_profiles

    extra = {"batch": [1, 3], "sequence": [8, 16]}
    inputs = [{**IDS, **extra}, {**MASK, **extra}]
    assert dims_profiles(inputs) == [(1, 8, 1, 8), (1, 16, 1, 16), (3, 8, 3, 8), (3, 16, 3, 16)]
    script = atc_sh(TARGETS["atlas-300i-pro"], "m", inputs, "fp32", with_aipp=False)
    # CANN ATC: one value per -1 of --input_shape in order, profiles separated by ';'; not with --dynamic_batch_size
    assert '--input_shape="input_ids:-1,-1;attention_mask:-1,-1"' in script and "--input_format=ND" in script
    assert '--dynamic_dims="1,8,1,8;1,16,1,16;3,8,3,8;3,16,3,16"' in script
    assert "--dynamic_batch_size" not in script
    # a length list alone: the batch stays fixed
    only = [{**IDS, "sequence": [8, 16, 32]}, {**MASK, "sequence": [8, 16, 32]}]
    assert dims_profiles(only) == [(8, 8), (16, 16), (32, 32)]
    assert '--input_shape="input_ids:1,-1;attention_mask:1,-1"' in atc_sh(
        TARGETS["atlas-300i-pro"], "m", only, "fp32", with_aipp=False
    )
    with pytest.raises(Exception, match="2 to 100"):
        dims_profiles([{**IDS, "batch": list(range(1, 12)), "sequence": list(range(1, 11))}])


def test_reference_inputs_keep_the_models_order_through_the_file(tmp_path):
    """save_npz sorts its keys; the stages call the network with the samples by position, so a
    resumed run read attention_mask as the token ids before meta.input_order."""
    from torch2ms.pipeline.workspace import (
        load_npz,
        pack_batches,
        pack_lengths,
        pack_reference,
        save_npz,
        split_batches,
        split_lengths,
        split_reference,
    )

    sample = {"input_ids": np.ones((1, 4), np.int64), "attention_mask": np.zeros((1, 4), np.int64)}
    out = {"logits": np.zeros((1, 3), np.float32)}
    arrays = {**pack_reference([sample], [out]), **pack_batches({2: (sample, out)}), **pack_lengths({8: (sample, out)})}
    save_npz(tmp_path / "r.npz", arrays)
    loaded = load_npz(tmp_path / "r.npz")
    assert list(split_reference(loaded)[0][0]) == ["input_ids", "attention_mask"]
    assert list(split_batches(loaded)[2][0]) == ["input_ids", "attention_mask"]
    assert list(split_lengths(loaded)[8][0]) == ["input_ids", "attention_mask"]
