"""Weights the exporter merged: a model with default LayerNorm weights (ones, zeros) and
MultiheadAttention exports one initializer for several state_dict keys, so matching a parameter by
its values alone cannot tell ``ln_1.weight`` from ``ln_2.weight``. ``weight_map.json`` names each
key's own parameter (the export gives each merged weight its own initializer back), so weights
trained apart move in apart; and
the attention's projections are named as in PyTorch (``in_proj``, ``out_proj``), not ``dense``.
RMSNorms, whose weight the generated code reads as a stored tensor rather than a layer's parameter,
keep one tensor per module though their values are equal."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tiny_models
import torch
from conftest import run_cli, write_recipe

from torch2ms.recipe import load_recipe
from torch2ms.runtime import msutil
from torch2ms.stages import pipeline_runner

SHAPE = [2, 3, 16, 16]
RMS_SHAPE = [2, 5, 16]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("shared"), "tiny_encoder", SHAPE)


@pytest.fixture(scope="module")
def rms_converted(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("rms"), "tiny_rms_net", RMS_SHAPE)


def _convert(d, factory: str, shape: list[int]):
    """Converted to the fold stage, and the same model with weights "trained apart": every float
    tensor different, so no two keys share values any more."""
    recipe = write_recipe(
        d / f"{factory}.yaml",
        name=factory,
        task="other",
        model={"factory": f"tiny_models:{factory}", "seed": 0},
        inputs=[{"name": "input", "shape": shape}],
        check={"samples": 1},
    )
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run(until="fold")
    status = {s.stage: s.status for s in result.stages}
    assert [status[s] for s in ("export", "rebuild", "fold")] == ["passed"] * 3, status
    torch.manual_seed(1)
    trained = getattr(tiny_models, factory)()
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


def test_every_rmsnorm_key_maps_to_its_own_tensor(rms_converted):
    """The three norms' weights were one array (ones): each key still names its own module's tensor,
    and one class serves the three norms."""
    _, root, _ = rms_converted
    for stage in ("rebuild", "fold"):
        wm = json.loads((root / stage / "weight_map.json").read_text())
        for key in ("blocks.0.norm.weight", "blocks.1.norm.weight", "norm.weight"):
            targets = [t["parameter"] for t in wm[key]] if isinstance(wm[key], list) else wm[key]
            assert targets == [key.replace("weight", "gamma")], (stage, key, targets)
    source = (root / "fold" / "network.py").read_text()
    assert "class RMSNorm(" in source and "class RMSNorm2(" not in source, source


@pytest.mark.parametrize("fixture, shape", [("converted", SHAPE), ("rms_converted", RMS_SHAPE)])
def test_weights_trained_apart_move_in_apart(fixture, shape, request):
    recipe, root, trained = request.getfixturevalue(fixture)
    assert run_cli("load-weights", str(recipe), "--state-dict", str(root.parent.parent / "trained.pt")) == 0
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        expected = trained.eval()(torch.from_numpy(x)).numpy()
    ms = msutil.mindspore()
    for stage in ("rebuild", "fold"):
        module = msutil.load_network_module(root / stage / "network.py", f"shared_{stage}")
        got = module.build(str(root / stage / "network.trained.ckpt"))(ms.Tensor(x)).asnumpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
