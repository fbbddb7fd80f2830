"""The structure the code promises: no import cycle inside torch2ms, no import from a layer into a
higher one (the layers of benchmarks/import_structure.py), a stage declared once (a pipeline with an
extra stage defined here runs through skip, resume and the report), and a checkout that stays clean
after MindSpore has written its kernel folders."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_recipe

from torch2ms.pipeline.report import rows, write_reports
from torch2ms.pipeline.runner import Runner
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import write_json
from torch2ms.recipe import load_recipe
from torch2ms.stages import PipelineChecks, pipeline_stages

PACKAGE = REPO / "torch2ms"


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Every torch2ms module -> the torch2ms modules it imports, at module level or inside a function.
    An import under ``if TYPE_CHECKING:`` is left out: it never runs, it only names a type."""
    modules = {_module_of(p): p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_in_torch2ms():
    graph = import_graph()
    assert "torch2ms.converters.api" in graph["torch2ms.codegen.builder"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _layers():
    """``layer_of`` of benchmarks/import_structure.py, which lists the layers bottom-up (the one list)."""
    spec = importlib.util.spec_from_file_location("import_structure", REPO / "benchmarks" / "import_structure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.layer_of


def upward_imports(graph: dict[str, set[str]], layer_of) -> list[str]:
    return sorted(f"{m} -> {n}" for m, imported in graph.items() for n in imported if layer_of(n) > layer_of(m))


def test_no_import_runs_up_the_layers():
    """pipeline/ depends on nothing that converts, codegen on nothing that exports, and so on: a
    module imports its own layer and those below it. A new top-level name must be given a layer."""
    graph = import_graph()
    assert "torch2ms.pipeline.checks" in graph["torch2ms.pipeline.runner"]
    assert upward_imports(graph, _layers()) == []


def test_the_layer_check_finds_an_upward_import():
    layer_of = _layers()
    graph = {"torch2ms.pipeline.runner": {"torch2ms.tasks", "torch2ms.pipeline.stage"}, "torch2ms.tasks": set()}
    assert upward_imports(graph, layer_of) == ["torch2ms.pipeline.runner -> torch2ms.tasks"]
    with pytest.raises(KeyError, match="add its top-level name to LAYERS"):
        layer_of("torch2ms.unplaced")


class SummaryStage(Stage):
    """A sixth stage, defined only in this test: reads the MindIR, writes its size."""

    name = "summary"
    summary = "the MindIR's size"
    section = None
    reads = ("network.mindir",)
    writes = ("summary.json",)
    runs = 0

    def run(self, ctx, out: Path) -> StageOutput:
        SummaryStage.runs += 1
        size = ctx.artifact("network.mindir").stat().st_size
        write_json(out / "summary.json", {"mindir_bytes": size})
        return StageOutput(None, counts={"mindir_bytes": size})

    def notes(self, record: dict) -> str:
        return f"MindIR of {record['counts']['mindir_bytes']} bytes"


def test_a_sixth_stage_runs_skips_resumes_and_reports(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "tiny.yaml"))
    stages = [*pipeline_stages(), SummaryStage()]
    SummaryStage.runs = 0
    first = Runner(recipe, log=lambda m: None, stages=stages, checks=PipelineChecks()).run()
    assert [s.status for s in first.stages] == ["passed"] * 6 and SummaryStage.runs == 1
    write_reports(first)
    report = (first.root / "report.md").read_text()
    mindir_bytes = (first.root / "mindir" / "network.mindir").stat().st_size
    assert "| summary | passed |" in report and f"MindIR of {mindir_bytes} bytes" in report
    assert json.loads((first.root / "summary" / "summary.json").read_text()) == {"mindir_bytes": mindir_bytes}

    again = Runner(recipe, log=lambda m: None, stages=stages, checks=PipelineChecks()).run()
    assert [s.status for s in again.stages] == ["up to date"] * 6 and SummaryStage.runs == 1
    assert rows(again)[-1][:2] == ("summary", "up to date")

    # a changed input of the new stage (the MindIR it reads) re-runs it and only it
    shutil.rmtree(first.root / "summary")
    resumed = Runner(recipe, log=lambda m: None, stages=stages, checks=PipelineChecks()).run()
    assert [s.status for s in resumed.stages] == ["up to date"] * 5 + ["passed"] and SummaryStage.runs == 2
    resumed_from = Runner(recipe, log=lambda m: None, stages=stages, checks=PipelineChecks()).run(from_stage="summary")
    assert [s.status for s in resumed_from.stages][-1] == "passed" and SummaryStage.runs == 3


def test_a_run_context_asks_the_stage_list_it_was_given(tmp_path):
    """pipeline/ finds which stage writes an artifact in the list it is handed, never in
    torch2ms.stages: the last enabled writer (network.py: fold, or rebuild when fold is off; the
    first: rebuild), and a context made without a list says what to pass."""

    from torch2ms.pipeline.context import RunContext
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.stages import pipeline_stages

    recipe = load_recipe(write_recipe(tmp_path / "tiny.yaml"))
    run = RunDir(tmp_path / "run")
    ctx = RunContext(recipe, run, stages=pipeline_stages())
    assert ctx.artifact("model.onnx") == run.stage_dir("export") / "model.onnx"
    assert ctx.artifact("network.py") == run.stage_dir("fold") / "network.py"
    assert ctx.artifact("network.py", first=True) == run.stage_dir("rebuild") / "network.py"
    unfolded = load_recipe(write_recipe(tmp_path / "unfolded.yaml", fold={"enabled": False}))
    assert RunContext(unfolded, run, stages=pipeline_stages()).artifact("network.py").parent.name == "rebuild"
    with pytest.raises(TypeError, match="pipeline_stages"):
        RunContext(recipe, run).artifact("model.onnx")


def test_checkout_stays_clean_after_mindspore_compiles(tmp_path):
    """MindSpore writes kernel folders (kernel_meta, akg_kernel_meta with graph-kernel fusion,
    rank_*) into the current folder: the project's ignore rules must cover them."""
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copy(REPO / ".gitignore", work / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "add", ".gitignore"], cwd=work, check=True)
    recipe = write_recipe(work / "tiny.yaml", output="runs", compile={"graph_kernel": "on", "warmup": 0, "runs": 1})
    subprocess.run(["git", "add", "tiny.yaml"], cwd=work, check=True)

    subprocess.run(
        [sys.executable, "-m", "torch2ms", "convert", "--recipe", str(recipe)],
        cwd=work,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
    )
    written = sorted(p.name for p in work.iterdir())
    assert "runs" in written
    status = subprocess.run(["git", "status", "--porcelain"], cwd=work, capture_output=True, text=True, check=True)
    untracked = [line for line in status.stdout.splitlines() if line.startswith("??")]
    assert untracked == [], f"MindSpore left files the ignore rules miss: {untracked}"
    ignored = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=work, capture_output=True, text=True, check=True
    ).stdout
    assert "!! runs/" in ignored, "the conversion wrote nothing there: the test would pass vacuously"
