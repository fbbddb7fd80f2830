"""Per-op tests run the generated network in PyNative mode; the first case of each test function
also in GRAPH mode (what the compile stage uses), so every converter's code is compiled at least
once without paying ~0.15 s of graph compilation for each of the ~600 cases.
``TORCH2MS_OP_TEST_MODES=pynative,graph`` runs every case in both (about 1.5 min more).

``test_coverage.py``'s run-time check (every converter registration built and run by a test
here) goes last, and knows whether this session runs the whole folder: ``WHOLE_FOLDER``."""

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
# Set at collection: every test in this folder runs in this session, apart from slow ones.
WHOLE_FOLDER: list[bool] = [False]
_DESELECTED_HERE: list = []


def _here(item) -> bool:
    return item.path.parent == Path(__file__).parent


def pytest_deselected(items):
    _DESELECTED_HERE.extend(i for i in items if _here(i) and i.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    here = [i for i in session.items if _here(i)]
    files = {i.path.name for i in here}
    every_file = files >= {p.name for p in Path(__file__).parent.glob("test_*.py")}
    WHOLE_FOLDER[0] = every_file and not _DESELECTED_HERE


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    last = [i for i in items if i.name == COVERAGE_TEST]
    items[:] = [i for i in items if i.name != COVERAGE_TEST] + last
