"""A wrong export names where it first departs from PyTorch (``torch2ms.export.first_diverging``): an
export whose first convolution is deliberately wrong blames that convolution, not the ReLU, the
second convolution or the Sigmoid downstream of it, which are all off too; a wrong Python branch in
the network's own code is placed after the module that still agrees."""

from __future__ import annotations

import json

import onnx
from conftest import write_recipe
from onnx import numpy_helper
from torch import nn

from export.test_export_verdict import _run
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Sigmoid()

    def forward(self, x):
        return self.head(self.conv2(self.act(self.conv1(x))))


def chain():
    return Chain()


def _wrong_first_conv(monkeypatch):
    """Every exporter's model.onnx with the first Conv's weight scaled by 1.5: one wrong node."""
    from torch2ms.export import exporters
    from torch2ms.graph.scopes import node_modules
    from torch2ms.stages import export as stage

    real = exporters.export_model

    def wrong(model, example, path, *args, **kwargs):
        out = real(model, example, path, *args, **kwargs)
        m = onnx.load(str(path))
        scopes = node_modules(m.graph)
        conv = next(n for n in m.graph.node if n.op_type == "Conv" and scopes.get(n.name) == "conv1")
        init = next(t for t in m.graph.initializer if t.name == conv.input[1])
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
        onnx.save(m, str(path))
        return out

    monkeypatch.setattr(exporters, "export_model", wrong)
    monkeypatch.setattr(stage, "export_model", wrong)


def test_the_wrong_node_upstream_is_named_not_the_ops_after_it(tmp_path, monkeypatch):
    _wrong_first_conv(monkeypatch)
    path = write_recipe(
        tmp_path / "m.yaml",
        name="m",
        task="other",
        model={"factory": "export.test_first_diverging:chain", "seed": 0},
        inputs=[{"name": "input", "shape": [1, 3, 16, 16]}],
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run(until="export")
    export = result.stages[0]
    assert export.status == "failed", export.reason
    verdict = json.loads((result.root / "export" / "stage.json").read_text())["extra"]["export_verdict"]
    found = verdict["first_diverging"]
    assert found["module"] == "conv1" and found["op"] == "Conv" and found["last_agreeing"] is None
    assert found["rel_error"] > 0.1
    assert "first diverging module 'conv1'" in export.reason


def test_a_wrong_branch_in_the_networks_code_is_placed_after_the_agreeing_module(tmp_path):
    export, record = _run(tmp_path, "branch")
    assert export.status == "failed"
    found = record["extra"]["export_verdict"]["first_diverging"]
    assert found["module"] is None and found["network_code_after"] == "conv" and found["sample"] == 1
    assert "network's own code after module 'conv'" in export.reason
