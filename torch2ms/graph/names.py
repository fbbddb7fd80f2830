"""Turn ONNX node/tensor names into valid, unique Python identifiers.

The TorchScript exporter names nodes after the module path, e.g.
``/backbone/layer1/layer1.0/conv1/Conv``: each segment repeats its parent's name
(``layer1`` / ``layer1.0``), so merging prefixes gives ``backbone.layer1.0.conv1``, which
becomes ``backbone_layer1_0_conv1``.
"""

from __future__ import annotations

import builtins
import keyword
import re

# builtins a graph input may keep as its name, as PyTorch's own ``forward(self, input)``: the
# generated code never calls them
SHADOWABLE = {"input"}
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | {"self", "ms", "nn", "ops", "np", "Parameter", "initializer"}


def module_path(node_name: str) -> list[str]:
    """Module path segments of an exporter node name (op type segment dropped)."""
    segs = [s for s in node_name.strip("/").split("/") if s]
    if len(segs) > 1:
        segs = segs[:-1]
    elif segs and "/" in node_name:
        return []
    merged: list[str] = []
    for s in segs:
        if merged and s.startswith(merged[-1] + "."):
            merged[-1] = s
        else:
            merged.append(s)
    return merged


def node_module(node, scopes: dict[str, str]) -> list[str]:
    """The module path of an IR node: from its TorchScript-style name, else (dynamo) from the
    exporter's metadata (``scopes``, ONNX node name -> module path) for the first ONNX node it
    stands for."""
    if node.name.startswith("/"):
        path = module_path(node.name)
        return ".".join(path).split(".") if path else []
    scope = next((scopes[o] for o in node.origin if o in scopes), "")
    return scope.split(".") if scope else []


def snake(text: str) -> str:
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    text = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_").lower()
    text = re.sub(r"_+", "_", text)
    return text or "v"


class Namer:
    """Hands out unique identifiers; never a keyword, builtin or module alias."""

    def __init__(self, reserved: set[str] | None = None):
        self.taken = set(_RESERVED) | (reserved or set())

    def keep(self, name: str) -> str:
        """``name`` itself, though it is a builtin (a method argument called ``input``); the
        numbered name when it is taken."""
        if name in self.taken - set(dir(builtins)) or not name.isidentifier() or keyword.iskeyword(name):
            return self(name)
        self.taken.add(name)
        return name

    def __call__(self, hint: str) -> str:
        base = snake(hint)
        if base[0].isdigit():
            base = f"v{base}"
        if base in _RESERVED:
            base += "_"  # PEP 8: a trailing underscore avoids clashing with a keyword/builtin
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name
