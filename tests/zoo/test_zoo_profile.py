"""``torch2ms zoo --profile``: a passed model is profiled by its worker (PyTorch, the plain graph and
graph kernels), the row's fusion columns (winner, margin, kernels, small-op share) are filled from
its compile record and its profile.json, and summary.html and summary.md show its per-module picture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import TESTS

from torch2ms.zoo import ZooOptions, load_zoo, run_batch


def test_the_row_takes_the_chosen_variants_profile_and_the_summaries_link_its_picture(tmp_path: Path):
    from torch2ms.zoo.profile import CHOSEN_VARIANT
    from torch2ms.zoo.row import ModelRow, profile_fields
    from torch2ms.zoo.summary import build, write_summaries

    profile = {
        "variants": {
            "ms_graph_folded": {"kernels_per_call": 87.0, "small_op_share": 0.157},
            "ms_graph_folded_gk": {"kernels_per_call": 73.0, "small_op_share": 0.113},
        }
    }
    assert profile_fields(profile, CHOSEN_VARIANT["graph_kernel"]) == {"kernels": 73.0, "small_op_share": 0.113}
    assert profile_fields(profile) == {"kernels": 87.0, "small_op_share": 0.157}
    png = tmp_path / "m" / "profile" / "modules.png"
    png.parent.mkdir(parents=True)
    png.write_bytes(b"\x89PNG")
    rows = [
        ModelRow("m", "passed", winner="graph_kernel", profile_png=str(png)),
        ModelRow("gone", "passed", profile_png=str(tmp_path / "gone" / "modules.png")),  # no file: no picture
    ]
    paths = write_summaries(
        tmp_path,
        build(
            rows,
            {
                "zoo": "z.yaml",
                "executor": "local",
                "jobs": 1,
                "timeout": 1.0,
                "seconds": 1.0,
                "out": str(tmp_path),
                "keep": "needed",
            },
        ),
    )
    page = paths["html"].read_text()
    assert page.count("<img ") == 1 and '<img src="m/profile/modules.png"' in page
    assert "![m](m/profile/modules.png)" in paths["md"].read_text()


@pytest.mark.slow  # a zoo worker converts and profiles one model with a graph-kernel build: ~1-2 min
def test_zoo_profile_fills_the_fusion_columns_and_shows_the_picture(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the worker finds tiny_models as a user's code
    monkeypatch.chdir(tmp_path)  # AKG writes kernel_meta/ into the working directory
    zoo_file = tmp_path / "one.yaml"
    model = {
        "name": "tiny_net",
        "task": "classification",
        "model": {"factory": "tiny_models:tiny_net", "kwargs": {"num_classes": 5}},
        "inputs": [{"name": "input", "shape": [1, 3, 16, 16]}],
        "check": {"samples": 1},
        "compile": {"graph_kernel": "auto", "warmup": 0, "runs": 3},
    }
    zoo_file.write_text(yaml.safe_dump({"models": [model]}, sort_keys=False))
    out = tmp_path / "zoo"
    data = run_batch(load_zoo(zoo_file), ZooOptions(out_root=out, profile_calls=1), str(zoo_file))
    (row,) = data["models"]
    assert row["status"] == "passed", row["reason"]
    profile = json.loads((out / "tiny_net/profile/profile.json").read_text())
    assert set(profile["variants"]) == {"torch", "ms_graph_folded", "ms_graph_folded_gk"}
    chosen = {"graph": "ms_graph_folded", "graph_kernel": "ms_graph_folded_gk"}[row["winner"]]
    figures = profile["variants"][chosen]
    assert row["kernels"] == figures["kernels_per_call"] > 0
    assert row["small_op_share"] == figures["small_op_share"]
    assert row["winner_margin"] is not None
    assert Path(row["profile_png"]) == out / "tiny_net/profile/modules.png"
    assert Path(row["profile_png"]).stat().st_size > 1000
    page = (out / "summary.html").read_text()
    assert '<img src="tiny_net/profile/modules.png"' in page
    assert "![tiny_net](tiny_net/profile/modules.png)" in (out / "summary.md").read_text()
