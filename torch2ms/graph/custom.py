"""Ops of a custom ONNX domain that a converter plugin declared, and what onnxruntime runs for them.

onnxruntime has no kernel for a user's op (``my.domain.SiluMul``), yet the loader needs one run of
the model for its shapes (``graph.load``) and the export stage checks the ONNX against PyTorch with
onnxruntime. A plugin therefore gives each custom op a reference: the op as an ONNX function of
default-domain ops (``onnx.parser`` text). ``embed_references`` writes those functions into the model
as model-local functions (ONNX IR 8), which onnxruntime inlines, while every other reader (the IR,
the converters) still sees one node of the custom domain. The export check so compares PyTorch with
the plugin's decomposition: it checks the export (the custom symbolic, its inputs and attributes);
the user's kernel itself is checked by the rebuild stage, which runs it against PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class Reference:
    domain: str
    op_type: str
    text: str
    plugin: str

    def function(self) -> onnx.FunctionProto:
        from onnx import parser

        from torch2ms.errors import PluginError

        try:
            fn = parser.parse_function(self.text)
        except Exception as err:  # noqa: BLE001 - the parser's own error types differ by version
            raise PluginError(
                f"converter plugin {self.plugin!r}: the reference of {self.domain}.{self.op_type} is not an ONNX "
                f"function: {str(err).strip().splitlines()[0]}",
                hint="give it in onnx.parser's function syntax: "
                '<domain: "my.domain", opset_import: ["" : 17]> Name (x) => (y) {...}',
            ) from None
        if (fn.domain, fn.name) != (self.domain, self.op_type):
            raise PluginError(
                f"converter plugin {self.plugin!r}: the reference of {self.domain}.{self.op_type} defines "
                f"{fn.domain}.{fn.name}",
                hint='its header must name the op: <domain: "' + self.domain + '", ...> ' + self.op_type + " (...)",
            )
        return fn


# (domain, op type) -> its reference
REFERENCES: dict[tuple[str, str], Reference] = {}


def declare_reference(domain: str, op_type: str, text: str, plugin: str) -> None:
    REFERENCES[(domain, op_type)] = Reference(domain, op_type, text, plugin)


def declared() -> str:
    """What the loaded plugins cover, for a refusal: ``; converter plugin p: my.domain.Op, ...``."""
    by_plugin: dict[str, list[str]] = {}
    for r in REFERENCES.values():
        by_plugin.setdefault(r.plugin, []).append(f"{r.domain}.{r.op_type}")
    return "".join(f"; converter plugin {p}: {', '.join(sorted(ops))}" for p, ops in sorted(by_plugin.items()))


def embed_references(model: onnx.ModelProto) -> list[str]:
    """Add the reference function of each custom-domain op ``model`` uses (and its domain's opset
    import); returns the ops added, as ``domain.op``."""
    if not REFERENCES:
        return []
    have = {(f.domain, f.name) for f in model.functions}
    used = {(n.domain, n.op_type) for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    added = []
    for key in sorted(used - have):
        if key in REFERENCES:
            model.functions.append(REFERENCES[key].function())
            added.append(f"{key[0]}.{key[1]}")
    imported = {o.domain for o in model.opset_import}
    for domain in sorted({k[0] for k in used} - imported):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    if added and model.ir_version < 8:  # model-local functions are IR 8 on
        model.ir_version = 8
    return added


def embed_references_file(path) -> list[str]:
    """``embed_references`` on the ONNX file at ``path``, rewritten only when something was added."""
    if not REFERENCES:  # no plugin declared one: the file is not read again (a model can be gigabytes)
        return []
    from torch2ms.pipeline.workspace import atomic_write_bytes

    model = onnx.load(str(path))
    added = embed_references(model)
    if added:
        atomic_write_bytes(path, model.SerializeToString())
    return added
