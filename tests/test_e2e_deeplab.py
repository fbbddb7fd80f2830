"""End to end through the CLI: the shipped DeepLabV3+ recipe (at 128x128 to fit CI), all five
stages within tolerance, every Conv->BN(->act) chain a Conv2dBnAct, no BatchNorm after fold,
and a second run that skips every stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import yaml

from torch2ms.stages import stage_names

REPO = Path(__file__).resolve().parent.parent


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


def test_deeplabv3plus_end_to_end(tmp_path):
    data = yaml.safe_load((REPO / "recipes" / "deeplabv3plus.yaml").read_text())
    data["inputs"][0]["shape"] = [1, 3, 128, 128]
    data["check"]["samples"] = 1
    data["compile"].update(warmup=1, runs=3)
    recipe = tmp_path / "deeplabv3plus.yaml"
    recipe.write_text(yaml.safe_dump(data))

    first = convert(recipe, tmp_path / "runs")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ONEDNN_MAX_CPU_ISA=" in first.stderr  # the CPU choice is reported
    root = tmp_path / "runs" / "deeplabv3plus"
    records = {s: json.loads((root / s / "stage.json").read_text()) for s in stage_names()}
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
    assert rebuilt.count("nn.Conv2dBnAct(") == chains and "nn.BatchNorm" not in rebuilt
    assert folded.count("nn.Conv2dBnAct(") == chains and "has_bn=True" not in folded
    # batch-agnostic: no size in the code carries the batch as a number (torch2ms.codegen.batch)
    for stage in ("rebuild", "fold"):
        assert records[stage]["counts"]["batch"]["static_because"] is None, records[stage]["counts"]["batch"]
    assert records["compile"]["extra"]["median_ms"] > 0 and records["compile"]["extra"]["pynative_median_ms"] > 0
    assert (root / "mindir" / "network.mindir").stat().st_size > 1_000_000
    for col in ("stage", "status", "seconds", "max abs err", "max rel err", "cosine"):
        assert col in first.stdout

    second = convert(recipe, tmp_path / "runs")
    assert second.returncode == 0, second.stderr
    report = json.loads((root / "report.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["up to date"] * len(stage_names())
