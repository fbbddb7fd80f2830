"""``model.onnx`` run in float64: the export stage's evidence past ``check.ceiling``.

On an ill-conditioned network two correct float32 implementations drift apart by more than the
ceiling, so onnxruntime against PyTorch in float32 cannot tell drift from a wrong graph. In float64
the drift shrinks by ~1e9 while a wrong node does not, so the exported graph run in float64
against the PyTorch model in float64 decides it (``export.verdict.for_export``).

onnxruntime's CPU provider has no float64 Conv ("Could not find an implementation for Conv(11)"),
so the float64 graph runs on onnx's own reference evaluator (``onnx.reference``: numpy, every
standard op, seconds for a detector-sized graph). The graph is widened first: float32
initializers, inputs, outputs, value infos, ``Cast(to=FLOAT)`` and float constants become float64.

A right graph then differs from PyTorch in float64 only by what ONNX stores in float32 on purpose:
a float attribute or scalar constant (BatchNorm's epsilon 1e-3 is 1.0000000475e-3, HardSigmoid's
alpha 1/6 is 0.16666667163, an attention scale 1/sqrt(32) is 0.17677669) takes back the number it
was rounded from (``exact``), and HardSwish, which the evaluator would expand through a
float32 ``alpha=1/6``, runs as its definition, ``x * clip(x / 6 + 1/2, 0, 1)`` (and GatherElements
as ``take_along_axis``: the evaluator's takes at most 32 positions under numpy 1; GridSample on
PyTorch's float64 kernel with the node's own attributes: the evaluator's loops over every point
and knows only opset 20's mode names). Measured in the
zoos (float32 onnxruntime vs PyTorch → float64 graph vs PyTorch): LeViT-192 1.6e-2 → 4.6e-11
(4.3e-3 with the float32 constants), yolo12n 2.9e-3 → 3.0e-12 (1.1e-5), yolov9t 6.2e-3 → 6.6e-12
(7.1e-5). A non-scalar constant the exporter computed in float32 (a folded table) cannot be taken
back; a model whose outputs hang on one may find its export held wrong at 1e-5.
"""

from __future__ import annotations

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

EVALUATOR = "onnx.reference.ReferenceEvaluator"


def widen(model):
    """A copy of ``model`` (ModelProto) with every float32 tensor, type and cast in float64."""
    import onnx

    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    _widen_graph(wide.graph)
    return wide


