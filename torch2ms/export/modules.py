"""``export/modules.json``: the PyTorch model's module tree and state_dict, for the rebuild.

``modules`` maps each module path of ``model.named_modules()`` to its class name: the names of
the generated classes (``torch2ms.codegen.modules``). ``state_dict`` lists every key with its
shape and a hash of its values (and of its transpose for a matrix), so ``weight_map.json`` can
tie a weight the exporter renamed (``onnx::MatMul_123``, a Linear's weight transposed) back to
its key.
"""

from __future__ import annotations

import hashlib
import json
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
    record = {"root": type(model).__name__, "modules": modules, "state_dict": state}
    atomic_write_text(out / "modules.json", json.dumps(record, indent=1) + "\n")
