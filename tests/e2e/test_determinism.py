"""Determinism: one recipe converted twice, in two processes with different hash seeds and into
two different ``--out`` folders, gives byte-identical generated code, reference data, ONNX,
checkpoints, tensor maps and records/reports apart from timings.

The one exception is the MindIR, which MindSpore 2.10 never writes the same way twice: it
embeds an ``export.mindir.<timestamp>.<address>`` string, numbers nodes from process-wide
counters, and orders some node-name parts and primitives from unordered C++ containers (even
with a fixed PYTHONHASHSEED and the same path). For it we require the same weights (by
parameter name), the same operators, and bit-identical outputs when both are loaded and run.
Our own share of that nondeterminism (the generated module was named after ``hash(path)``,
which MindSpore copies into every node name) is fixed and checked here too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TESTS, write_recipe

from torch2ms.pipeline.workspace import load_npz
from torch2ms.stages import stage_names

BYTE_IDENTICAL = [
    "export/model.onnx",
    "export/reference.npz",
    "rebuild/network.py",
    "rebuild/network.ckpt",
    "rebuild/tensor_map.json",
    "rebuild/conversion.json",
    "fold/network.py",
    "fold/network.ckpt",
    "fold/tensor_map.json",
    "fold/conversion.json",
]
TIMING_KEYS = {
    "seconds",
    "seconds_total",
    "cpu_seconds",
    "memory",  # resident memory per stage
    "decision",  # compile's timed rounds and their p
    "compile_s",
    "median_ms",
    "p90_ms",
    "first_call_s",
    "pynative_median_ms",
    "speedup_vs_pynative",
    "pynative_call_s",  # rebuild's and fold's check calls, timed
}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("determinism")
    write_recipe(work / "tiny.yaml")
    roots = []
    for seed in ("1", "2"):
        out = work / f"out_seed{seed}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), PYTHONHASHSEED=seed, GLOG_v="3")
        r = subprocess.run(
            [sys.executable, "-m", "torch2ms", "convert", "--recipe", "tiny.yaml", "--out", str(out)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        roots.append(out / "tiny")
    return roots


@pytest.mark.parametrize("rel", BYTE_IDENTICAL)
def test_artifact_is_byte_identical(two_runs, rel):
    a, b = (root / rel for root in two_runs)
    assert a.read_bytes() == b.read_bytes(), rel


def _untimed(obj, drop_mindir_bytes: bool = True):
    """A record/report with timings (and what MindSpore makes unstable) taken out."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in TIMING_KEYS or (drop_mindir_bytes and k == "mindir_bytes"):
                continue
            if k == "variants":  # compile: per-variant latencies only
                continue
            if k == "artifacts":
                v = {name: h for name, h in v.items() if name not in ("network.mindir", "compile.json")}
            out[k] = _untimed(v, drop_mindir_bytes)
        return out
    if isinstance(obj, list):
        return [_untimed(v, drop_mindir_bytes) for v in obj]
    return obj


@pytest.mark.parametrize("stage", stage_names())
def test_stage_record_is_identical_but_for_timings(two_runs, stage):
    a, b = (json.loads((root / stage / "stage.json").read_text()) for root in two_runs)
    assert a["fingerprint"] == b["fingerprint"]
    assert _untimed(a) == _untimed(b)


def test_reports_are_identical_but_for_timings(two_runs):
    a, b = (json.loads((root / "report.json").read_text()) for root in two_runs)
    assert _untimed(a) == _untimed(b)

    def md_without_timings(root: Path) -> list[str]:
        lines = []
        for line in (root / "report.md").read_text().splitlines():
            line = re.sub(r"in [\d.]+ s\.", "in T s.", line)
            if line.startswith("| "):
                cells = line.split(" | ")
                cells[2] = cells[3] = "T"  # seconds, peak RSS columns
                if cells[0] == "| compile":
                    cells[-1] = "T"  # latencies
                if cells[0] == "| mindir":
                    cells[-1] = "T"  # MindIR size
                line = " | ".join(cells)
            lines.append(line)
        return lines

    assert md_without_timings(two_runs[0]) == md_without_timings(two_runs[1])


def _mindir(path: Path):
    import mindspore.train.mind_ir_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(path.read_bytes())
    params = {p.name.split(":", 1)[-1]: (tuple(p.dims), p.data_type, p.raw_data) for p in m.graph.parameter}
    ops = Counter(re.sub(r":\d+$", "", n.op_type) for n in m.graph.node)
    return m, params, ops


def test_mindir_same_weights_operators_and_outputs(two_runs):
    (ma, pa, oa), (mb, pb_, ob) = (_mindir(root / "mindir" / "network.mindir") for root in two_runs)
    assert pa == pb_ and len(pa) == 8  # 3 folded convs (weight, bias) + the linear head
    assert oa == ob
    # our module name no longer differs between the runs (it was hash(path), per process)
    names = {n.name.split(":")[0] for n in ma.graph.node if ":" in n.name} | {
        n.name.split(":")[0] for n in mb.graph.node if ":" in n.name
    }
    generated = {re.sub(r"^\d+_\d+_", "", re.sub(r"_construct_\d+$", "", n)) for n in names}
    assert len(generated) == 1, generated

    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    ref = load_npz(two_runs[0] / "export" / "reference.npz")
    outs = []
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        for root in two_runs:
            cell = ms.nn.GraphCell(ms.load(str(root / "mindir" / "network.mindir")))
            outs.append([cell(ms.Tensor(x)).asnumpy() for x in ref["input.input"]])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    for x, y in zip(*outs):
        assert x.tobytes() == y.tobytes()
    np.testing.assert_allclose(np.stack(outs[0]), ref["output.output"], rtol=1e-4, atol=1e-5)