def _widen_graph(graph) -> None:
    from onnx import AttributeProto, TensorProto

    for t in graph.initializer:
        _widen_tensor(t)
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                _widen_tensor(a.t)
            elif a.type == AttributeProto.GRAPH:
                _widen_graph(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    _widen_graph(g)
            elif a.name in ("to", "dtype") and a.type == AttributeProto.INT and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE  # Cast, EyeLike, RandomNormal...: float32 results become float64

        if node.op_type == "Constant":
            _widen_constant(node)


def exact(value: float) -> float:
    """The number a float32 scalar was most likely rounded from: the simplest of p/q, sqrt(p/q) and
    (p/q)^(1/4) (denominators up to 1000: 1/6, 2/3, 1/sqrt(32), an attention scale split over q and
    k) or else the shortest decimal (1e-3, 0.2) that rounds to the same float32. Any choice is
    within float32's half-ulp of the stored value; this one is what the model meant."""
    from fractions import Fraction

    stored = np.float32(value)
    if not np.isfinite(stored) or stored == 0:
        return float(stored)
    decimal = float(np.format_float_positional(stored, unique=True, trim="-"))
    if len(np.format_float_scientific(stored, unique=True).split("e")[0].strip("-").replace(".", "")) < 7:
        return decimal  # a short decimal (1e-3, 0.044715) is what was written
    x, sign = abs(float(stored)), np.sign(float(stored))
    for power in (1, 2, 4):
        ratio = Fraction(x**power).limit_denominator(1000)
        candidate = float(sign * float(ratio) ** (1 / power))
        if ratio and np.float32(candidate) == stored:
            return candidate
    return decimal


def _widen_tensor(t) -> None:
    """A float32 tensor in float64; a scalar one (a scale, an epsilon) as the number it stands for."""
    from onnx import TensorProto, numpy_helper

    if t.data_type == TensorProto.FLOAT:
        wide = numpy_helper.to_array(t).astype(np.float64)
        if wide.size == 1:
            wide = np.full(wide.shape, exact(float(wide.reshape(-1)[0])))
        t.CopyFrom(numpy_helper.from_array(wide, t.name))


def _widen_constant(node) -> None:
    """``Constant(value_float[s]=...)`` makes float32 by definition: rewritten as a float64 ``value``."""
    from onnx import helper, numpy_helper

    for i, a in enumerate(node.attribute):
        if a.name in ("value_float", "value_floats"):
            value = np.array(a.f if a.name == "value_float" else list(a.floats), dtype=np.float64)
            del node.attribute[i]
            node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
            return


def run(onnx_path, samples: list[dict[str, np.ndarray]], names: list[str]) -> list[dict[str, np.ndarray]]:
    """``model.onnx`` widened to float64 on ``samples`` (float inputs widened, token ids and masks as
    they are): per sample, output name -> float64 array, for the outputs ``names``. One evaluator
    for all of them."""
    import onnx

    evaluator = wide_evaluator(onnx.load(str(onnx_path)))
    return [evaluate(evaluator, sample, names) for sample in samples]


def wide_evaluator(model) -> ReferenceEvaluator:
    """The evaluator of ``model`` (ModelProto) widened to float64, its float attributes taken back
    to the numbers they were rounded from (``exact``)."""
    evaluator = ReferenceEvaluator(widen(model), new_ops=list(OPS))
    for node in evaluator.rt_nodes_:  # float attributes, given or schema defaults: float32 in the proto
        for name, value in list(vars(node).items()):
            if isinstance(value, (float, np.floating)) and not name.startswith("_"):
                setattr(node, name, exact(float(value)))
    return evaluator


def evaluate(evaluator: ReferenceEvaluator, sample: dict[str, np.ndarray], names: list[str]) -> dict:
    """One sample through a ``wide_evaluator``: float inputs widened, the others as they are."""
    feed = {n: (v.astype(np.float64) if v.dtype.kind == "f" else v) for n, v in sample.items()}
    return dict(zip(names, (np.asarray(v) for v in _run(evaluator, names, feed))))


def _run(evaluator: ReferenceEvaluator, names: list[str], feed: dict) -> list:
    """``evaluator.run(names, feed)`` that drops each value after its last reader: the evaluator's
    own loop keeps every intermediate to the end, in float64 twice float32's size (RT-DETR at
    640²: the export stage's peak). A graph with a node that reads the enclosing scope (If, Loop,
    Scan) or with shape annotations to check runs as the evaluator runs it."""
    nodes = evaluator.rt_nodes_
    if evaluator.check_shape_annotations_ or any(n.need_context() for n in nodes):
        return evaluator.run(names, feed)
    last = {i: k for k, n in enumerate(nodes) for i in n.input}
    keep = set(names) | set(evaluator.rt_inits_)
    results = {"": None, **evaluator.rt_inits_, **feed}
    for k, node in enumerate(nodes):
        outputs = node.run(*[results[i] for i in node.input])
        for name, value in zip(node.output, outputs, strict=False):
            if name in last or name in keep:
                results[name] = value
        for i in node.input:
            if last[i] == k and i not in keep:
                results.pop(i, None)
    missing = [n for n in names if n not in results]
    if missing:
        raise RuntimeError(f"the float64 run computed no value for {missing}")
    return [results[n] for n in names]


class HardSwish(OpRun):
    """HardSwish as ONNX defines it (``x * max(0, min(1, x / 6 + 0.5))``), exact in float64 (the
    evaluator's expansion takes its function body's float32 ``alpha``)."""

    op_domain = ""

    def _run(self, x):
        return (x * np.clip(x / 6 + 0.5, 0, 1),)


class GatherElements(OpRun):
    """GatherElements as ONNX defines it, on any axis length (the evaluator's ``np.choose`` takes at
    most 32 choices under numpy 1: RT-DETR gathers 300 of 8400 queries)."""

    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = (axis or 0) % data.ndim
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


GRID_MODES = {
    "linear": "bilinear",
    "bilinear": "bilinear",
    "cubic": "bicubic",
    "bicubic": "bicubic",
    "nearest": "nearest",
}


class GridSample(OpRun):
    """GridSample (opset 16 and 20 mode names) on ``torch.nn.functional.grid_sample`` in float64 with
    the node's own mode, padding and corner alignment: the ONNX op was defined as that function, and
    the evaluator's own implementation loops over every sampled point in Python."""

    op_domain = ""

    def _run(self, x, grid, align_corners=None, mode=None, padding_mode=None):
        import torch

        mode = mode.decode() if isinstance(mode, bytes) else (mode or "linear")
        padding = padding_mode.decode() if isinstance(padding_mode, bytes) else (padding_mode or "zeros")
        out = torch.nn.functional.grid_sample(
            torch.from_numpy(np.ascontiguousarray(x)),
            torch.from_numpy(np.ascontiguousarray(grid)),
            mode=GRID_MODES[mode],
            padding_mode=padding,
            align_corners=bool(align_corners),
        )
        return (out.numpy(),)


class BatchNormalization(OpRun):
    """BatchNormalization in inference mode, ``(x - mean) / sqrt(var + epsilon) * scale + bias``, at
    every opset. The ONNX operator page (BatchNormalization-9, "Output case #2: Y (test mode)")
    makes a node with one output the inference form; the evaluator's versions 6 and 9 instead take
    a ``momentum`` attribute, which exporters write in any mode, as training mode and normalise by
    the batch's own statistics. A training-mode node (more than one output) is refused."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, spatial=None):
        if len(self.output) > 1 or training_mode:
            raise RuntimeError(f"BatchNormalization {self.onnx_node.name!r} is in training mode")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        eps = 1e-5 if epsilon is None else epsilon
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
        return (y.astype(x.dtype),)


# the evaluator's ops replaced for the float64 run
OPS = (HardSwish, GatherElements, GridSample, BatchNormalization)
