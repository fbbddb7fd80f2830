"""Both sides run on the stage's samples, compared statement by statement, then replayed from
onnxruntime's own inputs: ``localize``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from torch2ms.bounds import widen
from torch2ms.compare import Tolerance
from torch2ms.divergence.arbitration import arbitrate
from torch2ms.divergence.probe import (
    _CellHook,
    _Stream,
    load_class_probe,
    load_probe,
    statement_lines,
)
from torch2ms.divergence.references import _References
from torch2ms.divergence.report import LOCAL_SHARE, DiffReport, TensorDiff, _Accumulator
from torch2ms.errors import Torch2msError


def _plain(v):
    """An attribute value for the report: ONNX floats are float32, so 1e-05, not 9.9999997e-06."""
    if isinstance(v, np.ndarray):
        return _plain(v.tolist()) if v.size <= 16 else f"<tensor {list(v.shape)}>"
    if isinstance(v, float):
        return float(str(np.float32(v))) if math.isfinite(v) else str(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _onnx_nodes(model) -> dict[str, dict]:
    """Node name (as the IR names it) -> op type and attributes, for the report."""
    from torch2ms.graph.validate import _attr_value

    out = {}
    for i, n in enumerate(model.graph.node):
        attrs = {a.name: _plain(_attr_value(a)) for a in n.attribute}
        out[n.name or f"{n.op_type}_{i}"] = {
            "node": n.name or f"{n.op_type}_{i}",
            "op": n.op_type,
            "attributes": attrs,
            "inputs": list(n.input),
            "outputs": list(n.output),
        }
    return out


def _entry_inputs(entry: dict, nodes: dict[str, dict], constants: set[str]) -> list[str]:
    """The ONNX tensors a statement reads: from tensor_map, or for a map written before it
    recorded them, the inputs of its ONNX nodes that none of them produces."""
    if "inputs" in entry:
        return list(entry["inputs"])
    origin = [nodes[n] for n in entry.get("origin", [entry["node"]]) if n in nodes]
    inner = {o for n in origin for o in n["outputs"]}
    return [i for n in origin for i in n["inputs"] if i and i not in inner and i not in constants]


def localize(
    onnx_path: Path,
    stage_dir: Path,
    samples: list[dict[str, np.ndarray]],
    tolerance: Tolerance,
    stage: str,
    display_dir: Path | None = None,
) -> DiffReport:
    """Compare every tensor of the stage's generated code with onnxruntime; find the culprit; and
    replay every statement on onnxruntime's inputs for its local error (see the module's docstring)."""
    import onnx

    tol = Tolerance(tolerance.rel_error, tolerance.cosine, 0.0)
    source = (stage_dir / "network.py").read_text()
    _check_made_from(source, onnx_path, stage_dir, stage)
    entries = json.loads((stage_dir / "tensor_map.json").read_text())
    model = onnx.load(str(onnx_path))
    nodes = _onnx_nodes(model)
    produced = {o for n in model.graph.node for o in n.output if o}
    constants = {t.name for t in model.graph.initializer}
    compared = [e for e in entries if e["tensor"] in produced]
    not_compared = [e["tensor"] for e in entries if e["tensor"] not in produced]
    if not compared:
        raise Torch2msError(
            f"{stage_dir / 'tensor_map.json'}: none of its tensors is computed by a node of {onnx_path}; nothing to "
            "compare"
        )
    acc, local_acc = _run_and_replay(model, stage_dir, stage, compared, samples)
    # flat layout: lines from the code itself (older tensor maps counted the header as one line); the
    # modules layout's tensor map holds each statement's line in its class
    lines = {} if any("module" in e for e in compared) else statement_lines(source)
    tensors = [_tensor_diff(e, acc, local_acc, tol, lines, nodes, constants) for e in compared]
    local_tol = Tolerance(*widen(tol.rel_error, tol.cosine, LOCAL_SHARE), 0.0)
    arbitrate(model, stage_dir, stage, compared, samples, tensors, local_tol)
    ok = {t.tensor: t.ok for t in tensors}
    first = next((t for t in tensors if not t.ok and all(ok.get(i, True) for i in t.inputs)), None)
    first = first or next((t for t in tensors if not t.ok), None)
    code_file = (display_dir or stage_dir) / "network.py"
    graph_inputs = [i.name for i in model.graph.input if i.name not in constants]
    report = DiffReport(
        stage,
        code_file,
        len(samples),
        tol,
        tensors,
        first,
        not_compared=not_compared,
        graph_inputs=graph_inputs,
        replayed=True,
    )
    if first is not None:
        report.code = source.splitlines()[first.line - 1]
        report.onnx_nodes = [
            {k: v for k, v in nodes[n].items() if k in ("node", "op", "attributes")} for n in first.origin if n in nodes
        ]
    return report


def _check_made_from(source: str, onnx_path: Path, stage_dir: Path, stage: str) -> None:
    """The generated code's header names the ONNX it was made from: it must be ``onnx_path``."""
    from torch2ms.pipeline.workspace import sha256_file

    made_from = re.search(r"\(sha256 ([0-9a-f]{16}), opset", source)
    if made_from and not sha256_file(onnx_path).startswith(made_from.group(1)):
        raise Torch2msError(
            f"{stage_dir / 'network.py'} was generated from another ONNX file than {onnx_path} (sha256 "
            f"{made_from.group(1)}...)",
            hint=f"the export changed since; run `torch2ms convert` again so that the {stage} stage is regenerated",
        )


