"""``weight_map.json``: every PyTorch ``state_dict`` key and the checkpoint parameters made from it.

A parameter equal to a key's values is a ``copy`` of it (``backbone.layer1.0.bn1.running_mean``
-> ``backbone.layer1.0.conv1.batchnorm.moving_mean``), equal to its transpose a ``transpose``
(a Linear weight the exporter wrote as a MatMul operand). Any other parameter was computed from
the keys its ONNX nodes read: ``bn_fold`` where a BatchNormalization was folded into it
(``W' = W * gamma / sqrt(var + eps)``, ``torch2ms.passes.fold_bn``), else ``computed``. A parameter
made for several ONNX nodes (Conv + BatchNormalization + ReLU) names the cell they were fused
into. Keys no parameter comes from are listed with why (``num_batches_tracked`` is a training
counter the exported graph does not read).

Matching is by values (hashes recorded by the export stage in ``modules.json``), so it needs no
knowledge of what each converter or pass does with a weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torch2ms.pipeline.workspace import array_hash


def _initializer_keys(model, state: dict[str, dict]) -> dict[str, list[str]]:
    """ONNX node name -> the state_dict keys among its initializer inputs (by name, else by value)."""
    from onnx import numpy_helper

    by_hash: dict[str, list[str]] = {}
    for k, e in state.items():
        by_hash.setdefault(e["sha1"], []).append(k)
        if "sha1_t" in e:
            by_hash.setdefault(e["sha1_t"], []).append(k)
    keys_of: dict[str, list[str]] = {}
    for t in model.graph.initializer:
        if t.name in state:
            keys_of[t.name] = [t.name]
        else:
            found = by_hash.get(array_hash(numpy_helper.to_array(t)))
            if found and len(found) == 1:
                keys_of[t.name] = found
    return {n.name: [k for i in n.input for k in keys_of.get(i, [])] for n in model.graph.node}


def weight_map(onnx_path: Path, record: dict, params: dict[str, np.ndarray], origin: dict[str, list[str]]) -> dict:
    """The map for a generated network's checkpoint ``params`` (name -> array) made for the ONNX
    nodes ``origin`` (name -> node names)."""
    import onnx

    model = onnx.load(str(onnx_path))
    op_type = {n.name: n.op_type for n in model.graph.node}
    state = record.get("state_dict", {})
    by_hash: dict[str, list[tuple[str, str]]] = {}
    for k, e in state.items():
        by_hash.setdefault(e["sha1"], []).append((k, "copy"))
        if "sha1_t" in e:
            by_hash.setdefault(e["sha1_t"], []).append((k, "transpose"))
    node_keys = _initializer_keys(model, state)
    del model
    out: dict[str, list[dict]] = {k: [] for k in state}
    for name, array in params.items():
        nodes = origin.get(name, [])
        readers = list(dict.fromkeys(k for n in nodes for k in node_keys.get(n, [])))
        hits = by_hash.get(array_hash(array), [])
        if array.ndim == 2 and not hits:
            hits = [(k, "transpose") for k, how in by_hash.get(array_hash(array.T), []) if how == "copy"]
        # equal values: prefer the key this parameter's own nodes read (zero-initialised buffers repeat;
        # weights the exporter merged have their own initializers again, ``exporters.unmerge``)
        hits = [h for h in hits if h[0] in readers] or hits[:1]
        entry = {"parameter": name}
        if len(nodes) > 1:
            cell = name.rsplit(".", 1)[0]  # nn.Conv2dBnAct's inner conv / batchnorm are part of the cell
            entry["fused_into"] = cell.rsplit(".", 1)[0] if cell.endswith((".conv", ".batchnorm", ".dense")) else cell
            entry["fused_nodes"] = nodes
        if hits:
            for key, how in hits[:1]:
                out[key].append({**entry, "transform": how})
        else:
            how = "bn_fold" if any(op_type.get(n) == "BatchNormalization" for n in nodes) else "computed"
            for key in readers:
                out[key].append({**entry, "transform": how, "from": readers})
    result = {}
    for key, targets in out.items():
        if targets:
            result[key] = targets
        elif key.endswith("num_batches_tracked"):
            result[key] = {"unused": "a training counter; inference does not read it"}
        else:
            result[key] = {"unused": "no parameter of the network holds or is computed from it (the exporter "
                           "folded it into a constant, or the network does not use it)"}  # fmt: skip
    return result
