"""The W8A16 plan of a generation recipe (``bundle.w8a16``).

``Int8Dense`` against ``nn.Dense`` with the weight it dequantizes, in PyNative and from a reloaded
MindIR. ``check_w8a16`` (slow) runs on a tiny Llama converted through the five stages, one Linear
made sensitive to int8: that layer kept float, the others int8
in the prefill and decode MindIRs (smaller by their weights' 3/4), reloaded, generating
transformers' tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.generation.tiny import QUICK, recipe_file

OUTLIER = 1e3  # the factor moved from one hidden channel of the final norm into the lm_head (_outlier_copy)


def _parameters(path: Path) -> dict:
    """name -> (data type, bytes) of a MindIR's parameters."""
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(path.read_bytes())
    return {  # a name is "<graph scope>:<parameter name>"
        p.name.rsplit(":", 1)[-1]: (mind_ir_pb2.TensorProto.DataType.Name(p.data_type), len(p.raw_data))
        for p in model.graph.parameter
    }


def _outlier_copy(root: Path, dest: Path) -> str:
    """The run's reference, export and mindir MindIRs (the fp32 bytes) and fold networks in ``dest``,
    the fold networks' hidden channel 0 scaled by 1/OUTLIER in the final norm and by OUTLIER in the
    lm_head's column 0: the same float function (the norm's weight multiplies its output), but each
    lm_head row now has one weight ~OUTLIER times the others, which int8 per row rounds to zero.
    Returns the lm_head's path."""
    import mindspore as ms

    shutil.copytree(root / "generation", dest / "generation")
    norm, head = "model.model.norm.gamma", "model.lm_head.weight"
    for graph in ("prefill", "decode"):
        for stage in ("export", "fold", "mindir"):
            shutil.copytree(root / graph / stage, dest / graph / stage)
        ckpt = dest / graph / "fold" / "network.ckpt"
        params = ms.load_checkpoint(str(ckpt))
        gamma, weight = params[norm].asnumpy(), params[head].asnumpy()
        gamma[0] /= OUTLIER
        weight[:, 0] *= OUTLIER
        params[norm].set_data(ms.Tensor(gamma))
        params[head].set_data(ms.Tensor(weight))
        ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(ckpt))
    return head.removesuffix(".weight")


def check_w8a16(recipe, root: Path, out: Path) -> None:
    """The W8A16 plan of a run converted through the mindir stage, its lm_head made int8-sensitive
    (``_outlier_copy``): its int8 step is then large against every logit gap, so the plan allows no
    near-ties; every layer in int8 breaks the tokens and the plan keeps the lm_head float first; the
    other int8 layers (Linear weights, the token embedding) are INT8 in both MindIRs and save their
    3/4 less the scales; the reloaded MindIRs generate transformers' tokens; the plan is reused from its cache.
    The emulator and the exports run in processes of their own: the calling process never builds a
    network (here one that tried would raise)."""
    from unittest import mock

    from torch2ms.bundle.w8a16 import w8a16_mindirs
    from torch2ms.runtime import msutil

    head = _outlier_copy(root, out / "run")
    with mock.patch.object(msutil, "build_network", side_effect=AssertionError("a network built in the caller")):
        paths = w8a16_mindirs(recipe, out / "run", out / "w8a16", log=lambda m: None)
    plan = json.loads(paths["plan"].read_text())
    ties = plan["near_tie"]
    assert not ties["rare"] and ties["bound"] == 0.0 and ties["steps_within"] > ties["share_limit"] * ties["steps"]
    assert not plan["before"]["ok"], plan["before"]
    # the lm_head first; beside it at most one more layer, kept where its rounding flips a close step
    # (without near-ties every differing step counts)
    assert plan["keep_float"][0] == "lm_head" and plan["sensitivity"][0]["name"] == head, plan["sensitivity"]
    assert len(plan["keep_float"]) <= 2, plan["keep_float"]
    assert plan["after"]["top1_agreement"] >= recipe.precision.w8a16_top1_agreement
    rows = {r["label"]: r for r in plan["sensitivity"]}
    kept = [rows[k]["name"] + (".weight" if rows[k]["op"] == "Dense" else "") for k in plan["keep_float"]]
    tables = [k for k, v in plan["embedding"].items() if v == "int8"]
    assert set(plan["embedding"]) == {"model.embed_tokens.weight"}
    m = plan["mindir"]
    for graph in ("prefill", "decode"):
        params = _parameters(paths[graph])
        fp32 = _parameters(out / "run" / graph / "mindir" / "network.mindir")
        int8 = {n: b for n, (t, b) in params.items() if t == "INT8"}
        # q, k, v, o, gate, up, down per layer, the lm_head and the embedding, less those kept float
        assert len(int8) == plan["layers"] - len(kept) == 16 - len(kept) and len(tables) == (
            "model.embed_tokens.weight" not in plan["keep_float"]
        )
        quantized = 4 * sum(int8.values())  # their fp32 bytes
        everything = m["linear_fp32_bytes_per_graph"] + m["tables_fp32_bytes_per_graph"]
        assert quantized == everything - sum(fp32[k][1] for k in kept)
        # every int8 weight a quarter of its float bytes; one float32 scale per row beside it
        scales = sum(b for n, (_, b) in params.items() if n.endswith("scale"))
        assert sum(b for _, b in fp32.values()) - sum(b for _, b in params.values()) == quantized * 3 // 4 - scales
        # the file: that, less the graph's Cast and Mul nodes (their bytes a constant per layer)
        grown = m["w8a16_bytes"][graph] - sum(b for _, b in params.values())
        grown -= m["fp32_bytes"][graph] - sum(b for _, b in fp32.values())
        assert 0 < grown < 3000 * len(int8), grown
    reference = np.load(root / "generation" / "reference.npz")["tokens"]
    g = plan["generation"]  # the reloaded MindIRs, free-running and teacher-forced
    assert g["tokens_equal"] == g["teacher_forced_equal"] == f"{reference.size}/{reference.size}", g
    assert plan["violations"] == [] and g["near_ties"] == []
    again = w8a16_mindirs(recipe, out / "run", out / "w8a16", log=lambda m: None)
    assert json.loads(again["plan"].read_text())["key"] == plan["key"]


