"""Divergence localization (``torch2ms diff`` and the runner's hook on a failed rebuild/fold).

Faults are injected into a real conversion of a tiny model (a wrong converter in the registry,
a wrong folded bias), so the generated code really differs from the ONNX graph at one node;
the localization must name exactly that node and its line, with every tensor before it within
tolerance of onnxruntime. A correct conversion must report no diverging node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, TESTS, run_cli, write_recipe

from torch2ms.compare import Tolerance, compare_arrays
from torch2ms.converters import api, registry
from torch2ms.divergence import _Accumulator, probe_source, statement_lines
from torch2ms.errors import EXIT_CHECK_FAILED, EXIT_USAGE, CheckFailed
from torch2ms.pipeline.runner import raise_for
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner


@pytest.fixture(autouse=True)
def _wide(wide_console):
    """Messages are compared unwrapped (see conftest.wide_console)."""


def inject(monkeypatch, op_type: str, fn) -> None:
    """Replace every registration of ``op_type`` by ``fn`` (a deliberately wrong converter)."""
    registry.registrations()  # import every converter module first
    monkeypatch.setitem(api.REGISTRY, ("", op_type), [api.Registration(op_type, 1, fn)])


def wrong_add(em):
    """Add(A, B) -> C   emitted as A - B (an injected fault)"""
    return f"{em.operand(0)} - {em.operand(1)}"


def wrong_sigmoid(em):
    """Sigmoid(X) -> Y   emitted as tanh (an injected fault)"""
    return f"ops.tanh({em.x(0)})"


def line_of(path, text: str) -> int:
    """1-based line of the only line of ``path`` that contains ``text``."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def onnx_node(path, name: str) -> onnx.NodeProto:
    return next(n for n in onnx.load(str(path)).graph.node if n.name == name)


