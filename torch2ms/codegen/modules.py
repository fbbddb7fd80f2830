"""The ``modules`` layout of ``network.py``: the PyTorch module tree as MindSpore classes.

The converters emit one statement per node into the flat ``CodeBuilder``; this layer only
groups those statements by the node's module scope and renames them, in steps that each live
in their own module:

- ``scopes``: the module tree and its dataflow. A module whose nodes are one layer call (a
  ``Conv`` that became ``nn.Conv2dBnAct``) is that layer, as an attribute of its parent at
  PyTorch's path (``self.conv1``); a weight-free leaf (``ReLU``, ``Flatten``) is its statements,
  written in the parent; a module whose children are numbered (``Sequential``, ``ModuleList``)
  is an ``nn.SequentialCell`` when its children run as a chain, else an ``nn.CellList`` whose
  items the parent calls one by one; every other module is an ``nn.Cell`` class named after its
  PyTorch class (``modules.json`` of the export stage).
- ``bodies``: each instance's ``__init__`` and ``construct``, as pieces (``pieces``).
- ``classes``: instances whose code differs only in numbers or strings (channels, strides,
  shapes) are one class, the values that differ its constructor arguments.
- ``format`` and ``linemap``: the file through ``ruff format``, and each statement's line.

Parameter names follow the attribute paths, so they are PyTorch's ``state_dict`` keys where
MindSpore's cells allow (``conv1.conv.weight`` inside ``nn.Conv2dBnAct``).

A module whose nodes interleave with its parent's (a value leaves it and comes back) cannot be
one call: its statements stay in the parent and ``record["inlined"]`` names it and why.
"""

from __future__ import annotations

from torch2ms.codegen.arguments import argument_names
from torch2ms.codegen.bodies import Bodies
from torch2ms.codegen.classes import Classes, class_lines
from torch2ms.codegen.format import format_source
from torch2ms.codegen.generated import GeneratedNetwork, build_function
from torch2ms.codegen.linemap import LineMap
from torch2ms.codegen.pieces import tokens_safe
from torch2ms.codegen.scopes import Scope, Scopes
from torch2ms.converters.api import literal


class ModuleLayout:
    """The modules layout of one builder's statements (``classes``: module path -> PyTorch class)."""

    def __init__(self, builder, classes: dict[str, str], roles: dict[str, dict] | None = None):
        self.b = builder
        self.torch_classes = classes
        self.roles = roles or {}
        self.scopes = Scopes(builder, classes)
        self.classes = Classes(classes, {builder.class_name, *builder.definitions})
        self.bodies = Bodies(self.scopes, self.classes.add, self.roles)

    def render_file(self, header: str) -> GeneratedNetwork:
        root = self.scopes.tree()
        self.scopes.settle(root)
        self.scopes.classify(root)
        self.render(root)
        for g in self.classes.groups:
            self.classes.finish(g)
        source, formatter = format_source(self.file_text(header, self.class_text(root)))
        lines = LineMap(self.b, source)
        lines.collect(root)
        b = self.b
        net = GeneratedNetwork(
            source,
            b.class_name,
            lines.params,
            lines.tensor_map,
            self.layer_counts(),
            b.batch.source if b.batch_used else None,
        )
        net.layout = self.record(root, formatter)
        net.param_origin = {k: b.param_origin.get(flat, []) for k, flat in lines.sources.items()}
        return net

    def render(self, root: Scope) -> None:
        """Every instance's code, twice when its callers name its arguments: a caller's locals are
        named only once it is rendered, after its children (``codegen.arguments``)."""
        self.bodies.render(root)
        b = self.bodies
        names = argument_names(b.sites, b.args_of, b.readers, self._forward_inputs)
        if not any(n for given in names.values() for n in given):
            return
        stack = [root]
        while stack:  # what the first rendering and grouping left on the scopes
            s = stack.pop()
            s.body, s.group, s.args, s.optional = None, None, [], None
            stack.extend(s.children.values())
        self.classes = Classes(self.torch_classes, {self.b.class_name, *self.b.definitions})
        self.bodies = Bodies(self.scopes, self.classes.add, self.roles, names)
        self.bodies.render(root)

    def _forward_inputs(self, s: Scope) -> dict[str, str]:
        """Child attribute -> the ``forward`` argument it is called with (``export.roles``)."""
        return (self.roles.get(self.scopes.classes.get(s.module)) or {}).get("inputs", {})

    def class_text(self, root: Scope) -> list[str]:
        """Every class, children first, the network's own last."""
        body = []
        for g in self.classes.groups:
            n = len(g.instances)
            doc = f"PyTorch {g.base}: {g.instances[0].module}" + (f" and {n - 1} more" if n > 1 else "")
            doc = f'    """{doc if len(doc) < 88 else f"PyTorch {g.base} ({n} instances)"}."""'
            body += [f"class {g.name}(nn.Cell):", doc, "", *g.lines, "", ""]
        what = f"PyTorch {self.b.class_name}" if self.classes.classes else f"The ONNX graph {self.b.graph.name!r}"
        doc = f'    """{what} as MindSpore cells; see the module docstring."""'
        body += [f"class {self.b.class_name}(nn.Cell):", doc, "", *class_lines(root, None), "", ""]
        return body

    def imports(self, text: str) -> list[str]:
        """The imports the code uses."""
        b = self.b
        used = {t.string for t in tokens_safe(text)} | ({"ms"} if b.params else set())
        out = []
        if b.params or "OrderedDict" in used:
            out += [
                *(["import os"] if b.params else []),
                *(["from collections import OrderedDict"] if "OrderedDict" in used else []),
                "",
            ]
        if "ms" in used:
            out.append("import mindspore as ms")
        names = [n for n in ("Parameter", "nn", "ops") if n in used]
        if names:
            out.append(f"from mindspore import {', '.join(names)}")
        if "initializer" in used:
            out.append("from mindspore.common.initializer import initializer")
        return out

    def file_text(self, header: str, body: list[str]) -> str:
        b = self.b
        text = "\n".join(body + [source for source in b.definitions.values()])
        shapes = {n: tuple(b.graph.values[n].shape) for n in b.graph.inputs}
        out = [*header.rstrip().splitlines(), "", *self.imports(text), ""]
        out += ["INPUT_SHAPES = {" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in shapes.items()) + "}", "", ""]
        for source in b.definitions.values():
            out += [*source.strip("\n").splitlines(), "", ""]
        out += body
        out += build_function(b.class_name, bool(b.params))
        return "\n".join(out)

    def layer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, call in self.b.layers:
            counts[call.callee] = counts.get(call.callee, 0) + 1
        return dict(sorted(counts.items()))

    def record(self, root: Scope, formatter: str | None) -> dict:
        """How the code is laid out: its classes, the modules inlined or renamed and why, and the
        share of nodes inside a PyTorch module."""
        statements = self.b.statements
        # a node is in a module when its statement belongs to a PyTorch module (its class, its layer
        # attribute, or inline as a weight-free leaf of one), not to the network's own code
        in_class = sum(len(statements[i].node.origin) for i in root.members - set(root.stmts))
        groups = self.classes.groups
        return {
            "layout": "modules",
            "classes": {g.name: {"pytorch": g.base, "instances": len(g.instances)} for g in groups},
            "inlined": self.scopes.inlined,
            "renamed": self.bodies.renamed,
            "nodes_in_modules": in_class,
            "nodes": sum(len(st.node.origin) for st in statements),
            "formatter": formatter,
        }
