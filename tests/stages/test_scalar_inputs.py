"""Scalar inputs (``shape: []``, an ONNX graph input of rank 0: a scale, a threshold) through the
five stages, the bundle (ATC's ``--input_shape`` writes a scalar as ``name:``), ``verify`` and the
bundle's own ``infer.py``, each against PyTorch."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
import torch
from conftest import run_bundle_infer, unpack_bundle, write_recipe

from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.verify import verify_bundle
from torch2ms.errors import RecipeError
from torch2ms.model_loader import build_model
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

INPUTS = [
    {"name": "image", "shape": [1, 3, 8, 8]},
    {"name": "scale", "shape": []},
    {"name": "threshold", "shape": []},
]


@pytest.fixture(scope="module")
def scalar_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("scalar")
    recipe = load_recipe(
        write_recipe(
            d / "scalar.yaml", name="scalar", task="other", model={"factory": "tiny_models:scaled"}, inputs=INPUTS
        )
    )
    result = pipeline_runner(recipe, log=lambda m: None).run()
    return recipe, result, build_bundle(result, d / "dist", log=lambda m: None).path


def test_scalar_inputs_pass_every_stage_and_verify(scalar_bundle):
    recipe, result, bundle = scalar_bundle
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    with tarfile.open(bundle) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        atc = tar.extractfile("targets/atlas-200i-dk-a2/atc.sh").read().decode()
        lite = tar.extractfile("targets/atlas-200i-dk-a2/converter_lite.sh").read().decode()
    assert [i["shape"] for i in manifest["inputs"]] == [[1, 3, 8, 8], [], []]
    assert '--input_shape="image:1,3,8,8;scale:;threshold:"' in atc  # ATC: a scalar's shape is empty
    assert '--inputShape="image:1,3,8,8"' in lite
    verified = verify_bundle(bundle, log=lambda m: None)
    assert verified.samples == 2 and all(m.rel_error < 1e-5 for m in verified.metrics)


def test_infer_py_takes_a_scalar_npy_and_matches_pytorch(scalar_bundle, tmp_path):
    recipe, _, bundle = scalar_bundle
    root = unpack_bundle(bundle, tmp_path / "b")
    rng = np.random.default_rng(3)
    image = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    scale, threshold = np.float32(1.7), np.float32(0.2)
    for name, value in (("image", image), ("scale", scale), ("threshold", threshold)):
        np.save(root / f"{name}.npy", value)
    done = run_bundle_infer(root, "image.npy", "scale.npy", "threshold.npy", "--out", "result")
    assert done.returncode == 0, done.stderr
    got = np.load(root / "result.npy")
    with torch.no_grad():
        want = build_model(recipe)(*(torch.from_numpy(np.asarray(a)) for a in (image, scale, threshold))).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    done = run_bundle_infer(root, "--self-check")
    assert done.returncode == 0 and "ok   output 'output'" in done.stdout, done.stdout + done.stderr


def test_a_scalar_has_no_batch_to_serve(tmp_path):
    bad = [INPUTS[0], {"name": "scale", "shape": [], "batch": [1, 2]}]
    with pytest.raises(RecipeError, match=r"inputs\.1.*a scalar \(shape \[\]\) has none"):
        load_recipe(write_recipe(tmp_path / "r.yaml", model={"factory": "tiny_models:scaled"}, inputs=bad))
