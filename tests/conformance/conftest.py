"""The conformance cases of a session run together, in worker processes, the first time a test
needs an outcome; the terminal summary prints their tally (refused cases pass their test, so
this is where they are counted)."""

from __future__ import annotations

import os

import pytest

from conformance import harness, table

WORKERS = int(os.environ.get("TORCH2MS_CONFORMANCE_WORKERS", "2"))
# case name -> Outcome, for every case run in this session
OUTCOMES: dict[str, harness.Outcome] = {}
_CASES: list[harness.Case] = []


def all_cases() -> list[harness.Case]:
    if not _CASES:
        _CASES.extend(harness.cached_cases())
    return _CASES


@pytest.fixture(scope="session")
def outcomes(request) -> dict[str, harness.Outcome]:
    """Outcomes of every case a selected test asks for (``needs_cases`` marker or a ``case``
    parameter), computed once per session."""
    wanted: set[str] = set()
    for item in request.session.items:
        marker = item.get_closest_marker("needs_cases")
        if marker is not None:
            wanted.update(c.name for c in all_cases()) if marker.args == ("all",) else None
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "case" in callspec.params and item.path.parent.name == "conformance":
            wanted.add(callspec.params["case"])
    todo = [c for c in all_cases() if c.name in wanted and c.name not in OUTCOMES]
    OUTCOMES.update(harness.run_cases(todo, workers=WORKERS))
    return OUTCOMES


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_cases(which): the test reads the outcome of 'all' conformance cases")


def pytest_terminal_summary(terminalreporter):
    if not OUTCOMES:
        return
    tally = table.Tally.of(OUTCOMES.values())
    terminalreporter.write_sep("-", "ONNX conformance cases")
    terminalreporter.write_line(tally.line())
    for cause, n in tally.causes.items():
        terminalreporter.write_line(f"  refused, {cause}: {n}")
