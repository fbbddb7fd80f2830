"""torch2ms as its wheel installs it: every file of the package is in the wheel, and, installed
outside the repo, the wheel converts, packages and verifies a tiny recipe from a folder outside it.

The quick test builds the wheel and compares its members with the package's tracked files (its
modules, the templates a bundle copies, the Ascend op table). The slow one installs the wheel with
``pip --target`` into a temporary folder, puts only that folder on ``PYTHONPATH`` (the venv still
provides torch and MindSpore) and runs the CLI there, asserting ``torch2ms`` came from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, TESTS, write_recipe


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # a copy of the package sources: setuptools writes build/ and *.egg-info beside pyproject.toml
    shutil.copytree(REPO / "torch2ms", build / "torch2ms", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", build / "pyproject.toml")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(build)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (found,) = out.glob("torch2ms-*.whl")
    return found


def _package_files() -> set[str]:
    """Every file git tracks under torch2ms/ (what a run may open), as wheel member names."""
    listed = subprocess.run(["git", "ls-files", "torch2ms"], cwd=REPO, check=True, capture_output=True, text=True)
    return {line for line in listed.stdout.splitlines() if line}


def test_the_wheel_holds_every_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        members = set(z.namelist())
    missing = sorted(_package_files() - members)
    assert not missing, f"not in {wheel.name}: {missing}"
    assert "torch2ms/bundle/templates/README.md" in members and "torch2ms/bundle/templates/infer.py" in members


@pytest.mark.slow
def test_the_installed_wheel_converts_packages_and_verifies_outside_the_repo(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(TESTS / "tiny_models.py", work / "tiny_models.py")
    recipe = write_recipe(work / "tiny.yaml", output=str(work / "runs"))
    env = {**os.environ, "PYTHONPATH": str(site), "TORCH2MS_THREADS": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "import sys; from torch2ms.cli import main; main(sys.argv[1:])", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import torch2ms; print(torch2ms.__file__)"], cwd=work, env=env, capture_output=True
    )
    assert Path(where.stdout.decode().strip()).is_relative_to(site), where
    for args in (("convert", "--recipe", str(recipe)), ("package", "--recipe", str(recipe), "--out", "dist")):
        done = cli(*args)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    (bundle,) = (work / "dist").glob("tiny-*.tar.gz")
    done = cli("verify", str(bundle))
    assert done.returncode == 0 and "OK tiny" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
