"""ONNX's own backend node test cases through torch2ms's conversion path (how each one is run and
judged: ``torch2ms/conformance.py``).

One test per case. It fails when the case is *wrong* (an output differs from the case's expected
one: value beyond its rtol/atol, shape or dtype) or *crashes* (any exception that is not a
refusal, a worker process that died or timed out). It passes when the case passes or is
*refused* with a reason: refusals are counted in the terminal summary and in
docs/conformance.md, not failed.

``make test`` runs ``conformance.default_subset``: every case of an op type torch2ms has a
converter for, and the first case of every other op type (about 800 of 1884 cases, ~1 min on 2
workers). ``test_case_slow`` covers all 1884 and is marked slow (``make test-slow``).

Integer inputs that set a shape (Reshape's shape, Expand's shape, Unsqueeze's axes, Resize's
scales or sizes fed as graph inputs): the converter must refuse them ("must be a constant"), and
the case is then run again with exactly those inputs baked in as initializers, as a model
exported with static shapes has them; it passes as "constant inputs" only if a converter still
runs (a graph folded entirely into a constant tests nothing of torch2ms and stays refused).

The cases of a session run in ``TORCH2MS_CONFORMANCE_WORKERS`` (2) worker processes, a fresh one
every 150 cases, and a wrong or crashed case is re-run alone in a fresh process before it is
reported, so no case's MindSpore state reaches the next.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.conftest import all_cases
from torch2ms import conformance
from torch2ms.conformance import STATUSES

CASES = all_cases()
DEFAULT = conformance.default_subset(CASES)


def _explain(o: conformance.Outcome) -> str:
    return f"{o.name} ({o.op_type}) {o.status}: {o.reason}" + (f"\n  note: {o.note}" if o.note else "")


# Known bugs, each a case that is wrong or crashes today, with what is wrong. Strict: a fixed one
# fails here until it is removed from this table.
_POW = "Pow of an integer base by a float exponent gives float32; ONNX keeps the base's type"
_ATTENTION = "a fully masked row differs (opset 23 Attention, expanded)"
KNOWN = {
    "test_pow_types_int32_float32": _POW,
    "test_pow_types_int64_float32": _POW,
    "test_tril_zero": "MindSpore's CPU tril kernel refuses a matrix of width 0",
    "test_resize_downsample_scales_linear_align_corners": (
        "align_corners with a non-integral length x scale: torch2ms follows onnxruntime and PyTorch (divide by"
        " out - 1), ONNX's reference divides by in x scale - 1"
    ),
    "test_resize_downsample_scales_cubic_align_corners": (
        "align_corners with a non-integral length x scale: torch2ms follows onnxruntime and PyTorch (divide by"
        " out - 1), ONNX's reference divides by in x scale - 1"
    ),
    "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded": _ATTENTION,
    "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded": _ATTENTION,
}


def _param(name: str):
    if name in KNOWN:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN[name]))
    return name


@pytest.mark.parametrize("case", [_param(c.name) for c in CASES if c.name in DEFAULT])
def test_case(case, outcomes):
    o = outcomes[case]
    assert o.status in ("pass", "refused"), _explain(o)


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c.name) for c in CASES])
def test_case_slow(case, outcomes):
    o = outcomes[case]
    assert o.status in ("pass", "refused"), _explain(o)


def test_every_case_has_an_op_and_data():
    """What the runner relies on: 1884 named cases, each with an op type and one data set."""
    assert len(CASES) == len({c.name for c in CASES}) >= 1800
    assert all(c.op_type and c.model for c in CASES)
    assert {"Conv", "Relu", "Resize", "Reshape", "LSTM"} <= {c.op_type for c in CASES}
    assert len(DEFAULT) < len(CASES)


def test_refusal_causes_cover_the_loader_and_converter_messages():
    assert conformance.cause_of("opset 9 is outside the supported range 11-23") == "opset"
    assert conformance.cause_of("Acos: no converter") == "no converter"
    assert conformance.cause_of("NonZero: refused: output shape depends on the data") == "op refused by design"
    assert conformance.cause_of("MindSpore has no tensor type for input 'x' (float8e4m3fn)") == "dtype"
    assert conformance.cause_of("Reshape: shape (input 1) must be a constant") == "input must be a constant"
    assert conformance.cause_of("Resize: mode='cubic' not supported") == "attribute or value"


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
    got = conformance.compare([a], [r], 1e-3, 1e-7)
    assert (problem in got) if problem else got == "", got


def test_statuses_are_the_four_documented():
    assert STATUSES == ("pass", "refused", "wrong", "crash")
