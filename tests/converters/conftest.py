"""Per-op tests run the generated network in PyNative mode; the first case of each test function
also in GRAPH mode (what the compile stage uses), so every converter's code is compiled at least
once without paying ~0.15 s of graph compilation for each of the ~600 cases.
``TORCH2MS_OP_TEST_MODES=pynative,graph`` runs every case in both (about 1.5 min more).

``test_coverage.py``'s run-time check (every converter registration built and run by a test
here) goes last, and knows whether this session runs the whole folder: ``WHOLE_FOLDER``. Under
pytest-xdist a worker runs part of the folder: it hands what it ran to the controller
(``workeroutput``), which checks the union when every worker has ended (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from converters import helpers

_ALL = [m for m in os.environ.get("TORCH2MS_OP_TEST_MODES", "").split(",") if m]


@pytest.fixture(autouse=True)
def _modes(request):
    callspec = getattr(request.node, "callspec", None)
    first_case = callspec is None or not any(callspec.indices.values())
    helpers.MODES = _ALL or (["pynative", "graph"] if first_case else ["pynative"])
    yield
    helpers.MODES = ["pynative"]


COVERAGE_TEST = "test_every_registration_ran_against_onnxruntime"
# Set at collection: [every test in this folder runs in this session, and every test of
# tests/passes/test_fusion.py (which runs the fused torch2ms-domain ops) too], apart from slow ones.
WHOLE_FOLDER: list[bool] = [False, False]
ON_XDIST_WORKER: list[bool] = [False]
_DESELECTED: list = []
_HERE = Path(__file__).parent
_FUSION = _HERE.parent / "test_fusion.py"


def pytest_deselected(items):
    _DESELECTED.extend(i for i in items if i.get_closest_marker("slow") is None)


def pytest_configure(config):
    ON_XDIST_WORKER[0] = hasattr(config, "workerinput")


def pytest_collection_finish(session):
    files = {i.path for i in session.items}
    dropped = {i.path for i in _DESELECTED}
    here = set(_HERE.glob("test_*.py"))
    WHOLE_FOLDER[0] = here <= files and not (here & dropped)
    WHOLE_FOLDER[1] = WHOLE_FOLDER[0] and _FUSION in files and _FUSION not in dropped


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    last = [i for i in items if i.name == COVERAGE_TEST]
    items[:] = [i for i in items if i.name != COVERAGE_TEST] + last


def pytest_sessionfinish(session):
    """On a pytest-xdist worker: what this worker ran, for the controller's union."""
    if ON_XDIST_WORKER[0]:
        session.config.workeroutput["torch2ms_ran"] = {
            "ran": sorted(helpers.RAN),
            "whole_folder": WHOLE_FOLDER,
        }
