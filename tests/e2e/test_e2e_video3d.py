"""End to end through the CLI: the shipped 3-D CNN video classifier recipe (Conv3d -> BatchNorm3d
-> ReLU blocks), all five stages within tolerance, every Conv3d -> BatchNorm chain one generated
Conv3dBnAct cell after rebuild, and no BatchNorm left after fold. The full 1x3x8x112x112 clip is
slow; a 4-frame 32x32 clip of a narrower network checks the same in seconds."""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.test_e2e_deeplab import REPO, conv_bn_chains, convert
from torch2ms.stages import stage_names


def run_video3d(tmp_path, shape, width, samples):
    data = yaml.safe_load((REPO / "recipes" / "video3d.yaml").read_text())
    data["inputs"][0]["shape"] = shape
    data["model"]["kwargs"]["width"] = width
    data["check"]["samples"] = samples
    data["compile"].update(warmup=1, runs=2, graph_kernel="off")
    recipe = tmp_path / "video3d.yaml"
    recipe.write_text(yaml.safe_dump(data))
    done = convert(recipe, tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    root = tmp_path / "runs" / "video3d"
    records = {s: json.loads((root / s / "stage.json").read_text()) for s in stage_names()}
    for stage, rec in records.items():
        assert rec["status"] == "passed", stage
        assert rec["worst"]["rel_error"] <= 1e-4, stage
        assert rec["worst"]["cosine"] >= 0.99999, stage

    chains = conv_bn_chains(root / "export" / "model.onnx")
    assert chains == 9  # stem, two convs per block, two strided projections
    assert records["export"]["counts"]["batchnorm_nodes"] == chains  # BatchNorm kept by the export
    assert records["rebuild"]["counts"]["conv3d_bn_act"] == chains
    assert records["rebuild"]["counts"]["batchnorm_layers"] == 0
    assert records["fold"]["counts"]["batchnorm_folded"] == chains
    assert records["fold"]["counts"]["batchnorm_left"] == 0
    # the module classes write a block's Conv3dBnAct once for all its instances: count the built cells
    from torch2ms.runtime import msutil

    for stage in ("rebuild", "fold"):
        net = msutil.build_network(root / stage, f"video3d_{stage}")
        fused = [c for _, c in net.cells_and_names() if type(c).__name__ == "Conv3dBnAct"]
        assert len(fused) == chains, stage
        assert all(c.has_bn == (stage == "rebuild") for c in fused), stage
        kinds = [type(c).__name__ for _, c in net.cells_and_names()]
        assert kinds.count("Conv3d") == chains, stage  # every Conv3d is inside a Conv3dBnAct
        assert kinds.count("BatchNorm3d") == (chains if stage == "rebuild" else 0), stage
    return records


def test_video3d_small_clip(tmp_path):
    run_video3d(tmp_path, [1, 3, 4, 32, 32], width=4, samples=1)


@pytest.mark.slow
def test_video3d_end_to_end(tmp_path):
    records = run_video3d(tmp_path, [1, 3, 8, 112, 112], width=16, samples=2)
    assert records["compile"]["extra"]["median_ms"] > 0