def test_a_differing_step_within_the_int8_noise_floor_is_a_near_tie_only_while_they_are_rare():
    """``judge``: a differing step whose reference top-2 gap is within the bound counts as agreeing
    and is listed, one beyond it fails the gate; ``near_tie_record``: no bound when more than the
    recipe's share of steps are within the floor."""
    from types import SimpleNamespace

    from torch2ms.bundle.w8a16 import judge, near_tie_record
    from torch2ms.generation.loop import Generated

    logits = np.zeros((1, 4, 5), np.float32)
    logits[0, :, 1] = [1.0, 1.0, 1.0, 1.0]
    logits[0, :, 2] = [0.0, 0.999, 0.0, 0.0]  # step 1: a top-2 gap of 0.001
    ref = Generated(np.array([[1, 1, 1, 1]]), logits)
    recipe = SimpleNamespace(precision=SimpleNamespace(w8a16_top1_agreement=1.0, w8a16_near_tie_share=0.25))
    tie = Generated(np.array([[1, 2, 1, 1]]), logits)
    judged = judge(recipe, [tie], [ref], near_tie=0.01)
    assert judged["ok"] and judged["teacher_forced_equal"] == "3/4" and judged["first_mismatch"] is None
    assert judged["near_ties"] == ["step 1, row 0: token 2 instead of 1 (reference top-2 gap 0.001)"]
    assert not judge(recipe, [tie], [ref], near_tie=0.0)["ok"]
    wrong = Generated(np.array([[1, 1, 3, 1]]), logits)
    judged = judge(recipe, [wrong], [ref], near_tie=0.01)
    assert not judged["ok"] and judged["first_mismatch"].startswith("step 2, row 0: token 3 instead of 1")
    floor = {"draws": 1, "max_gap_move": 0.01, "per_draw": [0.01]}
    assert near_tie_record(recipe, ref, floor)["bound"] == 0.01  # 1 of 4 steps within: rare enough
    assert near_tie_record(recipe, ref, {**floor, "max_gap_move": 1.0})["bound"] == 0.0  # every step


