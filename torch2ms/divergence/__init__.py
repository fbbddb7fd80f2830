"""Divergence localization: the first node where a generated network leaves onnxruntime.

Both sides run the stage's sample inputs (``export/reference.npz``) with every intermediate
tensor exposed. onnxruntime runs a copy of ``model.onnx`` whose graph outputs are the tensors
the generated code computes (``graph.load.session_with_outputs``), configured as the export
stage's check runs it (``graph.onnxrt.REFERENCE``: one reference, one configuration). MindSpore runs the stage's
``network.py`` in PyNative mode from a *probe* variant of its source, made at load time: the
``return`` of ``construct`` is replaced by one returning every variable ``tensor_map.json``
names. Only that line differs, and the probe is compiled under the file's own path, so line
numbers and tracebacks are those of the shipped ``network.py``, which stays as it is.

Tensors present on both sides are compared in the code's order (topological) with the metrics
of ``torch2ms.compare``: ``rel_error = max|a - r| / max|r|`` and cosine, over all samples. The
culprit is the first statement whose output leaves the tolerance while every input it reads is
within it; the errors after it are inherited. After folding, a BatchNorm's output tensor is
computed by the conv statement: ``tensor_map`` says which ONNX tensor each statement produces,
so the comparison needs no knowledge of the passes. Samples are run one at a time and the
metrics accumulated as each statement computes (``_Stream``), so memory holds onnxruntime's
intermediates of one sample and the network's live tensors, not every computed value.

**Replay: is a node wrong, or is the error accumulated?** A deep random network can leave the
tolerance with every op correct: each adds ~1e-6 of float32 rounding and depth amplifies it. So
the probe runs a second time with every compared variable replaced, right after its statement,
by onnxruntime's value of the same tensor (``replay_tree``): each statement then computes from
onnxruntime's own inputs, and its *local* error is what that statement alone does wrong. A node
whose local error exceeds ``LOCAL_SHARE`` of the tolerance is wrong (``DiffReport.wrong``); when
none is, the stage's error is accumulated rounding (``DiffReport.accumulated``), which the runner
may accept (``pipeline.runner``). haloregnetz_b: the end-to-end error crosses 1e-4 at a
BatchNormalization whose input already sat at 6.8e-5, while no node's local error exceeds 1.2e-6.
"""

from torch2ms.divergence.localize import localize
from torch2ms.divergence.probe import (
    _CellHook,
    _Stream,
    load_class_probe,
    load_probe,
    probe_source,
    statement_lines,
)
from torch2ms.divergence.references import _node_reads, _References, _segment_model
from torch2ms.divergence.render import render_markdown, render_text, write_diff
from torch2ms.divergence.report import LOCAL_SHARE, DiffReport, TensorDiff, _Accumulator

__all__ = [
    "LOCAL_SHARE",
    "DiffReport",
    "TensorDiff",
    "localize",
    "load_probe",
    "load_class_probe",
    "probe_source",
    "statement_lines",
    "render_markdown",
    "render_text",
    "write_diff",
    "_Accumulator",
    "_CellHook",
    "_References",
    "_Stream",
    "_node_reads",
    "_segment_model",
]