def assert_localized(diff: dict, node: str, line: int) -> dict:
    """``node`` is the first divergence, everything before it and its inputs are within tolerance."""
    first = diff["first"]
    assert first is not None and first["node"] == node and first["line"] == line, first
    order = [t["node"] for t in diff["tensors"]]
    before = diff["tensors"][: order.index(node)]
    assert before and all(t["ok"] for t in before), [t for t in before if not t["ok"]]
    assert not first["ok"] and first["metrics"]["rel_error"] > diff["tolerance"]["rel_error"]
    assert set(first["input_metrics"]) == {i for i in first["inputs"] if i in {t["tensor"] for t in diff["tensors"]}}
    assert all(m["rel_error"] <= diff["tolerance"]["rel_error"] for m in first["input_metrics"].values())
    return first


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A correct conversion up to fold, shared by the read-only tests."""
    path = write_recipe(tmp_path_factory.mktemp("good") / "tiny.yaml")
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run(until="fold")
    assert [s.status for s in result.stages[:3]] == ["passed"] * 3, [
        (s.stage, s.status, s.reason) for s in result.stages
    ]
    return path, result.root


# --- faults -----------------------------------------------------------------------------------


def test_wrong_add_is_localized_when_rebuild_fails_and_by_the_cli(tmp_path, monkeypatch):
    inject(monkeypatch, "Add", wrong_add)
    recipe = write_recipe(tmp_path / "tiny.yaml")
    logs = []
    result = pipeline_runner(load_recipe(recipe), log=logs.append).run(until="fold")
    status = {s.stage: s for s in result.stages}
    assert status["rebuild"].status == "failed" and status["fold"].status == "not run", logs
    stage_dir = result.root / "rebuild"
    network = stage_dir / "network.py"
    line = line_of(network, "add = ")
    assert network.read_text().splitlines()[line - 1].strip() == "add = proj - y"

    diff = json.loads((stage_dir / "diff.json").read_text())
    first = assert_localized(diff, "/Add", line)
    assert first["op"] == "Add" and first["code"] == "add = proj - y" and first["file"] == str(network)
    assert first["tensor"] == onnx_node(result.root / "export" / "model.onnx", "/Add").output[0]
    assert first["onnx_nodes"] == [{"node": "/Add", "op": "Add", "attributes": {}}]
    # the failure names the node and its line; diff.md is part of the stage's artifacts
    assert f"first diverging node: Add '/Add' at {network}:{line} (add = proj - y)" in status["rebuild"].reason
    record = json.loads((stage_dir / "stage.json").read_text())
    assert (
        record["status"] == "failed"
        and record["diff"].startswith("first diverging node: Add '/Add'")
        and "diff.md" in record["artifacts"]
    )
    with pytest.raises(CheckFailed) as info:
        raise_for(result)
    assert "/Add" in str(info.value) and str(stage_dir / "diff.md") in str(info.value)

    # The CLI in a fresh process (real converters there): it reads the generated code on disk.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), GLOG_v="3")
    (stage_dir / "diff.json").unlink()
    r = subprocess.run(
        [sys.executable, "-m", "torch2ms", "diff", "--recipe", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == EXIT_CHECK_FAILED, r.stderr
    assert (
        "rebuild: 10 tensors of the generated code compared with onnxruntime on 2 sample(s)" in r.stdout
    )  # --stage defaults to the failed one
    assert re.search(r"first diverging node: Add /Add \(computes '.*Add_output_0'\)", r.stdout), r.stdout
    assert f"  code:   {network}:{line}\n          add = proj - y\n" in r.stdout, r.stdout
    assert "after it: 6 more tensor(s) out of tolerance, inherited" in r.stdout
    assert json.loads((stage_dir / "diff.json").read_text())["first"]["line"] == line


def test_wrong_folded_bias_is_localized_to_that_conv_in_the_fold_stage(tmp_path, monkeypatch):
    """Fold: BatchNorms are folded away, so the culprit is the fused conv statement that now
    computes the BatchNorm's (here the ReLU6's) tensor; only the second conv is wrong."""
    from torch2ms.passes import fold_bn

    real = fold_bn.fold_bn_weights

    def biased(w, b, *stats):
        w_f, b_f = real(w, b, *stats)
        return (w_f, b_f + 0.5) if w.shape == (8, 8, 3, 3) else (w_f, b_f)  # block's conv only

    monkeypatch.setattr(fold_bn, "fold_bn_weights", biased)
    result = pipeline_runner(load_recipe(write_recipe(tmp_path / "tiny.yaml")), log=lambda m: None).run(until="fold")
    status = {s.stage: s.status for s in result.stages}
    assert status["rebuild"] == "passed" and status["fold"] == "failed", status
    network = result.root / "fold" / "network.py"
    diff = json.loads((result.root / "fold" / "diff.json").read_text())
    first = assert_localized(diff, "/block/block.0/Conv", line_of(network, "block = self.block("))
    assert first["op"] == "ConvBnAct" and first["origin"] == [
        "/block/block.0/Conv",
        "/block/block.1/BatchNormalization",
        "/block/block.2/Clip",
    ]
    onnx_path = result.root / "export" / "model.onnx"
    assert first["tensor"] == onnx_node(onnx_path, "/block/block.2/Clip").output[0]
    conv = onnx_node(onnx_path, "/block/block.0/Conv")
    expected = {a.name: list(a.ints) if a.ints else a.i for a in conv.attribute}
    assert first["onnx_nodes"][0] == {"node": "/block/block.0/Conv", "op": "Conv", "attributes": expected}
    assert expected["kernel_shape"] == [3, 3] and expected["pads"] == [1, 1, 1, 1]
    assert [n["op"] for n in first["onnx_nodes"]] == ["Conv", "BatchNormalization", "Clip"]
    eps = next(a.f for a in onnx_node(onnx_path, "/block/block.1/BatchNormalization").attribute if a.name == "epsilon")
    assert first["onnx_nodes"][1]["attributes"]["epsilon"] == 1e-05 == float(str(np.float32(eps)))  # not 9.99999974e-06
    assert diff["tensors"][0]["node"] == "/stem/stem.0/Conv" and diff["tensors"][0]["ok"]  # the first conv is fine


def test_wrong_sigmoid_on_a_graph_output_of_a_two_output_model(tmp_path, monkeypatch):
    inject(monkeypatch, "Sigmoid", wrong_sigmoid)
    recipe = write_recipe(
        tmp_path / "seg.yaml",
        name="seg",
        model={"factory": "tiny_models:tiny_seg"},
        inputs=[{"name": "input", "shape": [1, 3, 16, 16]}],
        rebuild={"fuse_conv_bn_act": False},  # keep the aux head's Sigmoid a node of its own (not Conv2dBnAct's)
    )
    result = pipeline_runner(load_recipe(recipe), log=lambda m: None).run(until="rebuild")
    assert result.stages[1].status == "failed"
    network = result.root / "rebuild" / "network.py"
    diff = json.loads((result.root / "rebuild" / "diff.json").read_text())
    first = assert_localized(diff, "/Sigmoid", line_of(network, "ops.tanh("))
    assert first["tensor"] == "aux"  # a graph output
    assert [t["node"] for t in diff["tensors"] if not t["ok"]] == ["/Sigmoid"]  # the other output is right


def test_a_crashing_localization_never_hides_the_stage_failure(tmp_path, monkeypatch):
    from torch2ms import divergence

    def boom(*args, **kwargs):
        raise RuntimeError("probe exploded")

    inject(monkeypatch, "Add", wrong_add)
    monkeypatch.setattr(divergence, "localize", boom)
    logs = []
    result = pipeline_runner(load_recipe(write_recipe(tmp_path / "tiny.yaml")), log=logs.append).run(until="rebuild")
    rebuild = result.stages[1]
    assert rebuild.status == "failed" and rebuild.reason.startswith("output 'output': relative error")
    assert "first diverging node" not in rebuild.reason
    assert any("could not be localized (RuntimeError: probe exploded)" in m for m in logs), logs
    assert not (result.root / "rebuild" / "diff.json").exists()
    with pytest.raises(
        CheckFailed, match="stage 'rebuild' is out of tolerance against PyTorch: output 'output'"
    ) as info:
        raise_for(result)
    assert "torch2ms diff --stage rebuild" in str(info.value)


# --- a correct conversion ---------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["rebuild", "fold"])
def test_correct_conversion_has_no_diverging_node(good_run, stage, capsys):
    recipe, root = good_run
    assert run_cli("diff", "--recipe", str(recipe), "--stage", stage) == 0
    out = capsys.readouterr().out
    assert f"{stage}: 10 tensors of the generated code compared with onnxruntime on 2 sample(s)" in out
    assert "no diverging node: every tensor is within tolerance" in out
    diff = json.loads((root / stage / "diff.json").read_text())
    tensor_map = json.loads((root / stage / "tensor_map.json").read_text())
    assert diff["first"] is None and diff["out_of_tolerance"] == 0
    # every mapped tensor is compared, except those a pass made that the ONNX does not hold (the fold
    # stage's Ascend rewrite splits the padded MaxPool into Pad + MaxPool)
    import onnx

    onnx_tensors = {o for n in onnx.load(str(root / "export" / "model.onnx")).graph.node for o in n.output}
    skipped = diff["not_compared"]
    assert diff["compared"] + len(skipped) == len(tensor_map) and not onnx_tensors & set(skipped), skipped
    assert [t["tensor"] for t in diff["tensors"]] == [e["tensor"] for e in tensor_map if e["tensor"] not in skipped]
    md = (root / stage / "diff.md").read_text()
    assert all(
        f"| {e['line']} | `{e['var']}` | {e['op']} | {e['node']} |" in md
        for e in tensor_map
        if e["tensor"] not in skipped
    ), md


def test_tensor_map_lines_and_inputs(good_run):
    """Each tensor_map entry points at the statement assigning its variable, and lists the ONNX
    tensors the statement reads (the graph input, or tensors of earlier statements)."""
    _, root = good_run
    for stage in ("rebuild", "fold"):
        lines = (root / stage / "network.py").read_text().splitlines()
        seen = {"input"}
        for e in json.loads((root / stage / "tensor_map.json").read_text()):
            assert re.match(rf"\s+{e['var']}(, \w+)* = ", lines[e["line"] - 1]), (stage, e, lines[e["line"] - 1])
            assert e["inputs"] and set(e["inputs"]) <= seen, e
            seen.add(e["tensor"])


def test_probe_changes_only_the_return_line(good_run):
    _, root = good_run
    source = (root / "fold" / "network.py").read_text()
    probe = probe_source(source, ["stem", "add", "head"])
    old, new = source.splitlines(), probe.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert len(old) == len(new) and len(changed) == 1
    assert old[changed[0]] == "        return head" and new[changed[0]] == "        return (stem, add, head,)"
    assert statement_lines(probe) == statement_lines(source)


def test_diff_cli_errors_name_what_is_missing(tmp_path, capsys):
    recipe = write_recipe(tmp_path / "tiny.yaml")
    assert run_cli("diff", "--recipe", str(recipe)) == EXIT_USAGE
    err = re.sub(r"\s+", "", capsys.readouterr().err)  # rich wraps long paths anywhere
    assert (
        f"{tmp_path / 'runs' / 'tiny' / 'export' / 'model.onnx'}:notfound" not in err
    )  # all missing files are listed first
    assert (
        str(tmp_path / "runs" / "tiny" / "rebuild" / "tensor_map.json") in err
        and "therebuildstagehasnotrunfor'tiny'" in err
    )
    assert f"run`torch2msconvert--recipe{recipe}`first" in err
    assert run_cli("diff", "--recipe", str(recipe), "--stage", "compile") == EXIT_USAGE
    assert "--stage 'compile': choose one of rebuild, fold" in capsys.readouterr().err


# --- the metrics ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["random", "zeros", "nan", "inf"])
def test_accumulated_metrics_equal_compare_arrays_on_the_stacked_samples(case):
    rng = np.random.default_rng(1)
    ref = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(3)]
    act = [r + rng.standard_normal(r.shape).astype(np.float32) * 1e-3 for r in ref]
    if case == "zeros":
        ref = [np.zeros_like(r) for r in ref]
        act = [np.zeros_like(r) for r in ref]
    if case == "nan":
        act[1][0, 0, 0] = np.nan
    if case == "inf":
        ref[2][1, 1, 1] = np.inf
    acc = _Accumulator("t")
    for a, r in zip(act, ref):
        acc.add(a, r)
    got, want = acc.metrics(), compare_arrays("t", np.stack(act), np.stack(ref))
    if case in ("nan", "inf"):
        assert got.nonfinite and want.nonfinite and np.isnan(got.rel_error)
        assert got.nonfinite.split(" has ")[1] == want.nonfinite.split(" has ")[1]
        return
    for field in ("max_abs", "rel_error", "mean_abs", "cosine"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-9, abs=1e-12), field


def test_metrics_taken_chunk_by_chunk_are_the_whole_arrays_figures(monkeypatch):
    """``MetricsAccumulator`` reads its arrays in chunks (so a check holds no float64 copy of a large
    output): with chunks of 7 values, 100 values give the same figures as whole-array numpy, a NaN
    and integer mismatches past the first chunk are counted, and the argmax agreement of samples
    compared one by one is that of the stacked samples."""
    from torch2ms.compare import MetricsAccumulator, compare_outputs

    monkeypatch.setattr(MetricsAccumulator, "CHUNK", 7)
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((4, 25)).astype(np.float32)
    act = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-2
    m = compare_arrays("o", act, ref)
    a, r = act.astype(np.float64), ref.astype(np.float64)
    assert m.max_abs == np.abs(a - r).max()
    assert m.rel_error == pytest.approx(np.abs(a - r).max() / np.abs(r).max(), rel=1e-12)
    assert m.mean_abs == pytest.approx(np.abs(a - r).mean(), rel=1e-12)
    assert m.cosine == pytest.approx((a.ravel() @ r.ravel()) / np.linalg.norm(a) / np.linalg.norm(r), rel=1e-12)
    assert m.argmax_agreement == (act.argmax(axis=1) == ref.argmax(axis=1)).mean()
    nan = act.copy()
    nan[3, 20] = np.nan  # value 95, in the 14th chunk
    assert compare_arrays("o", nan, ref).nonfinite == "stage output has 1 NaN"
    labels = np.arange(100, dtype=np.int64)
    wrong = labels.copy()
    wrong[[3, 50, 99]] += 1
    assert compare_arrays("o", wrong, labels).mismatched == 3
    samples = [{"o": act[i : i + 2]} for i in (0, 2)], [{"o": ref[i : i + 2]} for i in (0, 2)]
    per_sample = compare_outputs(*samples)[0]
    assert per_sample.argmax_agreement == m.argmax_agreement and per_sample.max_abs == m.max_abs


def test_a_shape_mismatch_is_a_divergence_not_a_crash():
    acc = _Accumulator("t")
    acc.add(np.zeros((1, 2)), np.zeros((2, 1)))
    assert acc.problem == "shape [1, 2] differs from onnxruntime's [2, 1]"


def test_code_generated_from_another_export_is_refused(good_run, tmp_path):
    import shutil

    from torch2ms.compare import Tolerance
    from torch2ms.divergence import localize
    from torch2ms.errors import Torch2msError
    from torch2ms.pipeline.workspace import load_npz, split_reference

    _, root = good_run
    shutil.copytree(root, tmp_path / "run")
    onnx_path = tmp_path / "run" / "export" / "model.onnx"
    model = onnx.load(str(onnx_path))
    model.producer_name = "re-exported"
    onnx.save(model, onnx_path)
    samples, _ = split_reference(load_npz(tmp_path / "run" / "export" / "reference.npz"))
    with pytest.raises(
        Torch2msError, match=r"fold/network\.py was generated from another ONNX file than .*model\.onnx"
    ) as info:
        localize(onnx_path, tmp_path / "run" / "fold", samples, Tolerance(), "fold")
    assert "run `torch2ms convert` again" in str(info.value)


def test_references_kept_on_disk_give_the_same_report(good_run, monkeypatch):
    """Past ``_References.IN_MEMORY`` bytes, onnxruntime's values wait on disk while MindSpore runs:
    every tensor's error and local error must be what the in-memory run gives, and the folder goes."""
    import tempfile

    from torch2ms import divergence
    from torch2ms.pipeline.workspace import load_npz, split_reference

    _, root = good_run
    samples, _ = split_reference(load_npz(root / "export" / "reference.npz"))

    def report():
        r = divergence.localize(root / "export" / "model.onnx", root / "fold", samples, Tolerance(), "fold")
        return [(t.tensor, t.metrics, t.local) for t in r.tensors]

    in_memory = report()
    made = []
    real = tempfile.TemporaryDirectory

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(divergence._References, "IN_MEMORY", 0)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", spy)
    on_disk = report()
    assert len(made) == len(samples) and not any(Path(d.name).exists() for d in made)
    assert on_disk == in_memory and all(local is not None for _, _, local in on_disk)


