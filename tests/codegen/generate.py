"""Generated code for a PyTorch model without running it: exported as the export stage does (module
paths in the node names, PyTorch's module classes beside), passed as the rebuild or fold stage
does, converted in one layout. The header carries fixed source facts, so the code depends only on
the model and torch2ms."""

from __future__ import annotations

import ast

import torch
from torch import nn

from codegen.test_module_layout import export
from torch2ms.codegen.builder import GeneratedNetwork
from torch2ms.codegen.convert import convert_graph
from torch2ms.export.roles import module_roles
from torch2ms.graph.load import graph_from_model
from torch2ms.passes import fold_passes, rebuild_passes, run_passes


def generate(model: nn.Module, shape: tuple, layout: str = "modules", fold: bool = False) -> GeneratedNetwork:
    torch.manual_seed(0)
    proto, classes = export(model, shape)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    graph = graph_from_model(proto, opset, {"x": shape})
    run_passes(graph, fold_passes(True) if fold else rebuild_passes(True))
    name, roles = type(model).__name__, module_roles(model)  # the root class named as the pipeline names it
    return convert_graph(graph, name, "model.onnx", "0" * 64, "test", layout=layout, modules=classes, roles=roles)


def assigned_twice(source: str) -> list[str]:
    """``Class.attr`` for every attribute a class's ``__init__`` assigns on ``self`` more than once
    in its straight-line code (branches of an ``if``, as ``Conv3dBnAct``'s activation, are
    alternatives)."""
    out = []
    for c in ast.parse(source).body:
        if not isinstance(c, ast.ClassDef):
            continue
        for f in c.body:
            if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                seen: set[str] = set()
                for node in f.body:
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            if t.attr in seen:
                                out.append(f"{c.name}.{t.attr}")
                            seen.add(t.attr)
    return out
