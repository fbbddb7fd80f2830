"""``export/modules.json``: the PyTorch model's module tree and state_dict, for the rebuild.

``modules`` maps each module path of ``model.named_modules()`` to its class name: the names of
the generated classes (``torch2ms.codegen.modules``). ``state_dict`` lists every key with its
shape and a hash of its values (and of its transpose for a matrix), so ``weight_map.json`` can
tie a weight the exporter renamed (``onnx::MatMul_123``, a Linear's weight transposed) back to
its key. ``roles`` maps a module path to the local names its class's ``forward`` gives the
results of its children's calls (``module_roles``), for the generated code's locals.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np


def array_hash(array: np.ndarray) -> str:
    a = np.ascontiguousarray(array)
    return hashlib.sha1(a.tobytes() + str(a.shape).encode() + str(a.dtype).encode()).hexdigest()


def record_modules(model, out: Path) -> None:
    """Write ``out``/modules.json for ``model`` (a ``torch.nn.Module``)."""
    from torch2ms.pipeline.workspace import atomic_write_text

    modules = {name: type(m).__name__ for name, m in model.named_modules() if name}
    state = {}
    for key, t in model.state_dict().items():
        a = t.detach().cpu().numpy()
        entry = {"shape": list(a.shape), "dtype": str(a.dtype), "sha1": array_hash(a)}
        if a.ndim == 2:
            entry["sha1_t"] = array_hash(a.T)
        state[key] = entry
    record = {"root": type(model).__name__, "modules": modules, "state_dict": state, "roles": module_roles(model)}
    atomic_write_text(out / "modules.json", json.dumps(record, indent=1) + "\n")


def forward_roles(cls: type) -> dict[str, str]:
    """Child attribute -> local name, from ``cls.forward``'s source: ``identity = self.downsample(x)``
    gives ``downsample -> identity``. Only unambiguous pairs: the child is called once in
    ``forward``, its result is assigned to a plain name, and that name is assigned by no other call
    and is not an argument of ``forward`` (``x = self.layer1(x)`` names nothing). Empty when the
    source cannot be read (a builtin, a class made at run time)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return {}
    fn = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if fn is None:
        return {}
    arguments = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
    called = Counter()  # child attribute -> calls of it in forward
    assigned = Counter()  # name -> assignments of a call's result to it
    pairs = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and _self_attr(node.func):
            called[node.func.attr] += 1
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Call):
                assigned[node.targets[0].id] += 1
                if _self_attr(node.value.func):
                    pairs.append((node.value.func.attr, node.targets[0].id))
    return {
        attr: name
        for attr, name in pairs
        if called[attr] == 1 and assigned[name] == 1 and name not in arguments and name.isidentifier()
    }


def _self_attr(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"


def module_roles(model) -> dict[str, dict[str, str]]:
    """``forward_roles`` of each module of ``model`` (``""``: the model itself), where it names any."""
    by_class: dict[type, dict[str, str]] = {}
    out = {}
    for name, m in model.named_modules():
        cls = type(m)
        if cls not in by_class:
            by_class[cls] = forward_roles(cls)
        if by_class[cls]:
            out[name] = by_class[cls]
    return out
