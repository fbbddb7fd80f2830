"""``torch2ms load-weights``: the digits CNN is converted with random weights, then the trained
state_dict of ``trained_models`` (other weights, learnt on real digits) is moved into the rebuild
and fold networks without converting again; the checkpoints give PyTorch's outputs for the
trained model. A state_dict that does not fit is refused, naming the key, and nothing is written.
Also: ``weight_map.json`` names every state_dict key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import trained_models as tm
import yaml
from conftest import run_cli

from torch2ms.recipe import load_recipe
from torch2ms.runtime import msutil
from torch2ms.stages import pipeline_runner

pytestmark = pytest.mark.slow  # a conversion (export, rebuild, fold) and a training: ~100 s on 2 cores


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("weights")
    recipe = d / "digits.yaml"
    data = {
        "name": "digits",
        "task": "classification",
        "model": {"factory": "trained_models:digits_cnn", "seed": 3},
        "inputs": [{"name": "input", "shape": [4, 1, 8, 8]}],
        "check": {"samples": 1},
        "output": str(d / "runs"),
    }
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run(until="fold")
    status = {s.stage: s.status for s in result.stages}
    assert [status[s] for s in ("export", "rebuild", "fold")] == ["passed"] * 3, status
    trained = tm.train_digits(d / "trained.pt")
    return recipe, result.root, trained


def test_trained_weights_move_into_the_converted_network(converted):
    recipe, root, trained = converted
    assert run_cli("load-weights", str(recipe), "--state-dict", str(trained.checkpoint)) == 0
    x = trained.heldout_x[:16]
    model = tm.digits_cnn()
    model.load_state_dict(torch.load(trained.checkpoint, weights_only=True))
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(x)).numpy()
    ms = msutil.mindspore()
    for stage in ("rebuild", "fold"):
        module = msutil.load_network_module(root / stage / "network.py", f"lw_{stage}")
        new = module.build(str(root / stage / "network.trained.ckpt"))
        old = module.build(str(root / stage / "network.ckpt"))
        got = np.concatenate([new(ms.Tensor(x[i : i + 4])).asnumpy() for i in range(0, 16, 4)])
        before = np.concatenate([old(ms.Tensor(x[i : i + 4])).asnumpy() for i in range(0, 16, 4)])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
        assert not np.allclose(before, expected, atol=1e-2), "the converted weights were the trained ones"
        assert (got.argmax(1) == expected.argmax(1)).all()


def test_weight_map_names_every_key(converted):
    _, root, _ = converted
    keys = list(tm.digits_cnn().state_dict())
    for stage, bn in (("rebuild", "copy"), ("fold", "bn_fold")):
        wm = json.loads((root / stage / "weight_map.json").read_text())
        assert sorted(wm) == sorted(keys)
        conv = wm["features.0.0.weight"][0]
        assert conv["parameter"] == "features.0.0.conv.weight" and conv["fused_into"] == "features.0.0"
        assert wm["features.0.0.weight"][0]["transform"] == ("copy" if stage == "rebuild" else "bn_fold")
        assert wm["features.0.1.running_var"][0]["transform"] == bn
        assert "unused" in wm["features.0.1.num_batches_tracked"]
        if stage == "rebuild":  # the BatchNorm inside the fused cell
            bn = wm["features.0.1.running_var"][0]
            assert (bn["parameter"], bn["fused_into"]) == ("features.0.0.batchnorm.moving_variance", "features.0.0")
    assert wm["head.weight"][0]["parameter"] == "head.weight"


def test_a_state_dict_that_does_not_fit_is_refused_and_nothing_written(converted, tmp_path, capsys):
    recipe, root, trained = converted
    state = torch.load(trained.checkpoint, weights_only=True)
    state.pop("head.bias")
    state["features.3.0.weight"] = torch.zeros(32, 32, 5, 5)
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    assert run_cli("load-weights", str(recipe), "--state-dict", str(bad)) == 2
    err = capsys.readouterr().err
    assert "missing: head.bias [10]" in err and "shape: features.3.0.weight is [32, 32, 5, 5]" in err
    assert not list(root.glob("*/network.bad.ckpt"))