def test_references_computed_a_segment_at_a_time_give_the_same_verdicts(good_run, monkeypatch):
    """Past ``_References.SEGMENT`` bytes of compared tensors, onnxruntime computes them a segment of the
    graph at a time, each segment fed the values earlier ones computed. A cut after every node with a
    compared output: the same tensors, each statement's local error still measured and within the bound,
    and the errors those of one run up to rounding (a cut can stop one of onnxruntime's fusions)."""
    from torch2ms import divergence
    from torch2ms.pipeline.workspace import load_npz, split_reference

    _, root = good_run
    samples, _ = split_reference(load_npz(root / "export" / "reference.npz"))

    def report():
        return divergence.localize(root / "export" / "model.onnx", root / "fold", samples, Tolerance(), "fold")

    whole = report()
    segments = []
    real = divergence._segment_model
    monkeypatch.setattr(divergence._References, "SEGMENT", 1)
    monkeypatch.setattr(divergence.references, "_segment_model", lambda *a: segments.append(a[1]) or real(*a))
    cut = report()
    assert len(segments) >= len(whole.tensors) * len(samples) // 2 and all(len(s) < 20 for s in segments)
    assert [t.tensor for t in cut.tensors] == [t.tensor for t in whole.tensors]
    assert cut.first is None and whole.first is None
    for a, b in zip(cut.tensors, whole.tensors):
        assert a.local is not None and a.ok, a
        assert a.metrics.rel_error == pytest.approx(b.metrics.rel_error, rel=1e-3, abs=1e-6), a.tensor


def test_a_wrong_add_is_localized_with_the_references_in_segments(tmp_path, monkeypatch):
    """The segments' values are onnxruntime's, so a wrong statement is still the first diverging one."""
    from torch2ms import divergence

    monkeypatch.setattr(divergence._References, "SEGMENT", 1)
    inject(monkeypatch, "Add", wrong_add)
    result = pipeline_runner(load_recipe(write_recipe(tmp_path / "tiny.yaml")), log=lambda m: None).run(until="rebuild")
    assert {s.stage: s.status for s in result.stages}["rebuild"] == "failed"
    network = result.root / "rebuild" / "network.py"
    assert_localized(
        json.loads((result.root / "rebuild" / "diff.json").read_text()), "/Add", line_of(network, "add = ")
    )
