"""Failure categories and blockers of zoo models (torch2ms.zoo.failures) from crafted errors, stage
records and rows; ``torch2ms zoo --compare``; the pruning rule of torch2ms.zoo.disk. The real
failures (a worker killed, an op without converter, ONNX that disagrees with PyTorch) are in
test_zoo.py."""

from __future__ import annotations

import json

import pytest

from torch2ms.cli import main
from torch2ms.converters.registry import Problem
from torch2ms.errors import ModelError, StageFailed, UnsupportedOpsError
from torch2ms.stages import PIPELINE
from torch2ms.zoo import failures, parse_zoo
from torch2ms.zoo.disk import superseded
from torch2ms.zoo.row import ModelRow
from torch2ms.zoo.summary import build, compare


def test_unsupported_ops_give_one_blocker_per_op_and_reason():
    err = UnsupportedOpsError(
        "2 op types cannot be converted",
        [
            Problem("GridSample", "/a/GridSample", "no converter"),
            Problem("GridSample", "/b/GridSample", "no converter"),
            Problem("Resize", "/up/Resize", "mode='cubic' not supported"),
        ],
    )
    f = failures.from_exception(err, "rebuild")
    assert f.category == "unsupported-op"
    assert f.blockers == ["GridSample: no converter", "Resize: mode='cubic' not supported"]


@pytest.mark.parametrize(
    "message, kind",
    [
        (
            "torch.onnx.export failed for smp:f: SymbolicValueError: Unsupported: ONNX export of operator "
            "adaptive_avg_pool2d, output size that are not factor of input size.",
            "torch.onnx.export: SymbolicValueError: Unsupported: ONNX export of operator adaptive_avg_pool2d",
        ),
        (
            "torch.onnx.export failed for timm:x: UnsupportedOperatorError: Exporting the operator aten::foo",
            "torch.onnx.export: UnsupportedOperatorError: Exporting the operator aten::foo",
        ),
        (
            "m:f: the model raised on the recipe's inputs (input [1, 3, 256, 256]): AssertionError: size",
            "the model raised AssertionError on its inputs",
        ),
        (
            "model.factory: cannot import module 'timm': ModuleNotFoundError: no timm",
            "factory module timm cannot be imported",
        ),
        ("model.factory: m:f(**{'a': 1}) raised TypeError: bad kwarg", "the factory raised TypeError"),
    ],
)
def test_export_errors_are_grouped_by_kind(message, kind):
    f = failures.from_exception(ModelError(message), "export")
    assert (f.category, f.blockers) == ("export", [kind])


def test_a_later_stage_that_raises_is_a_crash_named_by_its_cause():
    try:
        raise StageFailed("stage 'compile' failed after ['export']") from RuntimeError("graph build failed")
    except StageFailed as err:
        f = failures.from_exception(err, "compile")
    assert (f.category, f.blockers) == ("crash", ["compile: RuntimeError"])


def test_a_numeric_failure_names_the_first_diverging_op_from_diff(tmp_path):
    (tmp_path / "diff.json").write_text(json.dumps({"stage": "fold", "first": {"op": "Resize", "node": "/up/Resize"}}))
    f = failures.from_check("fold", {"violations": ["output 'out': rel error 1e-2 > 1e-4"]}, tmp_path)
    assert (f.category, f.blockers) == ("numeric", ["first diverging op: Resize"])
    assert failures.from_check("export", {"violations": ["x"]}, tmp_path / "none").blockers == [
        "export: onnxruntime differs from PyTorch"
    ]


def test_the_replay_names_a_wrong_node_or_says_the_error_accumulated(tmp_path):
    first = {"op": "BatchNormalization", "node": "bn"}
    (tmp_path / "diff.json").write_text(json.dumps({"first": first, "wrong": {"op": "Conv"}, "accumulated": False}))
    assert failures.from_check("rebuild", {}, tmp_path).blockers == ["wrong node: Conv"]
    (tmp_path / "diff.json").write_text(json.dumps({"first": first, "wrong": None, "accumulated": True}))
    assert failures.from_check("rebuild", {}, tmp_path).blockers == [
        "rebuild: accumulated rounding past noise_factor x the bound, no node wrong"
    ]


