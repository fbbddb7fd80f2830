"""What a divergence search found: per-tensor errors against onnxruntime and the verdict (a wrong
node, or accumulated rounding)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torch2ms.bounds import LOCAL_SHARE, widen
from torch2ms.compare import MetricsAccumulator, OutputMetrics, Tolerance

REPLAY_HOOK = "torch2ms_replay"  # no leading "__": the hook is called inside a class (name mangling)


class _Accumulator(MetricsAccumulator):
    """``compare``'s metrics of one tensor over samples added one at a time; a shape mismatch is
    recorded as the tensor's problem (a divergence to report), not raised."""

    def __init__(self, name: str):
        super().__init__(name, reference_label="onnxruntime", actual_label="generated code")
        self.problem: str | None = None

    def add(self, actual, reference) -> None:
        actual, reference = np.asarray(actual), np.asarray(reference)
        if actual.shape != reference.shape:
            self.problem = f"shape {list(actual.shape)} differs from onnxruntime's {list(reference.shape)}"
        if not self.problem:
            super().add(actual, reference)


@dataclass
class TensorDiff:
    """One statement output of the generated code against the same ONNX tensor."""

    tensor: str
    var: str
    line: int
    node: str
    op: str
    origin: list[str]
    inputs: list[str]
    metrics: OutputMetrics | None = None
    problem: str = ""  # a shape mismatch or non-finite values, or the tolerance violations
    local: OutputMetrics | None = None  # computed from onnxruntime's inputs (the replay)
    local_problem: str = ""  # the local error's violation of LOCAL_SHARE x the tolerance
    reference_off: str = ""  # onnxruntime off float64 where the statement is not (``divergence.arbitration``)
    module: str | None = None  # modules layout: the PyTorch module path of the instance, and its class
    cls: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def where(self) -> str:
        """`` in Bottleneck.construct (backbone.layer3.5)`` inside a module class, else nothing."""
        return f" in {self.cls}.construct ({self.module})" if self.cls and self.module else ""

    def to_dict(self) -> dict:
        return {
            "tensor": self.tensor,
            "var": self.var,
            "line": self.line,
            "node": self.node,
            "op": self.op,
            "origin": self.origin,
            "inputs": self.inputs,
            "ok": self.ok,
            "problem": self.problem,
            "metrics": self.metrics.to_dict() if self.metrics else None,
            "local": self.local.to_dict() if self.local else None,
            "local_problem": self.local_problem,
            "reference_off": self.reference_off,
            **({"module": self.module, "class": self.cls} if self.cls else {}),
        }


@dataclass
class DiffReport:
    stage: str
    code_file: Path  # the stage's network.py as the user finds it
    samples: int
    tolerance: Tolerance
    tensors: list[TensorDiff]
    first: TensorDiff | None
    code: str = ""  # the culprit's source line
    onnx_nodes: list[dict] = field(default_factory=list)  # the culprit's ONNX nodes with attributes
    not_compared: list[str] = field(default_factory=list)  # tensor_map tensors not on both sides
    graph_inputs: list[str] = field(default_factory=list)
    replayed: bool = False  # the replay ran (local errors known)

    @property
    def local_bound(self) -> float:
        """The relative error past which a statement's local error makes it wrong."""
        return widen(self.tolerance.rel_error, self.tolerance.cosine, LOCAL_SHARE)[0]

    @property
    def wrong(self) -> TensorDiff | None:
        """The first node that is wrong on onnxruntime's own inputs (None if none, or no replay)."""
        return next((t for t in self.tensors if t.local_problem), None)

    @property
    def worst_local(self) -> TensorDiff | None:
        # where onnxruntime is the side off float64, the local error is its own (``reference_off``)
        known = [t for t in self.tensors if t.local is not None and not t.local.nonfinite and not t.reference_off]
        return max(known, key=lambda t: t.local.rel_error, default=None)

    @property
    def accumulated(self) -> bool:
        """Out of tolerance, yet every node computes what onnxruntime computes from the same inputs:
        the error is accumulated float32 rounding, not a wrong node."""
        return self.replayed and self.first is not None and self.wrong is None and self.worst_local is not None

    def local_summary(self) -> str:
        if not self.replayed:
            return ""
        w, worst = self.wrong, self.worst_local
        bound = self.local_bound
        if w is not None:
            return (
                f"on onnxruntime's own inputs {w.op} {w.node!r} at {self.code_file}:{w.line} is wrong: "
                f"{w.local_problem}"
            )
        off = self.reference_off
        if off:
            t = off[0]
            more = f" (and {len(off) - 1} more)" if len(off) > 1 else ""
            return (
                f"on onnxruntime's own inputs no node of the generated code is wrong: at {t.op} {t.node!r} "
                f"{t.reference_off}{more}"
            )
        where = f": worst {worst.local.rel_error:.2g}, {worst.op} {worst.node!r}" if worst else ""
        return f"on onnxruntime's own inputs every node is within {bound:g}{where} (accumulated float32 rounding)"

    @property
    def reference_off(self) -> list[TensorDiff]:
        """The statements where onnxruntime, not the generated code, is off float64."""
        return [t for t in self.tensors if t.reference_off]

    @property
    def inherited(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.ok and t is not self.first]

    def location(self) -> str:
        return f"{self.code_file}:{self.first.line}{self.first.where}" if self.first else ""

    def summary(self) -> str:
        """One sentence for failure messages."""
        if self.first is None:
            return (
                f"every tensor of the generated code is within tolerance of onnxruntime ({len(self.tensors)} compared)"
            )
        t = self.first
        local = self.local_summary()
        return f"first diverging node: {t.op} {t.node!r} at {self.location()} ({self.code.strip()}): {t.problem}" + (
            f"; {local}" if local else ""
        )

    def to_dict(self) -> dict:
        by_var = {t.tensor: t for t in self.tensors}
        first = None
        if self.first is not None:
            first = {
                **self.first.to_dict(),
                "file": str(self.code_file),
                "code": self.code.strip(),
                "onnx_nodes": self.onnx_nodes,
                "input_metrics": {
                    i: by_var[i].metrics.to_dict() for i in self.first.inputs if i in by_var and by_var[i].metrics
                },
            }
        return {
            "stage": self.stage,
            "file": str(self.code_file),
            "samples": self.samples,
            "tolerance": {"rel_error": self.tolerance.rel_error, "cosine": self.tolerance.cosine},
            "compared": len(self.tensors),
            "out_of_tolerance": sum(not t.ok for t in self.tensors),
            "first": first,
            "wrong": self.wrong.to_dict() if self.wrong else None,
            "accumulated": self.accumulated,
            "local_bound": self.local_bound if self.replayed else None,
            "summary": self.summary(),
            "not_compared": self.not_compared,
            "tensors": [t.to_dict() for t in self.tensors],
        }