def test_int8_dense_computes_its_dequantized_weight_in_pynative_and_from_a_reloaded_mindir(tmp_path):
    """Two Dense layers (one with a bias and an activation, inputs of rank 3) as Int8Dense: the same
    outputs as nn.Dense with the weights int8 rounds them to, in PyNative and from the MindIR
    exported in GRAPH_MODE and reloaded, whose weights are int8."""
    import mindspore as ms
    from mindspore import nn

    from torch2ms.bundle.w8a16_cell import QMAX, dense_layers, fake_quantized, quantize_network, quantize_rows

    class Two(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(8, 16, activation="relu")
            self.b = nn.Dense(16, 4, has_bias=False)

        def construct(self, x):
            return self.b(self.a(x))

    rng = np.random.default_rng(0)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x = ms.Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    float_net, int8_net = Two(), Two()
    for (_, f), (_, q) in zip(dense_layers(float_net), dense_layers(int8_net)):
        w = rng.standard_normal(tuple(f.weight.shape)).astype(np.float32)
        q.weight.set_data(ms.Tensor(w))
        f.weight.set_data(ms.Tensor(fake_quantized(w)))
        if f.has_bias:
            q.bias.set_data(f.bias.value())
        q8, scale = quantize_rows(w)
        assert np.abs(q8).max(axis=1).tolist() == [QMAX] * w.shape[0]
        assert np.abs(q8 * scale - w).max() <= scale.max() / 2 + 1e-7
    assert quantize_network(int8_net, ["a", "b"]) == ["a", "b"]
    expected = float_net(x).asnumpy()
    np.testing.assert_allclose(int8_net(x).asnumpy(), expected, rtol=1e-6, atol=1e-6)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms.export(int8_net, x, file_name=str(tmp_path / "net"), file_format="MINDIR")
        loaded = nn.GraphCell(ms.load(str(tmp_path / "net.mindir")))
        np.testing.assert_allclose(loaded(x).asnumpy(), expected, rtol=1e-6, atol=1e-6)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    types = {n: t for n, (t, _) in _parameters(tmp_path / "net.mindir").items()}
    assert types["a.weight"] == types["b.weight"] == "INT8" and types["a.scale"] == "FLOAT"


def test_int8_tables_gather_their_dequantized_rows_in_pynative_and_from_a_reloaded_mindir(tmp_path):
    """Both tables of ``w8a16_tables.Flat`` (the Embedding cell's and the inline one; the Parameter also
    used by a MatMul is left alone) stored int8 per row: the same outputs as the float network with
    the tables int8 rounds them to, in PyNative and from the MindIR exported in GRAPH_MODE and
    reloaded, whose tables are INT8 with one FLOAT scale per row."""
    import mindspore as ms
    from mindspore import nn

    from tests.generation.w8a16_tables import Flat
    from torch2ms.bundle.w8a16_cell import fake_quantized, gather_tables, quantize_tables

    rng = np.random.default_rng(0)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    float_net, int8_net = Flat(), Flat()
    for (name, f), (_, q) in zip(float_net.parameters_and_names(), int8_net.parameters_and_names()):
        w = rng.standard_normal(tuple(f.shape)).astype(np.float32)
        q.set_data(ms.Tensor(w))
        f.set_data(ms.Tensor(w if name == "proj" else fake_quantized(w)))
    found = [(path, attr) for path, _, attr in gather_tables(int8_net)]
    assert found == [("model_wpe_weight", "model_wpe_weight"), ("embed_tokens.weight", "weight")], found
    assert quantize_tables(int8_net, ["model_wpe_weight", "embed_tokens_weight"], tmp_path / "src") == [
        "model_wpe_weight",
        "embed_tokens.weight",
    ]
    x = ms.Tensor(rng.integers(-50, 50, (2, 3)).astype(np.int32))
    position = ms.Tensor(rng.integers(0, 12, (2, 3)).astype(np.int32))
    expected = float_net(x, position).asnumpy()
    np.testing.assert_allclose(int8_net(x, position).asnumpy(), expected, rtol=1e-6, atol=1e-6)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms.export(int8_net, x, position, file_name=str(tmp_path / "net"), file_format="MINDIR")
        loaded = nn.GraphCell(ms.load(str(tmp_path / "net.mindir")))
        np.testing.assert_allclose(loaded(x, position).asnumpy(), expected, rtol=1e-6, atol=1e-6)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    params = _parameters(tmp_path / "net.mindir")
    assert params["embed_tokens.weight"] == ("INT8", 50 * 8) and params["model_wpe_weight"] == ("INT8", 12 * 8)
    assert params["embed_tokens.weight_scale"] == ("FLOAT", 50 * 4) and params["proj"][0] == "FLOAT"


@pytest.mark.slow
def test_the_w8a16_plan_of_a_converted_tiny_llama(tmp_path):
    """``check_w8a16`` on the tiny Llama converted without prompt gears: both fold networks in the
    modules layout, where the final norm's weight is the norm's own (the flat prefill of a gear
    profile shares equal constants between layers, so the outlier trick would change its function)."""
    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.recipe import load_recipe

    quick = {**QUICK, "prompt_gears": None}
    recipe = load_recipe(recipe_file(tmp_path, "llama_tiny_generate", quick, graph_kernel="off"))
    results = run_generation(generation_runners(recipe, None, lambda m: None, own_processes=False))
    assert all(s.status == "passed" for r in results.values() for s in r.stages)
    check_w8a16(recipe, results["prefill"].root.parent, tmp_path / "w8a16")
