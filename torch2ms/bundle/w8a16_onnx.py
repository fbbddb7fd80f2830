"""The W8A16 plan's int8 weights in a generation bundle's ONNX models, the ones ATC compiles.

The plan (``bundle.w8a16``) makes the MindIRs W8A16; a bundle that carried its ONNX models in float
would ship every weight a second time at four bytes. Here each ONNX initializer that holds the float
weight of a layer the plan stores int8 becomes an INT8 initializer, its float32 scales and two nodes
that give the consumers the tensor they had, dequantized: ``Cast(to=FLOAT)`` then ``Mul`` by the
scale. The int8 values are ``w8a16_cell.quantize_rows`` of the same weight, so the ONNX computes the
weights the MindIR computes, bit for bit.

**Which initializers.** Matched by value against the fold stage's checkpoint of the graph
(``<run>/<graph>/fold/network.ckpt``), not by name: the exporter names a Linear's transposed weight
``onnx::MatMul_<n>``. A dense layer's weight W [out, in] is the ``B`` input of a MatMul as W^T (or of
a Gemm, W or W^T by ``transB``), quantized per column there (one scale per output row of W); a table
(the token embedding) is the ``data`` input of an axis-0 Gather as W, per row. An initializer is
rewritten only when every consumer reads it so; a tied embedding and its lm_head are two
initializers, each matched to its own layer.

**Why Cast and Mul.** ATC's ONNX Cast takes int8 and gives float, opsets 8 to 18, and Mul is in its
ONNX operator list (CANN 8.0, "Supported ONNX Operators": Cast,
https://www.hiascend.com/document/detail/zh/canncommercial/800/apiref/aolapi/atlasoxol_09_0031.html;
the list, https://www.hiascend.com/doc_center/source/zh/canncommercial/5046/reference/fwoperatorlist/operatorlist_0071.html).
Its DequantizeLinear is not on that list; onnxruntime runs both forms.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

SUFFIX_INT8, SUFFIX_SCALE = "_w8a16_int8", "_w8a16_scale"


def layer_weights(ckpt: Path, int8: list[str], tables: set[str]) -> dict[str, tuple[str, np.ndarray]]:
    """``label -> (kind, float32 weight)`` of the plan's int8 layers (``int8``: the plan's labels,
    ``tables`` those that are gathered tables) read from a fold checkpoint; ``kind`` is "dense" or
    "table". A label without its weight in the checkpoint is an error naming both."""
    from torch2ms.bundle.w8a16_cell import layer_key
    from torch2ms.runtime import msutil

    params = {layer_key(k): v for k, v in msutil.mindspore().load_checkpoint(str(ckpt)).items()}
    found = {}
    for label in int8:
        kind = "table" if label in tables else "dense"
        keys = [layer_key(p) + ("" if kind == "table" else "_weight") for p in (label, f"model.{label}")]
        key = next((k for k in keys if k in params), None)
        if key is None:
            raise KeyError(f"{ckpt}: no weight for the W8A16 layer {label!r} (looked for {', '.join(keys)})")
        found[label] = (kind, params[key].asnumpy().astype(np.float32))
    return found


def _digest(array: np.ndarray) -> tuple:
    return array.shape, hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def _readers(graph) -> dict[str, list]:
    """initializer name -> [(node, input index)] of the nodes that read it."""
    readers: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    return readers


def _orientation(readers: list) -> tuple[str, int] | None:
    """``(kind, axis)`` the readers agree on: ("dense", axis of W's output rows in the initializer)
    or ("table", 0); None when they read it otherwise (or disagree)."""
    seen = set()
    for node, index in readers:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "MatMul" and index == 1:
            seen.add(("dense", 1))
        elif node.op_type == "Gemm" and index == 1:
            seen.add(("dense", 0 if attrs.get("transB") and attrs["transB"].i else 1))
        elif node.op_type == "Gather" and index == 0 and (attrs["axis"].i if "axis" in attrs else 0) == 0:
            seen.add(("table", 0))
        else:
            return None
    return seen.pop() if len(seen) == 1 else None


def quantize_onnx(src: Path, dest: Path, weights: dict[str, tuple[str, np.ndarray]]) -> dict:
    """Write ``src`` to ``dest`` with the initializers that hold ``weights`` (``layer_weights``) int8,
    dequantized by Cast and Mul (module docstring); returns ``{"layers": {label: initializer},
    "float_bytes", "int8_bytes"}`` (the bytes of the rewritten initializers before and after)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from torch2ms.bundle.w8a16_cell import quantize_rows

    wanted = {}
    for label, (kind, w) in weights.items():
        wanted[(kind, 0, *_digest(w))] = label  # the weight as it is: W (Gemm transB=1), a table
        if kind == "dense":
            wanted[(kind, 1, *_digest(w.T))] = label  # W^T: MatMul's B
    model = onnx.load(str(src))
    graph = model.graph
    readers = _readers(graph)
    names = {t.name for t in graph.initializer} | {n for node in graph.node for n in node.output}
    kept, nodes, done = [], [], {}
    float_bytes = int8_bytes = 0
    for tensor in graph.initializer:
        where = _orientation(readers.get(tensor.name, [])) if tensor.data_type == TensorProto.FLOAT else None
        if where is None or len(tensor.dims) != 2:
            kept.append(tensor)
            continue
        array = numpy_helper.to_array(tensor)
        label = wanted.get((*where, *_digest(array)))
        if label is None:
            kept.append(tensor)
            continue
        rows = array if where[1] == 0 else array.T
        q, scale = quantize_rows(rows)
        if where[1] == 1:
            q, scale = q.T, scale.T  # [in, out] and [1, out]
        q_name, s_name = tensor.name + SUFFIX_INT8, tensor.name + SUFFIX_SCALE
        if q_name in names or s_name in names:
            raise ValueError(f"{src}: {q_name} or {s_name} is already a name in the graph")
        kept += [numpy_helper.from_array(np.ascontiguousarray(q), q_name), numpy_helper.from_array(scale, s_name)]
        nodes += [
            helper.make_node("Cast", [q_name], [q_name + "_float"], to=TensorProto.FLOAT, name=q_name + "_cast"),
            helper.make_node("Mul", [q_name + "_float", s_name], [tensor.name], name=tensor.name + "_w8a16_dequant"),
        ]
        done[label] = tensor.name
        float_bytes += array.nbytes
        int8_bytes += q.nbytes + scale.nbytes
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inputs = [i for i in graph.input if i.name not in done.values()]  # an initializer listed as an input (IR < 4)
    del graph.input[:]
    graph.input.extend(inputs)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))
    return {"layers": done, "float_bytes": float_bytes, "int8_bytes": int8_bytes}


def check_onnx(paths: dict[str, Path], plan, reference, near_tie: float) -> tuple[list[str], dict]:
    """The ONNX models ``paths`` (graph -> file) generating on onnxruntime against the reference,
    free-running and teacher-forced, judged as the plan's MindIRs are (``w8a16.check_mindirs``):
    ``(violations, record)``."""
    from torch2ms.generation.check import judge as judge_generation
    from torch2ms.generation.export import onnx_call
    from torch2ms.generation.loop import Runner, greedy_batches

    runner = Runner(onnx_call(paths["prefill"], "prefill"), onnx_call(paths["decode"], "decode"))
    args = (plan.prompts, plan.batch, plan.max_new_tokens, plan.cache_length)
    free = greedy_batches(runner, *args, gears=plan.gears)
    forced = greedy_batches(runner, *args, teacher=reference.tokens, gears=plan.gears)
    bound = {"rel_error": float("inf"), "cosine": -1.0}
    violations, record = judge_generation(reference, free, forced, bound, near_tie)
    record.pop("logits_bound")
    return violations, record
