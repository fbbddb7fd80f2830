"""Which side is wrong where diff's replay finds a statement off onnxruntime: the node in float64.

The replay (``divergence``) holds each statement of network.py to onnxruntime's value of
the same tensor, computed from the same inputs, and so takes onnxruntime's kernel as the accurate
one. Where it is not, a right statement would be called wrong and the reference's own error blamed
on the converted network: onnxruntime's CPU Sigmoid is a fast approximation, accurate to about 1e-7
absolute but not relative (off by tens of percent below outputs of 1e-6, 0 below x = -18), so on a
sigmoid output that is tiny everywhere its relative error is onnxruntime's, not the code's.

So each statement the replay finds wrong is computed once more, from onnxruntime's own inputs, in
float64 (its ONNX nodes widened on onnx's reference evaluator, ``export.float64``). The statement is
right when its output is within the replay's local bound of that float64 value and onnxruntime's
output is farther from it: ``TensorDiff.reference_off`` then says by how much onnxruntime is off,
and the statement is not wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torch2ms.compare import Tolerance


def arbitrate(model, stage_dir: Path, stage: str, compared: list[dict], samples, tensors, local_tol: Tolerance) -> None:
    """Clear the local problem of each statement of ``tensors`` (``TensorDiff``) that float64 shows
    right and onnxruntime off, recording ``reference_off`` on it."""
    from torch2ms.divergence.references import _References
    from torch2ms.divergence.report import _Accumulator

    suspects = [t for t in tensors if t.local_problem]
    if not suspects:
        return
    nodes = {n.name or f"{n.op_type}_{i}": n for i, n in enumerate(model.graph.node)}
    produced = {o for n in model.graph.node for o in n.output if o}
    initializers = {t.name: t for t in model.graph.initializer}
    origin = {t.tensor: [nodes[o] for o in t.origin if o in nodes] for t in suspects}
    feeds = {k: _feeds(ns, initializers) for k, ns in origin.items()}
    # the replay hands every statement onnxruntime's value, so every compared tensor is computed
    wanted = {e["tensor"] for e in compared} | {f for fs in feeds.values() for f in fs if f in produced}
    code = {k: _Accumulator(k) for k in origin}
    ort = {k: _Accumulator(k) for k in origin}
    evaluators: dict = {}
    for sample in samples:
        with _References(model, sorted(wanted), sample) as ref:
            kept = _replayed_values(stage_dir, stage, compared, ref, sample, set(origin))
            for k, ns in origin.items():
                values = {f: (np.asarray(ref[f]) if f in produced else sample[f]) for f in feeds[k]}
                if k not in evaluators:
                    evaluators[k] = _node_evaluator(model, ns, feeds[k], k, initializers, values)
                from torch2ms.export import float64

                wide = float64.evaluate(evaluators[k], values, [k])[k]
                if k in kept:
                    code[k].add(kept[k].astype(np.float64), wide)
                ort[k].add(np.asarray(ref[k], np.float64), wide)
    for t in suspects:
        if not code[t.tensor].count or code[t.tensor].problem or ort[t.tensor].problem:
            continue
        c, o = code[t.tensor].metrics(), ort[t.tensor].metrics()
        if not local_tol.violations(c) and o.rel_error > c.rel_error:
            t.reference_off = (
                f"onnxruntime's own {t.op} is off its float64 value by rel error {o.rel_error:.3g} on these inputs, "
                f"the generated code by {c.rel_error:.3g}"
            )
            t.local_problem = ""


def _feeds(nodes, initializers: dict) -> list[str]:
    """The tensors ``nodes`` read from outside themselves (initializers excluded)."""
    inner = {o for n in nodes for o in n.output}
    return list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in inner and i not in initializers))


def _node_evaluator(model, nodes, feeds: list[str], output: str, initializers: dict, values: dict):
    from torch2ms.divergence.references import _node_reads, _segment_model
    from torch2ms.export import float64

    reads = [_node_reads(n) for n in nodes]
    return float64.wide_evaluator(_segment_model(model, nodes, reads, feeds, [output], initializers, values))


def _replayed_values(stage_dir: Path, stage: str, compared: list[dict], ref, sample, keep: set[str]) -> dict:
    """The replay pass over one sample (every statement from onnxruntime's inputs), keeping the
    generated code's values of the tensors ``keep``."""
    from torch2ms.divergence.probe import _CellHook, _Stream, load_class_probe, load_probe
    from torch2ms.divergence.report import _Accumulator
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    acc = {e["tensor"]: _Accumulator(e["tensor"]) for e in compared}
    stream = _Stream(ms, compared, acc, replay=True)
    stream.keep = keep
    if any("module" in e for e in compared):
        network = load_class_probe(stage_dir, f"{stage}_arbiter", _CellHook(stream))
    else:
        network = load_probe(stage_dir, list(dict.fromkeys(e["var"] for e in compared)), f"{stage}_arbiter", stream)
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        stream.start(ref)
        network(*[ms.Tensor(v) for v in sample.values()])
        kept = dict(stream.kept)
        stream.finish()
    finally:
        ms.set_context(mode=mode)
    return kept
