"""The import structure of the torch2ms package: cycles, imports that run up the layers, and how
often the runner and the workspace call each other.

Usage: ``.venv/bin/python benchmarks/import_structure.py``

Reads the source with ``ast`` (nothing is imported). Every ``import torch2ms.x`` / ``from
torch2ms.x import y`` counts, at module level or inside a function; ``inside`` counts the latter.
Imports under ``if TYPE_CHECKING:`` never run and are left out. A module belongs to the layer of
its top-level name (``torch2ms.pipeline.runner`` -> pipeline); ``LAYERS`` lists them bottom-up, so
an import from a layer into a lower-indexed one is "up".
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "torch2ms"

# Bottom-up: a module may import its own layer and those before it.
LAYERS = [
    # postprocess (image preprocessing, YOLO decoding) is numpy over errors only: the samples read photos with it
    ("core", {"errors", "__init__", "bounds", "compare", "samples", "recipe", "model_loader", "postprocess"}),
    ("runtime", {"runtime"}),
    ("pipeline", {"pipeline"}),  # the stage machinery: depends on nothing that converts
    ("graph", {"graph"}),
    ("converters", {"converters", "custom"}),
    ("passes", {"passes"}),
    ("codegen", {"codegen"}),
    ("ascend", {"ascend"}),
    ("export", {"export", "models", "tasks"}),
    ("divergence", {"divergence"}),  # compares generated code with onnxruntime and float64: diff, evidence
    ("stages", {"stages"}),
    ("services", {"bundle", "bench", "zoo", "tools", "generation", "profile", "plugins"}),
    ("commands", {"commands", "cli", "cli_app", "__main__"}),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise KeyError(f"{module}: add its top-level name to LAYERS")


def imports_of(path: Path, package: str) -> list[tuple[str, bool]]:
    """(imported torch2ms module, inside a function) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, bool]] = []

    def visit(node, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue  # names a type only; never runs
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names if a.name.startswith("torch2ms"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + [base]).strip(".")
                if base.startswith("torch2ms"):
                    for a in child.names:
                        sub = f"{base}.{a.name}"
                        found.append((sub if _is_module(sub) else base, inside))
            visit(child, nested)

    visit(tree, False)
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    edges: dict[str, set[str]] = defaultdict(set)
    total = inside = 0
    up: list[tuple[str, str, bool]] = []
    for path in sorted(ROOT.rglob("*.py")):
        if "templates" in path.parts:
            continue  # shipped in bundles, not imported by the package
        mod = module_name(path)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for target, nested in imports_of(path, package):
            if target == mod:
                continue
            total += 1
            inside += nested
            edges[mod].add(target)
            if layer_of(target) > layer_of(mod):
                up.append((mod, target, nested))
    module_cycles = cycles({k: {t for t in v} for k, v in edges.items()})
    runner, workspace = "torch2ms.pipeline.runner", "torch2ms.pipeline.workspace"
    both_ways = runner in edges.get(workspace, set()) and workspace in edges.get(runner, set())
    print(f"internal imports: {total}, inside functions: {inside} ({100 * inside / max(total, 1):.0f}%)")
    print(f"import cycles between modules: {len(module_cycles)}")
    for c in module_cycles:
        print("  " + " <-> ".join(c))
    print(f"imports into a higher layer: {len(up)}")
    for mod, target, nested in sorted(up):
        print(f"  {mod} -> {target}{' (in a function)' if nested else ''}")
    print(f"runner and workspace import each other: {'yes' if both_ways else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
