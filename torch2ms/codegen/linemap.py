"""The line map of a modules-layout ``network.py``: each statement of each instance at its line
of the (shared) class, and the checkpoint's parameters at the attribute paths; what divergence
localization walks and ``weight_map.json`` reports."""

from __future__ import annotations

import ast

import numpy as np

from torch2ms.codegen.locals import assignments
from torch2ms.codegen.scopes import Scope


def assign_lines(source: str) -> dict[tuple[str, str], list[int]]:
    """(class, variable) -> the lines of ``construct`` assigning it, in ``assignments``' order
    (then its assignments inside blocks); (class, "") -> the ``def construct`` line (where its
    arguments come in)."""
    out: dict[tuple[str, str], list[int]] = {}
    for c in ast.parse(source).body:
        if not isinstance(c, ast.ClassDef):
            continue
        for f in c.body:
            if isinstance(f, ast.FunctionDef) and f.name == "construct":
                out[(c.name, "")] = [f.lineno]
                for name, st in assignments(f):
                    out.setdefault((c.name, name), []).append(f.lineno if st is None else st.lineno)
                top = set(map(id, f.body))
                for st in ast.walk(f):
                    if isinstance(st, ast.Assign) and id(st) not in top:
                        for n in (n for t in st.targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                            out.setdefault((c.name, n.id), []).append(st.lineno)
    return out


class LineMap:
    """``tensor_map`` (in the order the network computes) and the root's parameters for one source."""

    def __init__(self, builder, source: str):
        self.b = builder
        self.lines = assign_lines(source)
        self.tensor_map: list[dict] = []
        self.params: dict[str, np.ndarray] = {}
        self.sources: dict[str, str] = {}  # checkpoint parameter -> builder parameter key

    def collect(self, root: Scope) -> None:
        self._collect(root, self.b.class_name)
        # in the order the network computes them (divergence takes the first that leaves tolerance)
        self.tensor_map.sort(key=lambda e: e.pop("index"))

    def _collect(self, s: Scope, cls: str) -> None:
        b = self.b
        if s.parent is None:
            for k, flat in s.body.params.items():
                self.params[k] = b.params[flat]
                self.sources[k] = flat
        for i, targets, assigned in s.body.entries:
            st = b.statements[i]
            inputs = [x for x in st.node.inputs if x and not b.graph.values[x].is_const]
            for onnx_name, var, k in zip(st.node.outputs, targets, assigned):
                if var == "_":
                    continue
                lines = self.lines.get((cls, var), self.lines.get((cls, "")))
                line = lines[min(k, len(lines) - 1)]
                self.tensor_map.append(
                    {
                        "index": i,
                        "tensor": onnx_name,
                        "var": var,
                        "assign": k,
                        "line": line,
                        "node": st.node.name,
                        "op": st.node.op_type,
                        "origin": st.node.origin,
                        "inputs": inputs,
                        "module": s.module,
                        "class": cls,
                        "where": f"network.py:{line} in {cls}.construct",
                    }
                )
        for c in s.children.values():
            self._collect_child(c)

    def _collect_child(self, c: Scope) -> None:
        if c.kind == "class":
            self._collect(c, c.group.name)
        elif c.kind == "container":
            for k in c.children.values():
                self._collect_child(k)
