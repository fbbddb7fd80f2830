"""The export stage's fallback paths, with the real exporters and the real pipeline: a model the
TorchScript exporter can only write at a newer opset (nn.Fold: aten::col2im needs opset 18), one
only the dynamo exporter writes (adaptive_avg_pool2d to a size that does not divide the input),
one no path writes (every reason listed, nothing left behind), and a pinned exporter.

The dynamo exporter needs onnxscript. Where it is not installed, the dynamo path must fail with
that reason; the tests assert whichever the environment gives, and both ways can fail."""

from __future__ import annotations

import importlib.util
import json

import onnx
import pytest
import torch
from conftest import write_recipe
from pipeline.test_bad_input import assert_nothing_looks_complete
from pipeline.test_pipeline import run, statuses
from torch import nn
from torch.nn import functional as F

from torch2ms.errors import EXIT_USAGE, ModelError
from torch2ms.export.exporters import DYNAMO_OLDEST, TORCHSCRIPT_NEWEST, export_plan
from torch2ms.graph.validate import SUPPORTED_OPSETS
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

HAS_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
NO_ONNXSCRIPT = "the dynamo exporter needs the onnxscript package, which is not installed"


class FoldNet(nn.Module):
    """Conv -> BN -> ReLU, then nn.Unfold / nn.Fold (overlapping 2x2 patches summed back)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.fold = nn.Fold(output_size=(8, 8), kernel_size=2, stride=1)

    def forward(self, x):
        return self.fold(F.unfold(self.body(x), kernel_size=2, stride=1))


def fold_net() -> nn.Module:
    return FoldNet()


class OddPool(nn.Module):
    """Conv -> BN -> ReLU, then adaptive_avg_pool2d 7x7 -> 3x3 (3 does not divide 7)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x):
        return F.adaptive_avg_pool2d(self.body(x), (3, 3))


def odd_pool() -> nn.Module:
    return OddPool()


class Histogram(nn.Module):
    """torch.histc: no TorchScript symbolic at any opset, and the dynamo exporter refuses it too."""

    def forward(self, x):
        return torch.histc(x, bins=4)


def histogram() -> nn.Module:
    return Histogram()


class UnbatchedUnfold(nn.Module):
    """F.unfold of a 3-D (unbatched) tensor: both exporters write a Pad with 4-D pads for it."""

    def forward(self, x):
        return F.unfold(x[0], kernel_size=2)


def unbatched_unfold() -> nn.Module:
    return UnbatchedUnfold()


def _recipe(tmp_path, factory: str, shape, **export):
    return write_recipe(
        tmp_path / "r.yaml",
        name="r",
        task="other",
        model={"factory": f"export.test_export_fallback:{factory}", "seed": 0},
        inputs=[{"name": "input", "shape": list(shape)}],
        export=export,
    )


def _record(result, stage="export"):
    return json.loads((result.root / stage / "stage.json").read_text())


def test_plan_follows_the_recipe():
    from torch.onnx import _constants

    from torch2ms.recipe import ExportSpec

    # the newest opset the installed TorchScript exporter declares (a torch upgrade may raise it)
    assert TORCHSCRIPT_NEWEST == _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    newest = TORCHSCRIPT_NEWEST
    assert export_plan(ExportSpec()) == [("torchscript", list(range(17, newest + 1))), ("dynamo", [DYNAMO_OLDEST])]
    assert export_plan(ExportSpec(opset=19, exporter="torchscript")) == [("torchscript", list(range(19, newest + 1)))]
    assert export_plan(ExportSpec(opset=22, exporter="dynamo")) == [("dynamo", [22])]
    # an opset above what the TorchScript exporter declares is tried as asked, and only it
    assert export_plan(ExportSpec(opset=23, exporter="torchscript")) == [("torchscript", [23])]


