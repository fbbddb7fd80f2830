"""No bound so wide that it cannot fail: past ``check.ceiling`` a stage passes only with evidence.

The network (``ill_conditioned.ill_net``) is ill-conditioned by construction: two correct float32
implementations are ~1e-2 apart on it, so the noise-floor rule widens every stage's bound to
~0.6, where a converter bug that moves the output by 10% would pass. With the ceiling (1e-3):
- the export stage (onnxruntime against PyTorch, nothing to replay) passes only because
  ``model.onnx`` run in float64 agrees with PyTorch in float64 within 1e-5
  (``evidence.by == "float64"``); a fault in the exported graph fails it, and a graph the float64
  evaluator cannot run is ``not checkable``;
- rebuild and fold pass only because ``diff``'s replay finds every statement within 1e-5 of
  onnxruntime on onnxruntime's own inputs (``evidence.by == "replay"``); compile on that replay and
  on its outputs matching the same code in PyNative;
- a fault injected into one converter fails rebuild although its error is inside the widened bound.
"""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
from conftest import write_recipe
from onnx import numpy_helper

from pipeline.test_fault_injection import _inject, _missing_bias, _shuffled_weight, _sign_flip
from torch2ms.errors import EXIT_NOT_CHECKABLE, NotCheckable
from torch2ms.pipeline.runner import raise_for
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

TARGET = "/k/k.0/Conv"  # the well-conditioned branch's Conv + BatchNorm + ReLU, one ConvBnAct


def _ill_recipe(tmp, factory: str):
    path = write_recipe(
        tmp / "ill.yaml",
        name="ill",
        model={"factory": f"ill_conditioned:{factory}", "seed": 0},
        inputs=[{"name": "input", "shape": [1, 3, 16, 16]}],
        task="other",
    )
    return load_recipe(path)


@pytest.fixture(scope="module")
def ill_run(tmp_path_factory):
    recipe = _ill_recipe(tmp_path_factory.mktemp("ill"), "ill_net")
    return recipe, pipeline_runner(recipe, log=lambda m: None).run(until="compile")


@pytest.fixture(scope="module")
def unevaluated_run(tmp_path_factory):
    """The same network, where onnx's reference evaluator cannot run the graph in float64 (as for an
    op it does not implement): the export has no evidence."""

    def run(*args, **kwargs):
        raise NotImplementedError("Operator 'Conv' (domain '') has no float64 implementation")

    recipe = _ill_recipe(tmp_path_factory.mktemp("ill32"), "ill_net")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("torch2ms.export.float64.run", run)
        return recipe, pipeline_runner(recipe, log=lambda m: None).run(until="compile")


def _record(result, stage: str) -> dict:
    return json.loads((result.root / stage / "stage.json").read_text())


def test_the_network_widens_every_bound_past_the_ceiling(ill_run):
    recipe, result = ill_run
    for stage in ("export", "rebuild", "fold", "compile"):
        bound = _record(result, stage)["bounds"]["output"]
        assert bound["rel_error"] > 100 * recipe.check.ceiling, (stage, bound)


def test_the_export_stage_passes_on_its_float64_evidence(ill_run):
    recipe, result = ill_run
    export = result.stages[0]
    assert export.status == "passed", export.reason
    record = _record(result, "export")
    ev = record["evidence"]
    assert record["worst"]["rel_error"] > 10 * recipe.check.ceiling  # float32 cannot decide: it needed evidence
    assert ev["by"] == "float64" and "check.ceiling" in ev["needed"][0], ev
    assert ev["max_rel_error"] <= 1e-6 and ev["local_bound"] == 1e-5 and ev["compared"] == 1, ev
    assert ev["evaluator"] == "onnx.reference.ReferenceEvaluator"


def _flip_sign_of(node_name: str):
    """A fault in the exported graph: ``node_name``'s weight negated in model.onnx."""
    from torch2ms.stages import export as export_stage

    real = export_stage.export_model

    def export_model(model, example, onnx_path, *args, **kwargs):
        produced = real(model, example, onnx_path, *args, **kwargs)
        graph = onnx.load(str(onnx_path))
        weight = next(n.input[1] for n in graph.graph.node if n.name == node_name)
        init = next(t for t in graph.graph.initializer if t.name == weight)
        init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
        onnx.save(graph, str(onnx_path))
        return produced

    return export_model


def test_a_fault_in_the_exported_graph_fails_the_export(ill_run, tmp_path, monkeypatch):
    recipe = _ill_recipe(tmp_path, "ill_net")
    monkeypatch.setattr("torch2ms.stages.export.export_model", _flip_sign_of(TARGET))
    result = pipeline_runner(recipe, out_root=tmp_path / "runs", log=lambda m: None).run(until="export")
    export, record = result.stages[0], _record(result, "export")
    assert export.status == "failed", record["evidence"]
    # the old rule (the widened bound alone) would have passed it: the error is inside the bound
    worst, bound = record["worst"], record["bounds"]["output"]
    assert recipe.check.ceiling < worst["rel_error"] <= bound["rel_error"] and worst["cosine"] >= bound["cosine"]
    ev = record["evidence"]
    assert ev["by"] == "wrong" and ev["max_rel_error"] > 100 * ev["local_bound"], ev
    assert "model.onnx in float64 differs from PyTorch in float64" in export.reason


