"""``export/modules.json``: the PyTorch model's module tree and state_dict, for the rebuild.

``modules`` maps each module path of ``model.named_modules()`` to its class name: the names of
the generated classes (``torch2ms.codegen.modules``). ``state_dict`` lists every key with its
shape and a hash of its values (and of its transpose for a matrix), so ``weight_map.json`` can
tie a weight the exporter renamed (``onnx::MatMul_123``, a Linear's weight transposed) back to
its key. ``roles`` holds, per PyTorch class, the names its ``forward`` gives its values
(``torch2ms.export.roles``), which the generated code's locals take.
"""

from __future__ import annotations

import json
from pathlib import Path


def record_modules(model, out: Path) -> None:
    """Write ``out``/modules.json for ``model`` (a ``torch.nn.Module``)."""
    from torch2ms.export.roles import module_roles
    from torch2ms.pipeline.workspace import array_hash, atomic_write_text

    modules = {name: type(m).__name__ for name, m in model.named_modules() if name}
    state = {}
    for key, t in model.state_dict().items():
        a = t.detach().cpu().numpy()
        entry = {"shape": list(a.shape), "dtype": str(a.dtype), "sha1": array_hash(a)}
        if a.ndim == 2:
            entry["sha1_t"] = array_hash(a.T)
        state[key] = entry
    record = {"root": type(model).__name__, "modules": modules, "roles": module_roles(model), "state_dict": state}
    atomic_write_text(out / "modules.json", json.dumps(record, indent=1) + "\n")
