"""End to end through the CLI: the shipped transformers recipes (a BERT sequence classifier and a
Llama-architecture decoder, built from their config classes with random weights) with int64
token ids and padding masks, all five stages within tolerance and with every task figure 1.
The exported graph must really read the mask: onnxruntime on another mask matches PyTorch."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from e2e.test_e2e_deeplab import REPO, convert
from torch2ms.model_loader import build_model
from torch2ms.recipe import load_recipe
from torch2ms.stages import stage_names


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, metric", [("bert_tiny", "argmax agreement"), ("llama_tiny", "top-1 agreement per position")]
)
def test_transformer_recipe_end_to_end(name, metric, tmp_path):
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    data["compile"].update(warmup=1, runs=2, graph_kernel="off")
    recipe_path = tmp_path / f"{name}.yaml"
    recipe_path.write_text(yaml.safe_dump(data))
    done = convert(recipe_path, tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    root = tmp_path / "runs" / name
    for stage in stage_names():
        record = json.loads((root / stage / "stage.json").read_text())
        assert record["status"] == "passed", stage
        assert record["worst"]["rel_error"] <= 1e-4 and record["worst"]["cosine"] >= 0.99999, stage
        assert record["task"]["metric"] == metric and record["task"]["agreement"] == 1.0, stage
    source = (root / "rebuild" / "network.py").read_text()
    assert source.count("nn.Dense(") >= 2 * 4 and "def construct(self, input_ids, attention_mask)" in source

    # the mask is live in the graph: another padding gives PyTorch's other outputs
    recipe = load_recipe(recipe_path)
    model = build_model(recipe)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, recipe.inputs[0].range[1], recipe.inputs[0].shape)
    seq = ids.shape[1]
    masks = [np.ones_like(ids), (np.arange(seq)[None, :] < np.array([[seq // 2], [3]])).astype(np.int64)]
    sess = ort.InferenceSession(str(root / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    outs = []
    for mask in masks:
        with torch.no_grad():
            want = next(iter(model(torch.from_numpy(ids), torch.from_numpy(mask)).values())).numpy()
        got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        outs.append(want)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3  # the two masks really differ in effect


def cli(*args: str, cwd=REPO):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch2ms", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_bert_bundle_packages_verifies_and_infer_py_takes_token_ids(tmp_path):
    """The shipped BERT recipe with token_type_ids as a third int64 input, through the CLI:
    ``package`` (which converts), ``verify``, and the bundle's infer.py on ``--tokens`` and on .npy
    files gives PyTorch's logits for the same ids, padding mask and segment ids."""
    from conftest import run_bundle_infer, unpack_bundle

    data = yaml.safe_load((REPO / "recipes" / "bert_tiny.yaml").read_text())
    data["inputs"].append({"name": "token_type_ids", "shape": [2, 16], "dtype": "int64", "range": [0, 2]})
    data["compile"].update(warmup=1, runs=2, graph_kernel="off")
    recipe_path = tmp_path / "bert_tiny.yaml"
    recipe_path.write_text(yaml.safe_dump(data))
    done = cli("package", "-r", str(recipe_path), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "dist"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (bundle,) = (tmp_path / "dist").glob("bert_tiny-*.tar.gz")
    checked = cli("verify", str(bundle))
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]

    root = unpack_bundle(bundle, tmp_path / "bundle")
    manifest = json.loads((root / "manifest.json").read_text())
    assert [(i["name"], i["dtype"]) for i in manifest["inputs"]] == [
        ("input_ids", "int64"), ("attention_mask", "int64"), ("token_type_ids", "int64"),
    ]  # fmt: skip
    assert manifest["preprocess"]["image_input"] is False

    tokens = [101, 7, 250, 999, 3, 102]
    ids = np.zeros((2, 16), np.int64)
    ids[:, : len(tokens)] = tokens
    mask = (np.arange(16) < len(tokens)).astype(np.int64)[None].repeat(2, 0)
    segments = np.zeros_like(ids)
    segments[1, 3 : len(tokens)] = 1  # a second segment in row 1, for the .npy run
    model = build_model(load_recipe(recipe_path))
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask)
    np.save(tmp_path / "segments.npy", segments)
    for args, seg, stem in (
        (["--tokens", " ".join(map(str, tokens))], np.zeros_like(ids), "tok"),
        ([str(tmp_path / f"{n}.npy") for n in ("ids", "mask", "segments")], segments, "npy"),
    ):
        with torch.no_grad():
            want = model(*(torch.from_numpy(a) for a in (ids, mask, seg)))["logits"].numpy()
        res = run_bundle_infer(root, *args, "--out", str(tmp_path / stem))
        assert res.returncode == 0, res.stderr[-2000:]
        got = np.load(tmp_path / f"{stem}.npy")
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), stem
    # the two runs differ only by the segment ids: infer.py really passed segment 0 for --tokens
    assert np.abs(np.load(tmp_path / "tok.npy") - np.load(tmp_path / "npy.npy")).max() > 1e-4