def _run_and_replay(model, stage_dir: Path, stage: str, compared: list[dict], samples) -> tuple[dict, dict]:
    """Per compared tensor: the generated code's error against onnxruntime (run as it is), and each
    statement's local error (replayed on onnxruntime's inputs), accumulated over ``samples``."""
    from torch2ms.runtime import msutil
    from torch2ms.runtime.memory import release_freed

    names = list(dict.fromkeys(e["tensor"] for e in compared))
    variables = list(dict.fromkeys(e["var"] for e in compared))
    ms = msutil.mindspore()
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    acc = {e["tensor"]: _Accumulator(e["tensor"]) for e in compared}
    local_acc = {e["tensor"]: _Accumulator(e["tensor"]) for e in compared}
    run, replay = _Stream(ms, compared, acc, replay=False), _Stream(ms, compared, local_acc, replay=True)
    modules = any("module" in e for e in compared)

    def probe(stream: _Stream):
        if modules:
            return load_class_probe(stage_dir, stage, _CellHook(stream))
        return load_probe(stage_dir, variables, stage, stream)

    try:
        for sample in samples:
            with _References(model, names, sample) as reference:
                # one probe network at a time, built once onnxruntime's values are there: two of a
                # large model's held beside each other cost more than building one again per sample
                for stream in (run, replay):
                    network = probe(stream)
                    stream.start(reference)
                    network(*[ms.Tensor(v) for v in sample.values()])
                    stream.finish()
                    del network
                    release_freed()
    finally:
        ms.set_context(mode=mode)
    return acc, local_acc


def _tensor_diff(e: dict, acc: dict, local_acc: dict, tol: Tolerance, lines, nodes, constants) -> TensorDiff:
    """One tensor map entry's result: its error, its problem, and its local (replayed) error."""
    a = acc[e["tensor"]]
    m = None if a.problem else a.metrics()
    t = TensorDiff(
        e["tensor"],
        e["var"],
        lines.get(e["var"], e["line"]),
        e["node"],
        e["op"],
        e.get("origin", [e["node"]]),
        _entry_inputs(e, nodes, constants),
        m,
        module=e.get("module"),
        cls=e.get("class"),
    )
    t.problem = a.problem or "; ".join(tol.violations(m))
    la = local_acc[e["tensor"]]
    if la.count and not la.problem:
        local_tol = Tolerance(*widen(tol.rel_error, tol.cosine, LOCAL_SHARE), 0.0)
        t.local = la.metrics()
        t.local_problem = "; ".join(local_tol.violations(t.local))
    return t
