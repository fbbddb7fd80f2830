"""Per-op tests run the generated network in PyNative mode; the first case of each test function
also in GRAPH mode (what the compile stage uses), so every converter's code is compiled at least
once without paying ~0.15 s of graph compilation for each of the ~600 cases.
``TORCH2MS_OP_TEST_MODES=pynative,graph`` runs every case in both (about 1.5 min more)."""

from __future__ import annotations

import os

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
