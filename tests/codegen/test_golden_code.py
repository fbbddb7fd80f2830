"""Golden files of the generated ``network.py``, one per code style, on tiny models: the modules
layout (as rebuilt, and folded with a block's optional child), the flat layout, a
sequence-length profile (``seq`` and ``batch`` symbols in the sizes) and the generated
``Conv3dBnAct`` cell. A change to the generated code shows here as a diff to review; when it is
intended, write the files again and review them:

    TORCH2MS_GOLDEN=write .venv/bin/python -m pytest -q tests/codegen/test_golden_code.py

Each file is also checked to be ruff-clean at line length 100, the generated code's own setting."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

from codegen.generate import assigned_twice, generate
from codegen.test_module_layout import Net as NestedNet
from codegen.test_optional_child import TinyResNet
from torch2ms.codegen.batch import BatchVariant
from torch2ms.codegen.convert import convert_graph
from torch2ms.graph.load import graph_from_model
from torch2ms.passes import rebuild_passes, run_passes

GOLDEN = Path(__file__).parent / "golden"


class Video(nn.Module):
    """Conv3d -> BatchNorm3d -> ReLU twice, then a pooled head: the fusion pass's Conv3dBnAct."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv3d(8, 8, 3, stride=2, padding=1), nn.BatchNorm3d(8), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).mean((2, 3, 4)))


class Tokens(nn.Module):
    """Token ids -> embeddings -> per-head mixing (reshapes that carry the batch and the length)."""

    def __init__(self, vocab: int = 50, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim // heads, dim // heads)
        self.head = nn.Linear(dim, 3)

    def forward(self, ids):
        b, s = ids.shape
        h = self.embed(ids).view(b, s, self.heads, -1)
        h = self.mix(h).reshape(b, s, -1)
        return self.head(h.mean(1))


def sequence_profile_code() -> str:
    """``Tokens`` at batch 1 and length 16 with lengths (8, 16, 17) and batches (1, 2) listed: the
    graphs at the other sizes tell the sizes that carry the batch and the length."""
    torch.manual_seed(0)
    model = Tokens().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.zeros(1, 16, dtype=torch.long),), buf, dynamo=False, opset_version=17,
            input_names=["input_ids"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"}},
        )  # fmt: skip
    proto = onnx.load_from_string(buf.getvalue())

    def graph(batch: int, seq: int):
        g = graph_from_model(proto, 17, {"input_ids": (batch, seq)})
        run_passes(g, rebuild_passes(True))
        return g

    variant = BatchVariant(graph(2, 16), 1, 2, "input_ids", 16, "input_ids", (graph(1, 17), graph(2, 17)), seq_other=17)
    net = convert_graph(graph(1, 16), "Tokens", "model.onnx", "0" * 64, "test", variant, layout="modules")
    assert net.layout.get("modules_failed") == "a sequence-length profile is written flat", net.layout
    return net.source


STYLES = {
    "modules": lambda: generate(NestedNet(), (1, 3, 16, 16)).source,
    "modules_fold": lambda: generate(TinyResNet(), (1, 3, 16, 16), fold=True).source,
    "flat": lambda: generate(NestedNet(), (1, 3, 16, 16), layout="flat").source,
    "sequence_profile": sequence_profile_code,
    "conv3d_bn_act": lambda: generate(Video(), (1, 3, 4, 8, 8)).source,
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_generated_code_equals_its_golden_file(style, tmp_path):
    source = STYLES[style]()
    path = GOLDEN / f"{style}.py"
    if os.environ.get("TORCH2MS_GOLDEN") == "write":
        path.write_text(source)
    assert path.exists(), f"{path} is missing: write it with TORCH2MS_GOLDEN=write (see the module docstring)"
    assert source == path.read_text(), f"the generated code differs from {path}; if intended, write it again"
    assert not assigned_twice(source)
    (tmp_path / "network.py").write_text(source)
    ruff = [
        sys.executable,
        "-m",
        "ruff",
        "check",
        "--isolated",
        "--line-length",
        "100",
        "--extend-select",
        "E501",
        str(tmp_path / "network.py"),
    ]
    assert subprocess.run(ruff, capture_output=True).returncode == 0
