"""Where a wrong export first departs from PyTorch: module by module, both sides in float64.

A wrong ``model.onnx`` (``export.verdict``) is wrong somewhere upstream of the output that shows
it, and every op after that point is off too; blaming the last op, or any op downstream, sends the
reader to code that is right. Here the PyTorch model runs in float64 with a forward hook on every
module, and ``model.onnx`` runs in float64 (``export.float64``) on the same sample. Each module's
output is matched to the output of the last ONNX node exported from it (``graph.scopes``: TorchScript's
node names, the dynamo exporter's name scopes), when their shapes agree. Walking the nodes in
graph order, the first module whose output is off by more than ``bound`` (the relative error
``max|onnx - torch| / max|torch|``) is the first diverging one: its inputs came from modules that
agree, so the error is inside it. When every module agrees, the error is in the network's own code
(an op of no module) after the last agreeing module, and the record names the nodes there.
"""

from __future__ import annotations

import copy

import numpy as np

MODULE_CALLS_KEPT = 1  # a module called more than once has no single output to compare
NODES_NAMED = 5  # the network-code nodes listed after the last agreeing module


def _torch_outputs(model, sample: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Each module's output (a single tensor, one call) of ``model`` in float64 on ``sample``, and
    the model's outputs."""
    import torch

    wide = copy.deepcopy(model).double().eval()
    seen: dict[str, list] = {}

    def hook(name):
        def record(_mod, _args, out):
            seen.setdefault(name, []).append(out.detach().numpy().copy() if isinstance(out, torch.Tensor) else None)

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in wide.named_modules() if n]
    feed = [torch.from_numpy(v.astype(np.float64) if v.dtype.kind == "f" else v) for v in sample.values()]
    try:
        with torch.no_grad():
            result = wide(*feed)
    finally:
        for h in handles:
            h.remove()
    flat = [result] if isinstance(result, torch.Tensor) else [t for t in result if isinstance(t, torch.Tensor)]
    modules = {n: outs[0] for n, outs in seen.items() if len(outs) == MODULE_CALLS_KEPT and outs[0] is not None}
    return modules, [t.numpy() for t in flat]


def _module_tensors(graph) -> dict[str, tuple[int, str, str]]:
    """Module path -> (graph position, name, output) of the last node exported from it or its children."""
    from torch2ms.graph.scopes import node_modules

    scopes = node_modules(graph)
    last: dict[str, tuple[int, str, str]] = {}
    for i, node in enumerate(graph.node):
        parts = scopes.get(node.name, "").split(".") if scopes.get(node.name) else []
        for k in range(1, len(parts) + 1):
            last[".".join(parts[:k])] = (i, node.name, node.output[0])
    return last


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.abs(want).max()) if want.size else 0.0
    diff = float(np.abs(got - want).max()) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def first_diverging(model, onnx_path, sample: dict[str, np.ndarray], bound: float) -> dict | None:
    """The first module whose ONNX output is off PyTorch's by more than ``bound`` (module docstring):
    ``{"module", "onnx_node", "op", "rel_error", "last_agreeing", "compared"}``; when every compared
    module agrees but an output does not, ``{"module": None, "network_code_after": ..., "nodes":
    [...]}``; None when the sample's outputs agree too (it does not show the error)."""
    import onnx

    from torch2ms.export import float64

    graph = onnx.load(str(onnx_path)).graph
    theirs, final = _torch_outputs(model, sample)
    tensors = {m: t for m, t in _module_tensors(graph).items() if m in theirs}
    # in graph order; a parent and its last child share one tensor: the child (deeper) first
    order = sorted(tensors, key=lambda m: (tensors[m][0], -m.count(".")))
    outputs = [o.name for o in graph.output][: len(final)]
    names = sorted({tensors[m][2] for m in order} | set(outputs))
    ours = float64.run(onnx_path, [sample], names)[0]
    agreeing, compared = None, 0
    for m in order:
        pos, node, tensor = tensors[m]
        got, want = np.asarray(ours[tensor]), theirs[m]
        if got.shape != want.shape:
            continue
        compared += 1
        err = _rel(got, want)
        if err > bound:
            op = graph.node[pos].op_type
            return {
                "module": m,
                "onnx_node": node,
                "op": op,
                "rel_error": err,
                "last_agreeing": agreeing,
                "compared": compared,
            }
        agreeing = m
    if all(_rel(np.asarray(ours[o]), f) <= bound for o, f in zip(outputs, final) if np.shape(ours[o]) == f.shape):
        return None
    after = tensors[agreeing][0] if agreeing else -1
    nodes = [n.name for n in graph.node[after + 1 :]][:NODES_NAMED]
    return {"module": None, "network_code_after": agreeing, "nodes": nodes, "compared": compared}


def summary(found: dict) -> str:
    """One line for the stage's reason."""
    if found.get("module"):
        after = f", after {found['last_agreeing']!r} agrees" if found["last_agreeing"] else ""
        return (
            f"first diverging module {found['module']!r} (ONNX node {found['onnx_node']!r}, {found['op']}): "
            f"rel error {found['rel_error']:.3g} in float64{after}"
        )
    where = f"after module {found['network_code_after']!r}" if found["network_code_after"] else "before any module"
    return f"every compared module agrees; the error is in the network's own code {where} (nodes {found['nodes']})"
