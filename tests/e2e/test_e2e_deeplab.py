"""End to end through the CLI: the shipped DeepLabV3+ recipe (at 128x128 to fit CI), all five
stages within tolerance, every Conv->BN(->act) chain a Conv2dBnAct, no BatchNorm after fold,
and a second run that skips every stage. The shipped ONNX-source recipe on that run's exported
ONNX passes all five stages with the same numbers: the same reference to float32 noise, the same
fusions and folds, the same folded weights and the same MindIR outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from torch2ms.stages import stage_names

REPO = Path(__file__).resolve().parents[2]


def conv_bn_chains(onnx_path: Path) -> int:
    """Count Conv nodes whose only consumer is a BatchNormalization, read from the ONNX itself."""
    g = onnx.load(str(onnx_path)).graph
    users: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    return sum(
        1
        for n in g.node
        if n.op_type == "Conv" and [u.op_type for u in users.get(n.output[0], [])] == ["BatchNormalization"]
    )


def convert(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "torch2ms", "convert", "--recipe", str(recipe), "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def small(name: str, folder: Path, **model) -> Path:
    """The shipped recipe ``name`` at 128x128, one sample, 3 timed runs (``model`` replaces its model),
    with ``compile.graph_kernel: auto``: both compiled variants built, timed and decided between
    (the shipped DeepLabV3+ recipe keeps the plain graph, measured faster there)."""
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    data["inputs"][0]["shape"] = [1, 3, 128, 128]
    data["check"]["samples"] = 1
    data["compile"].update(warmup=1, runs=3, graph_kernel="auto")
    data["model"] = model or data["model"]
    recipe = folder / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(data))
    return recipe


@pytest.fixture(scope="module")
def deeplab_run(tmp_path_factory):
    """The shipped recipe at 128x128 converted once: (recipe, runs folder, the convert process)."""
    folder = tmp_path_factory.mktemp("deeplab")
    recipe = small("deeplabv3plus", folder)
    return recipe, folder / "runs", convert(recipe, folder / "runs")


def records_of(root: Path) -> dict:
    return {s: json.loads((root / s / "stage.json").read_text()) for s in stage_names()}


def test_deeplabv3plus_end_to_end(deeplab_run):
    recipe, runs, first = deeplab_run
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ONEDNN_MAX_CPU_ISA=" in first.stderr  # the CPU choice is reported
    root = runs / "deeplabv3plus"
    records = records_of(root)
    for stage, rec in records.items():
        assert rec["status"] == "passed", stage
        bound = rec["bounds"][rec["worst"]["name"]]  # the recipe's, or 10x the float32 noise floor
        assert rec["worst"]["rel_error"] <= min(bound["rel_error"], 1e-3), (stage, bound)
        assert rec["worst"]["cosine"] >= 0.99999, stage
        assert rec["worst"]["argmax_agreement"] > 0.99, stage

    chains = conv_bn_chains(root / "export" / "model.onnx")
    assert chains == 62  # every conv of the model but the classifier
    assert records["rebuild"]["counts"]["conv2d_bn_act"] == chains
    assert records["fold"]["counts"]["batchnorm_folded"] == chains
    assert records["fold"]["counts"]["batchnorm_left"] == 0
    rebuilt = (root / "rebuild" / "network.py").read_text()
    folded = (root / "fold" / "network.py").read_text()
    assert "nn.BatchNorm" not in rebuilt and "has_bn=True" not in folded
    # the module classes write a block's Conv2dBnAct once for all its instances: count the built cells
    from torch2ms.runtime import msutil

    for stage in ("rebuild", "fold"):
        net = msutil.build_network(root / stage, f"e2e_{stage}")
        fused = [c for _, c in net.cells_and_names() if type(c).__name__ == "Conv2dBnAct"]
        assert len(fused) == chains, stage
        assert all(c.has_bn == (stage == "rebuild") for c in fused), stage
    # batch-agnostic: no size in the code carries the batch as a number (torch2ms.codegen.batch)
    for stage in ("rebuild", "fold"):
        assert records[stage]["counts"]["batch"]["static_because"] is None, records[stage]["counts"]["batch"]
    compiled = records["compile"]["extra"]
    assert compiled["median_ms"] > 0 and compiled["pynative_median_ms"] > 0
    # graph_kernel: auto built both variants, timed them in alternating rounds and kept one
    assert {"graph", "graph_kernel"} <= set(compiled["variants"]) and compiled["chosen"] in compiled["variants"]
    assert compiled["variants"]["graph_kernel"]["runs"] == compiled["variants"]["graph"]["runs"]
    assert compiled["decision"]["rounds"] == compiled["variants"]["graph"]["runs"] >= 1
    assert (root / "mindir" / "network.mindir").stat().st_size > 1_000_000
    for col in ("stage", "status", "seconds", "max abs err", "max rel err", "cosine"):
        assert col in first.stdout

    second = convert(recipe, runs)
    assert second.returncode == 0, second.stderr
    report = json.loads((root / "report.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["up to date"] * len(stage_names())


def mindir_outputs(path: Path, x: np.ndarray) -> list[np.ndarray]:
    import mindspore as ms

    out = ms.nn.GraphCell(ms.load(str(path)))(ms.Tensor(x))
    return [o.asnumpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.slow
def test_deeplabv3plus_from_its_onnx_gives_the_same_numbers(deeplab_run, tmp_path):
    """recipes/deeplabv3plus_onnx.yaml on the PyTorch run's model.onnx: all five stages pass with
    PyTorch's samples and a reference within float32 noise of PyTorch's (random-weight DeepLabV3+:
    1.4e-4 relative, the PyTorch run's export error), the same fusions and folds, the same folded
    weights, and MindIR outputs equal to the PyTorch run's. About 100 s on top of the PyTorch run."""
    import mindspore as ms

    _, runs, first = deeplab_run
    assert first.returncode == 0, first.stdout + first.stderr
    torch_root = runs / "deeplabv3plus"
    recipe = small("deeplabv3plus_onnx", tmp_path, onnx=str(torch_root / "export" / "model.onnx"))
    done = convert(recipe, tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    onnx_root = tmp_path / "runs" / "deeplabv3plus_onnx"
    from_torch, from_onnx = records_of(torch_root), records_of(onnx_root)
    assert from_onnx["export"]["extra"]["export_path"]["exporter"] == "onnx file"
    for stage in stage_names():
        rec = from_onnx[stage]
        assert rec["status"] == "passed", stage
        bound = rec["bounds"][rec["worst"]["name"]]  # as in the PyTorch run: the recipe's or the noise floor's
        assert rec["worst"]["rel_error"] <= min(bound["rel_error"], 1e-3) and rec["worst"]["cosine"] >= 0.99999
        # the same stage outputs against the two references: relative errors apart by at most the
        # references' own distance, which the PyTorch run's export stage measured
        gap = abs(rec["worst"]["rel_error"] - from_torch[stage]["worst"]["rel_error"])
        assert gap <= 1.05 * from_torch["export"]["worst"]["rel_error"] + 1e-7, stage
    for stage, key in (("rebuild", "conv2d_bn_act"), ("fold", "batchnorm_folded"), ("fold", "batchnorm_left")):
        assert from_onnx[stage]["counts"][key] == from_torch[stage]["counts"][key], (stage, key)

    ref_torch, ref_onnx = (np.load(r / "export" / "reference.npz") for r in (torch_root, onnx_root))
    inputs = [k for k in ref_torch.files if k.startswith("input.")]
    outputs = [k for k in ref_torch.files if k.startswith("output.")]
    assert inputs and outputs and set(ref_onnx.files) >= {*inputs, *outputs}
    for k in inputs:  # the same seeded samples
        assert np.array_equal(ref_torch[k], ref_onnx[k]), k
    for k in outputs:  # the reference is onnxruntime's run of the file, as the PyTorch run's export check measured it
        gap = np.abs(ref_onnx[k].astype(np.float64) - ref_torch[k]).max()
        assert gap <= 1.0001 * from_torch["export"]["worst"]["max_abs"] + 1e-7, k

    weights = [ms.load_checkpoint(str(r / "fold" / "network.ckpt")) for r in (torch_root, onnx_root)]
    assert weights[0].keys() == weights[1].keys()
    for name, p in weights[0].items():
        assert np.array_equal(p.asnumpy(), weights[1][name].asnumpy()), name
    x = ref_torch[inputs[0]][0]
    got, want = (mindir_outputs(r / "mindir" / "network.mindir", x) for r in (onnx_root, torch_root))
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
