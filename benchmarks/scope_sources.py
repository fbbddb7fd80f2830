"""Where a node's PyTorch module comes from, measured (issue 21: "measure which is most reliable").

For each model of ``module_layout.MODELS``, three exports:
- TorchScript (what the export stage writes): the module path is in the node name
  (``/backbone/layer1/layer1.0/conv1/Conv``);
- dynamo (``torch.onnx.export(..., dynamo=True)``): the path is in the node's
  ``pkg.torch.onnx.name_scopes`` metadata, after the exporter's optimizer rewrote the graph;
- TorchScript with ``export_modules_as_functions=True``: one ONNX local function per module class.

Reported per source: compute nodes (Constant excluded), the share whose module path names a module
of ``model.named_modules()`` (``resolved``), and the share at a leaf module (``at a leaf``: the
finest place a node can go). For the functions export: whether it exported, and its functions.

    PYTHONPATH=. python benchmarks/scope_sources.py [resnet50 ...]
writes benchmarks/results/scope_sources.md.
"""

from __future__ import annotations

import io
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from module_layout import MODELS, build  # noqa: E402

from torch2ms.export.exporters import unmerge  # noqa: E402
from torch2ms.graph.scopes import node_modules  # noqa: E402


def _paths(proto) -> list[str]:
    """Each compute node's module path (TorchScript: its name; dynamo: its metadata)."""
    modules = node_modules(proto.graph)
    return [modules[n.name] for n in proto.graph.node if n.op_type != "Constant"]


def _called(path: str, modules: dict[str, object]) -> str:
    """A TorchScript scope names the second call of a module ``relu_1``: the module is ``relu``
    (what the generated code does too, ``ModuleLayout.normalize``)."""
    parts: list[str] = []
    for comp in path.split(".") if path else []:
        base = re.sub(r"_\d+$", "", comp)
        parts.append(base if ".".join([*parts, comp]) not in modules and ".".join([*parts, base]) in modules else comp)
    return ".".join(parts)


def _share(paths: list[str], modules: dict[str, object]) -> dict:
    leaves = {name for name, m in modules.items() if not any(True for _ in m.children())}
    paths = [_called(p, modules) for p in paths]
    resolved = [p for p in paths if p in modules]
    return {
        "nodes": len(paths),
        "resolved": len(resolved) / max(len(paths), 1),
        "leaf": sum(p in leaves for p in resolved) / max(len(paths), 1),
    }


def _export(model, shape, **kwargs):
    import onnx
    import torch

    x = (torch.zeros(*shape),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kwargs.pop("dynamo", False):
            return torch.onnx.export(model, x, dynamo=True, opset_version=18, verbose=False).model_proto
        buf = io.BytesIO()
        torch.onnx.export(model, x, buf, dynamo=False, training=torch.onnx.TrainingMode.PRESERVE, **kwargs)
        return onnx.load_from_string(buf.getvalue())


def measure(name: str) -> dict:
    spec, kwargs, shape = MODELS[name]
    model = build(spec, kwargs).eval()
    # a module shared by several parents (YOLO's one SiLU) is at each of their paths
    modules = {n: m for n, m in model.named_modules(remove_duplicate=False) if n}
    row: dict = {"model": name}
    for source, opts in (("torchscript", {"opset_version": 17}), ("dynamo", {"dynamo": True})):
        t = time.perf_counter()
        try:
            proto = _export(model, shape, **opts)
            unmerge(proto, set(model.state_dict()))  # as the export stage does: no Identity per merged weight
            row[source] = {**_share(_paths(proto), modules), "s": time.perf_counter() - t}
        except Exception as err:  # noqa: BLE001 - an exporter that cannot take the model is a result
            first = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines()[0]  # no terminal colours
            row[source] = {"error": f"{type(err).__name__}: {first[:80]}"}
    return row


def functions(name: str) -> int | str:
    """The local functions of a TorchScript export with ``export_modules_as_functions``."""
    spec, kwargs, shape = MODELS[name]
    try:
        return len(
            _export(build(spec, kwargs).eval(), shape, opset_version=17, export_modules_as_functions=True).functions
        )
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {str(err).splitlines()[0][:80]}"


def _cell(r: dict) -> str:
    if "error" in r:
        return f"failed: {r['error']}"
    return f"{r['nodes']} nodes, {100 * r['resolved']:.1f}% / {100 * r['leaf']:.1f}%"


def main(names: list[str]) -> None:
    """Each model in its own process (a crashing exporter takes only its row)."""
    import json
    import subprocess

    def child(flag: str, name: str):
        run = subprocess.run([sys.executable, __file__, flag, name], capture_output=True, text=True)
        return (
            json.loads(run.stdout.strip().splitlines()[-1])
            if run.returncode == 0
            else f"crashed (exit {run.returncode})"
        )

    rows = []
    for name in names:
        row = child("--row", name)
        if isinstance(row, str):
            row = {"model": name, "torchscript": {"error": row}, "dynamo": {"error": row}}
        rows.append({**row, "functions": child("--functions", name)})
    lines = [
        "# Where a node's module comes from: TorchScript names vs dynamo metadata",
        "",
        "Generated by `benchmarks/scope_sources.py`. Per export: compute nodes (Constant excluded; the",
        "TorchScript exporter's Identity per merged weight removed, as the export stage does), the share",
        "whose module path names a module of `model.named_modules()` / the share at a leaf module.",
        "`export_modules_as_functions`: the local functions TorchScript wrote, or why it could not. A module",
        "called twice is one path (TorchScript's `relu_1` is `relu`).",
        "",
        "| model | TorchScript names | dynamo `name_scopes` | export_modules_as_functions |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {_cell(r['torchscript'])} | {_cell(r['dynamo'])} | {r['functions']} |")
    out = Path(__file__).parent / "results" / "scope_sources.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] in (["--row"], ["--functions"]):
        import json

        print(json.dumps((measure if sys.argv[1] == "--row" else functions)(sys.argv[2])))
    else:
        main(sys.argv[1:] or list(MODELS))
