"""Every registered converter has a test against onnxruntime in this folder ("a converter without
a test is not done"), and an attribute a converter does not know is refused by name.

Two checks: a quick static one (every op type is named in a test module here, or in a table a
test module iterates), and the real one, which needs the whole folder to have run first: every
converter *registration* (op type and the opset it is registered from: Softmax before and from
opset 13 are two) was built into a network and run by ``helpers.convert_and_run``, whose callers
compare with onnxruntime. conftest.py runs that test last and tells it whether the whole folder
ran; on a partial run (one file, ``-k``) it is skipped. A registration no supported opset looks
up (an old Clip below opset 11) cannot run and is not asked for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from converters import conftest, helpers
from converters.helpers import load, make_model, x

from torch2ms.converters.activation import UNARY
from torch2ms.converters.elementwise import FUNCTIONS, OPERATORS, VARIADIC
from torch2ms.converters.reduce import REDUCTIONS
from torch2ms.converters.registry import analyse, registrations

HERE = Path(__file__).parent
# Ops tested through a table the test module imports rather than by name.
TABLES = set(UNARY) | set(OPERATORS) | set(FUNCTIONS) | set(VARIADIC) | set(REDUCTIONS)


def test_every_registered_converter_is_tested():
    text = "\n".join(p.read_text() for p in HERE.glob("test_*.py"))
    named = set(re.findall(r'"([A-Z][A-Za-z0-9]+)"', text))
    untested = sorted({r.op_type for r in registrations()} - named - TABLES)
    assert not untested, f"converters without a test in tests/converters: {untested}"


def test_every_registration_ran_against_onnxruntime():
    """torch2ms-domain registrations (what the fusion passes make) are run by tests/passes/test_fusion.py,
    so they count only when that file ran too. Under pytest-xdist each worker ran part of the
    folder: the controller checks the union of what they ran (tests/conftest.py), not this test."""
    if conftest.ON_XDIST_WORKER[0]:
        pytest.skip("under pytest-xdist: checked by the controller over every worker's runs, after they end")
    if not conftest.WHOLE_FOLDER[0]:
        pytest.skip("needs every (not slow) test of tests/converters in this session")
    missing = helpers.unrun_registrations(helpers.RAN, conftest.WHOLE_FOLDER[1])
    assert not missing, f"converter registrations no test in tests/converters built and ran: {missing}"


def test_unknown_attribute_is_refused_by_name():
    """onnxruntime rejects unknown attributes itself, so one is added after loading."""
    model, feeds = make_model("Relu", [x(2, 3)])
    graph, _ = load(model, feeds)
    graph.nodes[0].attrs["made_up"] = 1
    problems = analyse(graph)
    assert [p.reason for p in problems] == ["attribute 'made_up' not supported"]