def test_a_stage_out_of_memory_is_oom_not_a_crash():
    # what MindSpore raised for alexnet's 244 MB checkpoint while other jobs held the memory
    cause = ValueError("the checkpoint protobuf content size 244404136 bytes exceeds current available memory 2165")
    try:
        raise StageFailed("stage 'compile' failed after ['export']") from cause
    except StageFailed as err:
        assert failures.from_exception(err, "compile").to_dict() == {
            "category": "oom",
            "blockers": ["oom in compile: ValueError"],
        }
    assert failures.from_exception(MemoryError(), "fold").category == "oom"


def test_exits_are_timeout_oom_or_crash_with_the_stage():
    assert failures.from_exit("timeout", "compile").to_dict() == {
        "category": "timeout",
        "blockers": ["timeout in compile"],
    }
    assert failures.from_exit("oom", None).blockers == ["oom before the first stage"]
    assert failures.from_exit("crashed", "fold", "killed by SIGSEGV").blockers == ["fold: worker killed by SIGSEGV"]


def _row(name, status="passed", category=None, blockers=()):
    return ModelRow(name, status, category=category, blockers=list(blockers))


def test_the_blocker_table_counts_models_most_first():
    rows = [
        _row("a", "failed", "unsupported-op", ["GridSample: no converter", "Einsum: equation"]),
        _row("b", "failed", "unsupported-op", ["GridSample: no converter"]),
        _row("c", "failed", "numeric", ["first diverging op: Resize"]),
        _row("d", "timeout", "timeout", ["timeout in compile"]),
        _row("e"),
    ]
    table = failures.blocker_table(rows)
    assert table[0] == {
        "category": "unsupported-op",
        "blocker": "GridSample: no converter",
        "count": 2,
        "models": ["a", "b"],
    }
    assert [t["blocker"] for t in table[1:]] == ["Einsum: equation", "first diverging op: Resize", "timeout in compile"]
    data = build(rows, {"zoo": "z", "executor": "local", "jobs": 1, "timeout": 1, "seconds": 1})
    assert data["categories"] == {"unsupported-op": 2, "numeric": 1, "timeout": 1}
    assert data["blockers"] == table


def _summary(path, statuses: dict[str, str]):
    rows = [{"name": n, "status": s, "reason": f"why {n}", "category": None} for n, s in statuses.items()]
    path.write_text(json.dumps({"headline": "h", "models": rows}))
    return path


def test_compare_lists_models_that_started_or_stopped_passing(tmp_path, capsys):
    old = {"a": "passed", "b": "failed", "c": "passed", "gone": "passed"}
    new = {"a": "passed", "b": "passed", "c": "timeout", "added": "failed"}
    assert compare(
        {"models": [{"name": n, "status": s} for n, s in old.items()]},
        {"models": [{"name": n, "status": s} for n, s in new.items()]},
    ) == {"started passing": ["b"], "stopped passing": ["c"], "new": ["added"], "gone": ["gone"]}
    o, n = _summary(tmp_path / "old.json", old), _summary(tmp_path / "new.json", new)
    with pytest.raises(SystemExit) as exit_:
        main(["zoo", str(n), "--compare", str(o)])
    assert exit_.value.code == 1  # a model stopped passing
    out = capsys.readouterr().out
    assert "started passing (1):\n  b\n" in out and "stopped passing (1):\n  c  [timeout] why c" in out


def test_compare_without_regressions_exits_0(tmp_path, capsys):
    o = _summary(tmp_path / "old.json", {"a": "failed"})
    n = _summary(tmp_path / "new.json", {"a": "passed"})
    main(["zoo", str(n), "--compare", str(o)])  # returns: exit 0
    assert "started passing (1):\n  a\n" in capsys.readouterr().out


def test_compare_with_an_unreadable_summary_names_it(tmp_path, capsys):
    bad = tmp_path / "old.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        main(["zoo", str(_summary(tmp_path / "new.json", {"a": "passed"})), "--compare", str(bad)])
    assert exit_.value.code == 2 and "not a zoo summary.json" in capsys.readouterr().err


def test_only_weights_a_later_stage_writes_again_are_pruned(tmp_path):
    stages = [cls() for cls in PIPELINE]
    base = {"name": "m", "model": {"factory": "x:y"}, "inputs": [{"shape": [1, 3, 8, 8]}]}
    (on,) = parse_zoo({"models": [base]}, "z", tmp_path)
    (off,) = parse_zoo({"models": [{**base, "fold": {"enabled": False}}]}, "z", tmp_path)
    assert superseded(stages, on.recipe) == {"rebuild": ["network.ckpt"]}
    assert superseded(stages, off.recipe) == {}  # the rebuild's weights are the network's then
