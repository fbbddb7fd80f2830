"""Weights the exporter merged: a model with default LayerNorm weights (ones, zeros) and
MultiheadAttention exports one initializer for several state_dict keys, so matching a parameter by
its values alone cannot tell ``ln_1.weight`` from ``ln_2.weight``. ``weight_map.json`` names each
key's own parameter (the export gives each merged weight its own initializer back), so weights
trained apart move in apart; and
the attention's projections are named as in PyTorch (``in_proj``, ``out_proj``), not ``dense``."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from conftest import run_cli, write_recipe
from tiny_models import tiny_encoder

from torch2ms.recipe import load_recipe
from torch2ms.runtime import msutil
from torch2ms.stages import pipeline_runner

SHAPE = [2, 3, 16, 16]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    recipe = write_recipe(
        d / "encoder.yaml",
        name="encoder",
        task="other",
        model={"factory": "tiny_models:tiny_encoder", "seed": 0},
        inputs=[{"name": "input", "shape": SHAPE}],
        check={"samples": 1},
    )
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run(until="fold")
    status = {s.stage: s.status for s in result.stages}
    assert [status[s] for s in ("export", "rebuild", "fold")] == ["passed"] * 3, status
    # weights "trained apart": every float tensor different, so no two keys share values any more
    torch.manual_seed(1)
    trained = tiny_encoder()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.2 * torch.randn_like(p))
    torch.save(trained.state_dict(), d / "trained.pt")
    return recipe, result.root, trained


def test_the_weights_the_exporter_merged_are_given_back(converted):
    """TorchScript wrote ``ln_2.weight = Identity(ln_1.weight)``; model.onnx has both initializers."""
    _, root, _ = converted
    model = onnx.load(str(root / "export" / "model.onnx"))
    names = {t.name for t in model.graph.initializer}
    assert {"ln_1.weight", "ln_2.weight", "ln_1.bias", "ln_2.bias", "self_attention.out_proj.bias"} <= names, names
    identities = [n.input[0] for n in model.graph.node if n.op_type == "Identity"]
    assert not set(identities) & names, identities


def test_every_key_maps_to_its_own_module(converted):
    _, root, _ = converted
    for stage in ("rebuild", "fold"):
        wm = json.loads((root / stage / "weight_map.json").read_text())
        unused = [k for k, v in wm.items() if isinstance(v, dict) and "unused" in v]
        assert unused == [], (stage, unused)
        for key in ("ln_1.weight", "ln_2.weight", "ln_1.bias", "ln_2.bias"):
            module = key.rsplit(".", 1)[0]
            targets = [t["parameter"] for t in wm[key]]
            assert targets and all(t.startswith(module + ".") or t.startswith("ln_") for t in targets), (key, targets)
            assert not any(t.startswith("ln_") and not t.startswith(module + ".") for t in targets), (key, targets)
    source = (root / "rebuild" / "network.py").read_text()
    assert "self.in_proj = nn.Dense(" in source and "self.out_proj = nn.Dense(" in source, source
    assert "self.dense" not in source


def test_weights_trained_apart_move_in_apart(converted):
    recipe, root, trained = converted
    assert run_cli("load-weights", str(recipe), "--state-dict", str(root.parent.parent / "trained.pt")) == 0
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    with torch.no_grad():
        expected = trained.eval()(torch.from_numpy(x)).numpy()
    ms = msutil.mindspore()
    for stage in ("rebuild", "fold"):
        module = msutil.load_network_module(root / stage / "network.py", f"shared_{stage}")
        got = module.build(str(root / stage / "network.trained.ckpt"))(ms.Tensor(x)).asnumpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
