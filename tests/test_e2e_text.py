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
from test_e2e_deeplab import REPO, convert

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
