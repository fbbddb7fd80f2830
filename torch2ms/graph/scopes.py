"""The PyTorch module path of each ONNX node: from TorchScript's node names, or the dynamo exporter's
name-scope metadata."""

from __future__ import annotations

import ast

import onnx


def module_scopes(g: onnx.GraphProto) -> dict[str, str]:
    """The module path of each node the dynamo exporter named (``pkg.torch.onnx.name_scopes``: the
    module paths from the root down, then the op's own name, e.g. ``['', 'layer', 'layer.0', 'relu']``
    for a ReLU called in module ``layer.0``)."""
    out = {}
    for i, n in enumerate(g.node):
        meta = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
        if meta is None:
            continue
        try:
            scopes = ast.literal_eval(meta)
        except (ValueError, SyntaxError):
            continue
        if not (isinstance(scopes, list) and len(scopes) >= 2 and all(isinstance(x, str) for x in scopes)):
            continue
        scope = scopes[-2]
        if any(p.key == "pkg.onnxscript.rewriter.rule_name" for p in n.metadata_props):
            # the exporter's optimizer made this node from several modules' (FuseBatchNormIntoConv: a
            # conv's and its BatchNorm's, recorded under the BatchNorm): it belongs to their parent
            scope = scope.rpartition(".")[0]
        if scope:
            out[n.name or f"{n.op_type}_{i}"] = scope
    return _unscoped_by_consumers(g, out) if out else out


def node_modules(g: onnx.GraphProto) -> dict[str, str]:
    """ONNX node name -> the PyTorch module path it was exported from: TorchScript's node name
    (``/layer1/layer1.0/conv1/Conv``), else the dynamo exporter's metadata (``module_scopes``)."""
    from torch2ms.graph.names import module_path

    scopes = module_scopes(g)
    return {n.name: ".".join(module_path(n.name)) if n.name.startswith("/") else scopes.get(n.name, "") for n in g.node}


def _unscoped_by_consumers(g: onnx.GraphProto, scopes: dict[str, str]) -> dict[str, str]:
    """A node the exporter left without ``name_scopes`` (its ``Split`` of ``torch.split``) belongs to
    the innermost module that every consumer of its outputs is in; without this it is the network's
    own code, and each module it feeds interleaves with the network (timm's halo attention: 9-13
    modules inlined, 73-77% of the nodes in a class)."""
    names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(g.node)]
    consumers: dict[str, list[str]] = {}
    for name, n in zip(names, g.node):
        for x in n.input:
            consumers.setdefault(x, []).append(name)
    out = dict(scopes)
    for name, n in reversed(list(zip(names, g.node))):  # consumers first: a chain of such nodes resolves
        users = [u for o in n.output for u in consumers.get(o, [])]
        if name in out or not users or any(u not in out for u in users):
            continue
        common: list[str] = []
        for parts in zip(*(out[u].split(".") for u in users)):
            if len(set(parts)) > 1:
                break
            common.append(parts[0])
        if common:
            out[name] = ".".join(common)
    return out
