"""Test setup: choose the fast MindSpore CPU setting before anything imports MindSpore, so the
suite never pays the ~80x AVX-512 slowdown; give each pytest-xdist worker its share of the cores
(the thread budget of torch2ms.runtime.threads, inherited by the CLI runs and zoos the tests start);
quiet MindSpore's C++ log."""

from __future__ import annotations

import gc
import os

from torch2ms.runtime import threads
from torch2ms.runtime.cpu import configure_cpu

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault(threads.ENV, str(threads.share(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
configure_cpu()
os.environ.setdefault("GLOG_v", "3")

import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # tiny_models importable by recipes as `tiny_models:tiny_net`


def write_recipe(path: Path, **overrides) -> Path:
    """A recipe for tests.tiny_models.tiny_net at 1x3x32x32; ``overrides`` replace top-level keys."""
    data = {
        "name": "tiny",
        "task": "classification",
        "model": {"factory": "tiny_models:tiny_net", "kwargs": {"num_classes": 5}, "seed": 0},
        "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
        "check": {"samples": 2},
        "compile": {"graph_kernel": "off", "warmup": 1, "runs": 3},
        "output": str(path.parent / "runs"),
    }
    data.update(overrides)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def tiny_recipe(tmp_path) -> Path:
    return write_recipe(tmp_path / "tiny.yaml")


def run_cli(*args: str) -> int:
    """Run the torch2ms CLI in this process (as ``python -m torch2ms``); returns the exit code."""
    from torch2ms.cli import main

    try:
        main(list(args))
    except SystemExit as e:
        return e.code or 0
    return 0


@pytest.fixture
def wide_console(monkeypatch):
    """Rich wraps at 80 columns off a terminal; messages are compared unwrapped."""
    from torch2ms.cli_app import console, out_console

    monkeypatch.setattr(console, "width", 400)
    monkeypatch.setattr(out_console, "width", 400)


BUNDLE_FORBIDDEN = ("torch", "torch2ms", "torchvision", "ultralytics")  # a bundle needs none of them


def unpack_bundle(archive: Path, dest: Path) -> Path:
    from torch2ms.bundle.archive import safe_extract

    safe_extract(archive, dest)
    return dest


def run_bundle_infer(bundle_dir: Path, *args: str, timeout: int = 300):
    """The bundle's infer.py in a fresh interpreter where torch, torch2ms, torchvision and
    Ultralytics cannot be imported (what a board without them sees)."""
    import os
    import subprocess
    import sys

    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in BUNDLE_FORBIDDEN)
    argv = f"sys.argv = ['infer.py', *{list(args)!r}]"
    code = f"import sys, runpy; {hide}; {argv}; runpy.run_path('infer.py', run_name='__main__')"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=bundle_dir, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(autouse=True)
def _pil_unpatched(monkeypatch):
    """Ultralytics (a test-only model source) replaces ``PIL.Image.open`` when imported, with one that
    tries to install pi-heif on an unreadable file; tests that run after it in the same process see
    PIL's own function, as torch2ms does without Ultralytics."""
    patches = sys.modules.get("ultralytics.utils.patches")
    if patches is not None and hasattr(patches, "_image_open"):
        from PIL import Image

        monkeypatch.setattr(Image, "open", patches._image_open)
    yield


def pytest_sessionstart(session):
    """The CPU the suite runs on, as the first line of its output even under ``-q`` (a CI log then
    says which machine it was): the integer tests' oracle and the skips of
    ``tests/converters/test_exact_oracle.py`` depend on it. The instruction sets are those the
    process finds by CPUID (numpy's dispatch), so an emulated CPU (``make test-avx2``) shows its
    own, where /proc/cpuinfo shows the host's. Printed once, by the xdist controller."""
    import importlib

    from torch2ms.runtime.cpu import cpu_model

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):
        return
    seen = None
    for where in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1
        try:
            seen = importlib.import_module(where).__cpu_features__
            break
        except (ImportError, AttributeError):
            continue
    flags = ("AVX2", "AVX512F", "AVX512VNNI")
    isa = "unknown" if seen is None else ", ".join(f"{f} {'yes' if seen.get(f) else 'no'}" for f in flags)
    reporter.write_line(f"cpu: {cpu_model()} in /proc/cpuinfo, {os.cpu_count()} cores; by CPUID: {isa}")


_SHORT_TEST_FOLDERS = ("converters", "conformance")


def pytest_collection_modifyitems(config, items):
    """The order pytest-xdist hands out whole files in (``--dist loadfile --no-loadscope-reorder``):
    files marked ``heavy`` first, then the other end-to-end files, then the per-op folders, whose
    thousands of short tests fill the end evenly. xdist's own order (most tests first) left the
    few-test, minutes-long files to the end: test_zoo.py ran 3.5 min on one worker while the other
    had nothing left. Within a file the order stays as written."""

    def rank(item) -> int:
        if item.get_closest_marker("heavy"):
            return 0
        return 2 if item.path.parent.name in _SHORT_TEST_FOLDERS else 1

    items.sort(key=rank)


def pytest_collection_finish(session):
    """The heap as collection left it (torch2ms, thousands of collected tests) is frozen at once."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """MindSpore runs a full ``gc.collect()`` before every graph compile, and a test process holds
    millions of objects that live to its end: torch, MindSpore, onnx, thousands of collected tests,
    and what earlier files left alive (caches, imported generated networks). At the end of each file,
    once its module fixtures are torn down, a collection of what the file made (frozen objects are
    not looked at) frees its cycles and what is left is frozen, so each collect in the next file sees
    only what its tests make: test_reduce.py alone 16.2 -> 11.6 s; test_tensor.py at the end of a
    worker's files 30.8 s with one freeze after collection, 4.1 s. Frozen objects are never collected
    again: a whole collection (``gc.unfreeze()`` first) at each file cost ~53 s of CPU in the suite
    (py-spy, 2026-11-29), and what it found is only what outlived a file and later formed garbage
    cycles."""
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


# --- tests/converters' coverage check under pytest-xdist: the union of what the workers ran ---
_WORKERS_RAN: list[dict] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {}).get("torch2ms_ran")
    if out is not None:
        _WORKERS_RAN.append(out)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """On the pytest-xdist controller, once every worker ended: every converter registration was
    built and run by some worker's test (the check test_coverage.py makes in a single process),
    reported as that test's result so it counts and prints as one."""
    if hasattr(session.config, "workerinput") or not _WORKERS_RAN:
        return
    whole, with_fusion = (all(o["whole_folder"][i] for o in _WORKERS_RAN) for i in (0, 1))
    if not whole:
        return
    from _pytest.reports import TestReport
    from converters import helpers

    ran = {tuple(r) for o in _WORKERS_RAN for r in o["ran"]}
    missing = helpers.unrun_registrations(ran, with_fusion)
    name = "tests/converters/test_coverage.py::test_every_registration_ran_against_onnxruntime[workers' union]"
    report = TestReport(
        name,
        ("tests/converters/test_coverage.py", 0, name),
        {},
        "failed" if missing else "passed",
        f"converter registrations no test in tests/converters built and ran: {missing}" if missing else None,
        "call",
    )
    session.config.hook.pytest_runtest_logreport(report=report)
    if missing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