def test_onnxruntime_runs_every_opset_the_plan_can_write():
    """The fallback range must be one onnxruntime and the loader both take."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    newest = max(TORCHSCRIPT_NEWEST, SUPPORTED_OPSETS.stop - 1)
    for opset in range(SUPPORTED_OPSETS.start, newest + 1):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0], opset


def test_fold_needs_a_newer_opset_and_converts_through_every_stage(tmp_path):
    result = run(_recipe(tmp_path, "fold_net", [1, 3, 8, 8]))
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    extra = _record(result)["extra"]
    assert extra["export_path"] == {"exporter": "torchscript", "opset": 18}
    [failed] = extra["export_attempts"]
    assert failed["exporter"] == "torchscript" and failed["opset"] == 17
    assert "aten::col2im" in failed["error"] and "added in version 18" in failed["error"]
    model = onnx.load(str(result.root / "export" / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert "Col2Im" in ops and ops.count("BatchNormalization") == 1
    assert [o.version for o in model.opset_import if o.domain == ""] == [18]
    assert "exporter_changes" not in extra  # TorchScript keeps BatchNorm
    assert _record(result, "rebuild")["counts"]["conv2d_bn_act"] == 1
    report = (result.root / "report.md").read_text()
    assert "exported by torchscript at opset 18 after torchscript opset 17: UnsupportedOperatorError" in report


def test_odd_adaptive_pool_only_the_dynamo_exporter_writes(tmp_path):
    path = _recipe(tmp_path, "odd_pool", [1, 3, 7, 7])
    if not HAS_ONNXSCRIPT:
        with pytest.raises(ModelError) as info:
            pipeline_runner(load_recipe(path), log=lambda m: None).run()
        msg = str(info.value)
        assert "torchscript opsets 17-20: SymbolicValueError: Unsupported: ONNX export of operator " in msg
        assert "output size that are not factor of input size" in msg
        assert f"dynamo opset {DYNAMO_OLDEST}: {NO_ONNXSCRIPT}" in msg
        assert_nothing_looks_complete(tmp_path / "runs" / "r", "export")
        return
    result = run(path)
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    extra = _record(result)["extra"]
    assert extra["export_path"] == {"exporter": "dynamo", "opset": DYNAMO_OLDEST}
    assert [(a["exporter"], a["opset"]) for a in extra["export_attempts"]] == [
        ("torchscript", o) for o in range(17, TORCHSCRIPT_NEWEST + 1)
    ]
    assert all("not factor of input size" in a["error"] for a in extra["export_attempts"])
    # measured, not assumed: the dynamo exporter folded the one BatchNorm into the conv
    assert _record(result)["counts"]["batchnorm_nodes"] == 0
    assert extra["exporter_changes"] == [
        "BatchNorm folded by the exporter (1 of 1 layers): Conv2dBnAct will fuse Conv->Act only"
    ]
    notes = (result.root / "report.md").read_text()
    assert "exported by dynamo at opset 18 after torchscript opsets 17-20: SymbolicValueError" in notes
    assert "BatchNorm folded by the exporter" in notes


def test_no_path_exports_lists_every_reason_and_writes_nothing(tmp_path):
    path = _recipe(tmp_path, "histogram", [1, 1, 4, 4])
    with pytest.raises(ModelError) as info:
        pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert info.value.exit_code == EXIT_USAGE
    msg = str(info.value)
    factory = "export.test_export_fallback:histogram"
    assert f"torch.onnx.export failed for {factory} on every path (export.exporter: auto):" in msg
    lines = [line.strip() for line in msg.splitlines()]
    assert lines[1] == (
        "torchscript opset 17: UnsupportedOperatorError: Exporting the operator 'aten::histc' to ONNX opset "
        "version 17 is not supported (opsets 18-20 not tried: no opset has a symbolic for it)"
    )
    dynamo = (
        NO_ONNXSCRIPT
        if not HAS_ONNXSCRIPT
        else "NotImplementedError: aten_histc with min == max (0.0) is not supported in this export path."
    )
    assert lines[2] == f"dynamo opset {DYNAMO_OLDEST}: {dynamo}"
    assert_nothing_looks_complete(tmp_path / "runs" / "r", "export")
    assert not (tmp_path / "runs" / "r" / "export").exists()


def test_pinned_torchscript_fails_with_its_reasons_only(tmp_path):
    path = _recipe(tmp_path, "odd_pool", [1, 3, 7, 7], exporter="torchscript", opset=19)
    with pytest.raises(ModelError) as info:
        pipeline_runner(load_recipe(path), log=lambda m: None).run()
    msg = str(info.value)
    assert "on every path (export.exporter: torchscript):" in msg
    assert "torchscript opsets 19-20: SymbolicValueError" in msg and "dynamo" not in msg.split("hint:")[0]
    assert "hint: export.exporter: auto also tries the other exporter" in msg
    assert not (tmp_path / "runs" / "r" / "export").exists()


def test_pinned_dynamo_is_recorded_and_changing_the_exporter_reexports(tmp_path):
    path = _recipe(tmp_path, "fold_net", [1, 3, 8, 8], exporter="dynamo", opset=18)
    if not HAS_ONNXSCRIPT:
        with pytest.raises(ModelError) as info:
            pipeline_runner(load_recipe(path), log=lambda m: None).run(until="export")
        assert f"dynamo opset 18: {NO_ONNXSCRIPT}" in str(info.value)
        assert "torchscript" not in str(info.value).split("hint:")[0]
    else:
        result = run(path, until="export")
        assert statuses(result)["export"] == "passed"
        extra = _record(result)["extra"]
        assert extra["export_path"] == {"exporter": "dynamo", "opset": 18} and "export_attempts" not in extra
        assert extra["exporter_changes"][0].startswith("BatchNorm folded by the exporter (1 of 1 layers)")
    # the exporter is part of the export fingerprint: torchscript re-exports, then is up to date
    write_recipe(
        path,
        name="r",
        task="other",
        model={"factory": "export.test_export_fallback:fold_net", "seed": 0},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8]}],
        export={"exporter": "torchscript", "opset": 18},
    )
    result = run(path, until="export")
    assert statuses(result)["export"] == "passed"
    assert _record(result)["extra"]["export_path"] == {"exporter": "torchscript", "opset": 18}
    assert statuses(run(path, until="export"))["export"] == "up to date"


def test_a_model_that_does_not_load_is_a_failed_path(tmp_path):
    path = _recipe(tmp_path, "unbatched_unfold", [1, 3, 6, 6], opset=19)
    with pytest.raises(ModelError) as info:
        pipeline_runner(load_recipe(path), log=lambda m: None).run()
    lines = [line.strip() for line in str(info.value).splitlines()]
    assert lines[1].startswith("torchscript opsets 19-20: wrote a model that does not load: ")
    assert "Pads has incorrect number of values" in lines[1]
    if HAS_ONNXSCRIPT:
        assert lines[2].startswith("dynamo opset 19: wrote a model that does not load: ")
        assert "Pads has incorrect number of values" in lines[2]
    else:
        assert lines[2] == f"dynamo opset 19: {NO_ONNXSCRIPT}"
    assert not (tmp_path / "runs" / "r" / "export").exists()


def test_failed_tries_are_merged_per_exporter_when_only_the_opset_differs():
    from torch2ms.export.exporters import Attempt, describe_attempts

    tries = [
        Attempt("torchscript", 17, "E: operator at opset version 17 refused"),
        Attempt("torchscript", 18, "E: operator at opset version 18 refused"),
        Attempt("torchscript", 19, "F: other"),
        Attempt("dynamo", 19, "G: dynamo's"),
        Attempt("dynamo", 19),
    ]
    assert describe_attempts(tries) == [
        "torchscript opsets 17-18: E: operator at opset version 17 refused",
        "torchscript opset 19: F: other",
        "dynamo opset 19: G: dynamo's",
    ]
