"""ONNX's own backend node test cases through torch2ms's conversion path (how each one is run and
judged: ``tests/conformance/harness.py``).

One test per case. It fails when the case is *wrong* (an output differs from the case's expected
one: value beyond its rtol/atol, shape or dtype) or *crashes* (any exception that is not a
refusal, a worker process that died or timed out). It passes when the case passes or is
*refused* with a reason: refusals are counted in the terminal summary and in
docs/conformance.md, not failed. A case in ``ONNX_REFERENCE_DIFFERS`` must instead end
*pass-vs-onnxruntime* (ONNX's expected output and onnxruntime's disagree, torch2ms matches
onnxruntime), and no other case may.

``make test`` runs ``table.default_subset``: every case of an op type torch2ms has a
converter for, and the first case of every other op type (about 800 of 1884 cases, ~1 min on 2
workers). ``test_case_slow`` covers all 1884 and is marked slow (``make test-slow``).

Integer inputs that set a shape (Reshape's shape, Expand's shape, Unsqueeze's axes, Resize's
scales or sizes fed as graph inputs): the converter must refuse them ("must be a constant"), and
the case is then run again with exactly those inputs baked in as initializers, as a model
exported with static shapes has them; it passes as "constant inputs" only if a converter still
runs (a graph folded entirely into a constant tests nothing of torch2ms and stays refused).

The cases of a session run in ``TORCH2MS_CONFORMANCE_WORKERS`` (2) worker processes, a fresh one
every 600 cases, and a wrong or crashed case is re-run alone in a fresh process before it is
reported, so no case's MindSpore state reaches the next.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import harness, table
from conformance.conftest import all_cases
from conformance.harness import STATUSES

CASES = all_cases()
DEFAULT = table.default_subset(CASES)


def _explain(o: harness.Outcome) -> str:
    return f"{o.name} ({o.op_type}) {o.status}: {o.reason}" + (f"\n  note: {o.note}" if o.note else "")


# Known bugs, each a case that is wrong or crashes today, with what is wrong. Strict: a fixed one
# fails here until it is removed from this table. None today.
KNOWN: dict[str, str] = {}

# Cases where ONNX's reference implementation and onnxruntime disagree and torch2ms follows
# onnxruntime (and PyTorch: test_pytorch_agrees_with_onnxruntime_where_onnx_differs): they must
# end ``pass-vs-onnxruntime``, and no other case may.
_ALIGN_CORNERS = (
    "align_corners with a non-integral length x scale: onnxruntime and PyTorch divide by out - 1,"
    " ONNX's reference by in x scale - 1"
)
ONNX_REFERENCE_DIFFERS = {
    "test_resize_downsample_scales_linear_align_corners": _ALIGN_CORNERS,
    "test_resize_downsample_scales_cubic_align_corners": _ALIGN_CORNERS,
}


def _param(name: str):
    if name in KNOWN:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN[name]))
    return name


def _judge(o: harness.Outcome) -> None:
    if o.name in ONNX_REFERENCE_DIFFERS:
        assert o.status == "pass-vs-onnxruntime", _explain(o)
    else:
        assert o.status in ("pass", "refused"), _explain(o)


@pytest.mark.parametrize("case", [_param(c.name) for c in CASES if c.name in DEFAULT])
def test_case(case, outcomes):
    _judge(outcomes[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c.name) for c in CASES])
def test_case_slow(case, outcomes):
    _judge(outcomes[case])


@pytest.mark.parametrize("name", sorted(ONNX_REFERENCE_DIFFERS))
def test_pytorch_agrees_with_onnxruntime_where_onnx_differs(name):
    """What ``ONNX_REFERENCE_DIFFERS`` claims, checked: onnxruntime's outputs differ from the case's
    expected ones, and PyTorch's ``F.interpolate`` (align_corners=True) gives onnxruntime's."""
    import onnx
    import torch
    import torch.nn.functional as F

    case = next(c for c in CASES if c.name == name)
    model = onnx.ModelProto()
    model.ParseFromString(case.model)
    inits = {t.name for t in model.graph.initializer}
    feeds = dict(zip([i.name for i in model.graph.input if i.name not in inits], case.inputs))
    ort_out = harness._onnxruntime_outputs(model, feeds)
    assert ort_out is not None
    assert harness.compare(ort_out, list(case.outputs), case.rtol, case.atol)  # ONNX differs
    x, scales = case.inputs[0], case.inputs[-1]
    assert scales[0] == scales[1] == 1 and scales[2] == scales[3]
    mode = "bicubic" if "cubic" in name else "bilinear"
    torch_out = F.interpolate(torch.from_numpy(x), scale_factor=float(scales[2]), mode=mode, align_corners=True)
    assert not harness.compare([torch_out.numpy()], ort_out, case.rtol, case.atol)


def _relu_case(expected: np.ndarray) -> tuple[harness.Case, object, dict]:
    import onnx
    from onnx import helper

    node = helper.make_node("Relu", ["x"], ["y"])
    vi = helper.make_tensor_value_info
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph([node], "g", [vi("x", f32, [3])], [vi("y", f32, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    case = harness.Case("test_fake", "Relu", model.SerializeToString(), (x,), (expected,), 1e-3, 1e-7)
    return case, model, {"x": x}


@pytest.mark.parametrize(
    "expected, actual, status",
    [
        # ONNX's expected output differs from onnxruntime's [0, 0.5, 2]; torch2ms matches onnxruntime
        ([0.0, 0.5, 3.0], [0.0, 0.5, 2.0], "pass-vs-onnxruntime"),
        # ... but torch2ms matches neither
        ([0.0, 0.5, 3.0], [0.0, 0.6, 2.0], "wrong"),
        # onnxruntime agrees with the expected output: torch2ms is simply wrong
        ([0.0, 0.5, 2.0], [0.0, 0.5, 2.5], "wrong"),
    ],
)
def test_a_difference_counts_as_pass_vs_onnxruntime_only_if_onnxruntime_matches(expected, actual, status):
    case, model, feeds = _relu_case(np.array(expected, np.float32))
    actual = [np.array(actual, np.float32)]
    problem = harness.compare(actual, list(case.outputs), case.rtol, case.atol)
    assert problem
    got, reason = harness._judge_by_onnxruntime(model, feeds, actual, case, problem)
    assert got == status
    assert problem in reason


def test_a_model_onnxruntime_cannot_run_is_wrong_not_pass_vs_onnxruntime():
    case, model, feeds = _relu_case(np.array([0.0, 0.5, 3.0], np.float32))
    model.graph.node[0].op_type = "NoSuchOp"
    actual = [np.array([0.0, 0.5, 2.0], np.float32)]
    assert harness._judge_by_onnxruntime(model, feeds, actual, case, "differs") == ("wrong", "differs")


def test_every_case_has_an_op_and_data():
    """What the runner relies on: 1884 named cases, each with an op type and one data set."""
    assert len(CASES) == len({c.name for c in CASES}) >= 1800
    assert all(c.op_type and c.model for c in CASES)
    assert {"Conv", "Relu", "Resize", "Reshape", "LSTM"} <= {c.op_type for c in CASES}
    assert len(DEFAULT) < len(CASES)


def test_refusal_causes_cover_the_loader_and_converter_messages():
    assert table.cause_of("opset 9 is outside the supported range 11-23") == "opset"
    assert table.cause_of("Acos: no converter") == "no converter"
    assert table.cause_of("NonZero: refused: output shape depends on the data") == "op refused by design"
    assert table.cause_of("MindSpore has no tensor type for input 'x' (float8e4m3fn)") == "dtype"
    assert table.cause_of("Reshape: shape (input 1) must be a constant") == "input must be a constant"
    assert table.cause_of("Resize: mode='cubic' not supported") == "attribute or value"


@pytest.mark.parametrize(
    "actual, expected, problem",
    [
        ([1.0, 2.0], [1.0, 2.0005], ""),  # within rtol 1e-3
        ([1.0, 2.0], [1.0, 2.01], "1 of 2 values differ"),
        ([[1.0, 2.0]], [1.0, 2.0], "shape (1, 2), expected (2,)"),
        (np.array([1, 2], np.int32), np.array([1, 2], np.int64), "dtype int32, expected int64"),
        ([np.nan, np.inf], [np.nan, np.inf], ""),
        ([np.inf], [-np.inf], "1 of 1 values differ"),
    ],
)
def test_compare_judges_like_onnx_backend_runner(actual, expected, problem):
    a = np.asarray(actual, np.float32) if isinstance(actual, list) else actual
    r = np.asarray(expected, np.float32) if isinstance(expected, list) else expected
    got = harness.compare([a], [r], 1e-3, 1e-7)
    assert (problem in got) if problem else got == "", got


def test_statuses_are_the_five_documented():
    assert STATUSES == ("pass", "pass-vs-onnxruntime", "refused", "wrong", "crash")
    assert all(f"``{s}``" in harness.__doc__ for s in STATUSES)
