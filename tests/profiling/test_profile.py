"""``torch2ms profile`` on the tiny model: MindSpore's kernel scopes are PyTorch's module paths, the
op-type times add up to the kernel total and stay within the wall time, the JSON has its fields;
plus the pure parts (scope parsing, attribution of unscoped fused kernels)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from torch2ms.cli import _load_commands
from torch2ms.cli_app import app
from torch2ms.profile.core import summarize, torch_module
from torch2ms.profile.mindspore_ops import attribute, module_path


def test_module_path_from_scope():
    scope = "/".join(
        ("Default", "backbone-ResNetBackbone", "layer1-SequentialCell", "0-Bottleneck", "conv1-Conv2dBnAct")
    )
    scope += "/conv-Conv2d/Conv2D-op3"
    assert module_path(scope) == "backbone.layer1.0.conv1.conv"
    assert module_path("Default/ReduceMean-op0") == ""  # top level
    assert module_path("Default/GraphKernel_BiasAdd_ReLU_fusion-op0") is None  # fused: no scope
    assert module_path("Default/Conv2D-op0") == ""
    assert module_path("MatMul") is None  # PyNative


def test_fused_kernel_goes_to_the_module_that_ran_before_it():
    detail = [{"name": n} for n in ("Default/a-X/Conv2D-op0", "Default/GraphKernel_BiasAdd_ReLU_fusion-op0")]
    order = ["Default/a-X/Conv2D-op0", "Default/GraphKernel_BiasAdd_ReLU_fusion-op0"]
    assert attribute(detail, order)["Default/GraphKernel_BiasAdd_ReLU_fusion-op0"] == "a"
    assert attribute(detail, list(reversed(order)))["Default/GraphKernel_BiasAdd_ReLU_fusion-op0"] is None


def test_summary_small_op_share_and_modules():
    raw = {
        "wall_ms_per_call": 10.0,
        "kernels": [
            {"name": "x", "type": "Conv2D", "module": "stem.0.conv", "per_call": 1, "ms_per_call": 6.0},
            {"name": "y", "type": "BiasAdd", "module": "stem.0.conv", "per_call": 4, "ms_per_call": 0.2},
            {"name": "z", "type": "MaxPool", "module": "pool.max_pool2d", "per_call": 1, "ms_per_call": 1.8},
        ],
    }
    s = summarize(raw, small_ms=0.1, depth=2, names={"stem", "stem.0", "stem.1", "pool"})
    assert s["small_op_share"] == round(0.2 / 8.0, 4) and s["small_kernels_per_call"] == 4
    assert s["modules"] == {"stem.0": 6.2, "pool": 1.8}
    assert torch_module("pool.max_pool2d", None) == "pool.max_pool2d"


def test_profile_tiny(tiny_recipe):
    _load_commands()
    args = ["profile", "--recipe", str(tiny_recipe), "--calls", "2", "--depth", "3"]
    result = CliRunner().invoke(app, [*args, "--variants", "torch,ms_graph_folded"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = tiny_recipe.parent / "runs" / "tiny" / "profile"
    data = json.loads((out / "profile.json").read_text())
    assert {"recipe", "machine", "calls", "depth", "small_ms", "sample", "variants", "torch_modules"} <= set(data)
    names = set(data["torch_modules"])
    for key, v in data["variants"].items():
        assert "error" not in v, (key, v.get("error"))
        for field in ("wall_ms_per_call", "kernel_ms_per_call", "kernels_per_call", "small_op_share", "op_types"):
            assert v[field] is not None, (key, field)
        type_sum = sum(t["ms_per_call"] for t in v["op_types"].values())
        assert abs(type_sum - v["kernel_ms_per_call"]) <= 1e-3 * max(1.0, type_sum), key
        assert v["kernel_ms_per_call"] <= v["wall_ms_per_call"] * 1.02, key  # kernels run inside the calls
    graph = data["variants"]["ms_graph_folded"]
    scoped = {k["module"] for k in graph["kernels"] if k["module"]}
    assert scoped and all(torch_module(m, names) in names for m in scoped), scoped - names
    # every convolution sits in the PyTorch module that holds one
    torch_convs = {k["module"] for k in data["variants"]["torch"]["kernels"] if k["type"] == "aten::conv2d"}
    ms_convs = {torch_module(k["module"], names) for k in graph["kernels"] if k["type"] == "Conv2D"}
    assert ms_convs == torch_convs
    assert (out / "modules.png").stat().st_size > 1000
    md = (out / "profile.md").read_text()
    assert "small-op share" in md and "## Per module" in md and "ms_graph_folded" in md


def test_zoo_row_takes_winner_margin_and_profile_figures():
    from torch2ms.stages import stage_names
    from torch2ms.zoo.row import COLUMNS, ModelRow, compile_fields, profile_fields
    from torch2ms.zoo.summary import cells

    record = {
        "extra": {
            "chosen": "graph",
            "variants": {
                "pynative_plain": {"median_ms": 30.0},
                "graph": {"median_ms": 10.0},
                "graph_kernel": {"median_ms": 12.5},
            },
        }
    }
    assert compile_fields(record) == {"winner": "graph", "winner_margin": 0.25}
    one = {"extra": {"chosen": "graph", "variants": {"graph": {"median_ms": 10.0}}}}
    assert compile_fields(one) == {"winner": "graph", "winner_margin": None}
    profile = {"variants": {"ms_graph_folded": {"kernels_per_call": 161.0, "small_op_share": 0.0712}}}
    row = ModelRow("m", "passed", **compile_fields(record), **profile_fields(profile))
    shown = dict(zip([c[0] for c in COLUMNS], cells(row)[2 + len(stage_names()) :]))
    assert shown["winner"] == "graph" and shown["winner margin"] == "25.0%"
    assert shown["kernels"] == "161" and shown["small-op share"] == "7.1%"