def test_an_export_without_float64_evidence_is_not_checkable(unevaluated_run):
    _, result = unevaluated_run
    export = result.stages[0]
    assert export.status == "not checkable", export.reason
    record = _record(result, "export")
    assert record["evidence"]["by"] == "none" and "check.ceiling" in record["evidence"]["needed"][0]
    assert "cannot run model.onnx in float64 (NotImplementedError" in record["evidence"]["why"]
    worst, bound = record["worst"], record["bounds"]["output"]
    assert worst["rel_error"] <= bound["rel_error"] and worst["cosine"] >= bound["cosine"]  # the old rule passed it
    assert "inputs[].data" in export.reason
    assert not result.passed
    with pytest.raises(NotCheckable) as err:
        raise_for(result)
    assert err.value.exit_code == EXIT_NOT_CHECKABLE and "not checkable" in str(err.value)


def test_clean_nodes_pass_on_the_replays_evidence(ill_run):
    recipe, result = ill_run
    assert [(s.stage, s.status) for s in result.stages[1:4]] == [
        ("rebuild", "passed"),
        ("fold", "passed"),
        ("compile", "passed"),
    ]
    for stage in ("rebuild", "fold", "compile"):
        record = _record(result, stage)
        ev = record["evidence"]
        assert record["worst"]["rel_error"] > recipe.check.ceiling, stage  # it needed the evidence
        assert ev["by"] == "replay" and ev["max_local_error"] <= ev["local_bound"] == 1e-5 * 1.0, (stage, ev)
        assert ev["node"] and ev["compared"] >= 5
    assert _record(result, "compile")["evidence"]["stage"] == "fold"  # the code compile was built from
    assert _record(result, "compile")["evidence"]["pynative_rel_error"] <= recipe.check.rel_error
    # fold's own check ran that code in PyNative in this process: compile compares with those outputs
    assert _record(result, "compile")["evidence"]["pynative_ran"] == "fold's check, this run"


@pytest.mark.parametrize(
    "fault", [_sign_flip, _shuffled_weight, _missing_bias], ids=["sign_flip", "shuffled_weight", "missing_bias"]
)
def test_a_fault_inside_the_widened_bound_fails(ill_run, tmp_path, monkeypatch, fault):
    recipe, result = ill_run
    root = tmp_path / "runs"
    shutil.copytree(result.root, root / recipe.name, ignore=shutil.ignore_patterns(".lock"))
    _inject(monkeypatch, "ConvBnAct", "torch2ms", TARGET, fault)
    rerun = pipeline_runner(recipe, out_root=root, log=lambda m: None).run(until="rebuild", from_stage="rebuild")
    rebuild = rerun.stages[1]
    record = _record(rerun, "rebuild")
    assert rebuild.status == "failed", record["evidence"]
    # the old rule (the widened bound alone) would have passed it: the error is inside the bound
    worst, bound = record["worst"], record["bounds"]["output"]
    assert recipe.check.ceiling < worst["rel_error"] <= bound["rel_error"] and worst["cosine"] >= bound["cosine"]
    assert record["evidence"]["by"] == "wrong" and record["evidence"]["node"] == TARGET
    assert f"'{TARGET}'" in rebuild.reason


def test_a_not_checkable_verdict_is_kept_and_compile_replays_what_fold_did_not_record(unevaluated_run, tmp_path):
    """A re-run keeps the export's verdict without exporting again; compile, without fold's recorded
    replay, replays fold's network.py itself."""
    recipe, result = unevaluated_run
    root = tmp_path / "runs"
    shutil.copytree(result.root, root / recipe.name, ignore=shutil.ignore_patterns(".lock"))
    fold = root / recipe.name / "fold" / "stage.json"
    record = json.loads(fold.read_text())
    del record["evidence"]
    fold.write_text(json.dumps(record))
    rerun = pipeline_runner(recipe, out_root=root, log=lambda m: None).run(until="compile", from_stage="compile")
    assert [s.status for s in rerun.stages[:4]] == ["not checkable", "up to date", "up to date", "passed"]
    assert "check.ceiling" in rerun.stages[0].reason and not rerun.passed
    assert _record(rerun, "export")["seconds"] == _record(result, "export")["seconds"]  # not exported again
    ev = _record(rerun, "compile")["evidence"]
    assert ev["by"] == "replay" and ev["stage"] == "fold" and ev["max_local_error"] <= ev["local_bound"]
    assert ev["pynative_ran"] == "here" and ev["pynative_rel_error"] <= recipe.check.rel_error  # fold was up to date
