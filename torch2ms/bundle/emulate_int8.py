"""The INT8 emulator: the Cube ops (Conv, ConvTranspose, MatMul, Gemm) of the exported ONNX as a QDQ
graph in onnxruntime, each switchable between int8 and float, and the activation statistics that
calibrate it. Symmetric int8 weights per output channel (or per tensor), asymmetric int8
activations per tensor from a calibration (``Calibrator``), float accumulation. The INT8 plan
(``int8.py``) uses it; ``emulate.py`` holds the fp16 emulator and what both share.

**Independent of the CPU.** onnxruntime fuses QDQ into integer kernels (``QLinearConv``, ``QGemm``,
``MatMulInteger``) above ``ORT_ENABLE_BASIC``, and its uint8 x int8 kernels saturate on CPUs without
VNNI (``graph/onnxrt.py``). The emulator runs as its EMULATION purpose, every graph optimization off, on one thread:
``QuantizeLinear`` / ``DequantizeLinear`` stay separate float32 nodes (a division, a round half to
even, a clip, a multiplication: IEEE operations whose result does not depend on the vector width),
the convolution runs on the dequantized values in float, and weights are fake-quantized once in numpy.

Fake quantization, int8 (``q`` in [-128, 127], weights in [-127, 127], symmetric)::

    weights:     s_c = max|W_c| / 127            W' = clip(rint(W / s_c), -127, 127) * s_c
    activations: s = (hi - lo) / 255, z = clip(rint(-128 - lo / s), -128, 127)
                 x' = (clip(rint(x / s) + z, -128, 127) - z) * s      [lo, hi] widened to hold 0

``rint`` rounds half to even (ONNX QuantizeLinear). The bias stays float: on the board it is int32 at
scale ``s * s_c``, an error far below one activation step.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

import numpy as np

from torch2ms.bundle.emulate import run_samples
from torch2ms.graph.onnxrt import EMULATION, session

CUBE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
QMIN, QMAX = -128, 127
WMAX = 127  # symmetric weights: [-127, 127], so that -w quantizes to -q


def weight_scales(w: np.ndarray, axis: int | None) -> np.ndarray:
    """Symmetric int8 scales, ``max|W| / 127`` per slice along ``axis`` (per tensor when None);
    an all-zero slice gets scale 1 (its values quantize to 0 either way)."""
    a = np.abs(w.astype(np.float32))
    if axis is None:
        m = np.asarray(a.max(initial=0.0), np.float32)
    else:
        m = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1).max(1, initial=0.0)
    return np.where(m > 0, m / np.float32(WMAX), np.float32(1)).astype(np.float32)


def fake_quant_weight(w: np.ndarray, axis: int | None) -> np.ndarray:
    """``clip(rint(W / s), -127, 127) * s`` in float32, ``s`` from ``weight_scales``."""
    s = weight_scales(w, axis)
    if axis is not None:
        shape = [1] * w.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    return (np.clip(np.rint(w.astype(np.float32) / s), -WMAX, WMAX) * s).astype(np.float32)


def activation_qparams(lo: float, hi: float) -> tuple[np.float32, np.int8]:
    """Asymmetric int8 (scale, zero point) for the range [lo, hi], widened to hold 0 (a zero-padded
    convolution must see exact zeros), as AMCT's ``activation_offset: true`` does."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo <= 0 or not np.isfinite(hi - lo):
        return np.float32(1.0), np.int8(0)
    scale = np.float32((hi - lo) / (QMAX - QMIN))
    zero = int(np.clip(np.rint(QMIN - lo / float(scale)), QMIN, QMAX))
    return scale, np.int8(zero)


def fake_quant_activation(x: np.ndarray, scale, zero) -> np.ndarray:
    """The numpy reference of QuantizeLinear -> DequantizeLinear (int8, per tensor)."""
    q = np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + np.float32(zero), QMIN, QMAX)
    return ((q - np.float32(zero)) * np.float32(scale)).astype(np.float32)


class CubeNode:
    """One quantizable node: where its activations and its weight are, and the weight's channel axis."""

    def __init__(self, index: int, node, activations: list[int], weight: int | None, axis: int | None):
        self.index, self.node = index, node
        self.name, self.op_type = node.name, node.op_type
        self.activations = activations  # input positions quantized per tensor from the calibration
        self.weight = weight  # input position of a constant weight (per channel), or None
        self.axis = axis


def cube_nodes(model, constants: dict[str, np.ndarray], per_channel: bool = True) -> list[CubeNode]:
    """The Cube ops of ``model`` in graph order. A constant second input is the weight (per output
    channel: Conv axis 0, ConvTranspose axis 1 at group 1, Gemm axis 0 with transB else 1, MatMul the
    last axis); every other float input is an activation, quantized per tensor."""
    from onnx import helper

    found = []
    for index, n in enumerate(model.graph.node):
        if n.op_type not in CUBE_OPS or n.domain not in ("", "ai.onnx"):
            continue
        if all(x in constants for x in n.input[:2]):
            continue  # a product of constants: folded at compile time, not run
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        w = n.input[1] if len(n.input) > 1 else ""
        weight = 1 if w in constants and constants[w].ndim >= 2 else None
        axis = None
        if weight is not None and per_channel:
            if n.op_type == "Conv":
                axis = 0
            elif n.op_type == "ConvTranspose":
                axis = 1 if attrs.get("group", 1) == 1 else None
            elif n.op_type == "Gemm":
                axis = 0 if attrs.get("transB", 0) else 1
            else:
                axis = constants[w].ndim - 1
        activations = [0] + ([1] if weight is None and n.op_type in ("MatMul", "Gemm") else [])
        activations = [k for k in activations if n.input[k] not in constants]
        if n.op_type == "Gemm" and attrs.get("transA", 0):
            activations = [k for k in activations if k != 0]  # AMCT: transA must be 0; keep it float
        found.append(CubeNode(index, n, activations, weight, axis))
    return found


def constant_values(model) -> dict[str, np.ndarray]:
    """Float initializers and Constant-node outputs by name."""
    from onnx import TensorProto, numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def calibration_tensors(onnx_path: Path, per_channel: bool = True) -> list[str]:
    """The activation tensors the int8 emulation quantizes (the Cube ops' float inputs), in graph order."""
    import onnx

    m = onnx.load(str(onnx_path))
    names: list[str] = []
    for c in cube_nodes(m, constant_values(m), per_channel):
        names += [c.node.input[k] for k in c.activations if c.node.input[k] not in names]
    return names


class Calibrator:
    """Activation statistics of ``tensors`` over calibration samples: min / max (pass 1) and a
    histogram of ``|x|`` over [0, max|x|] in ``BINS`` bins (pass 2, for percentile and entropy)."""

    BINS = 2048

    def __init__(self, onnx_path: Path, tensors: list[str]):
        import onnx
        from onnx import helper

        m = onnx.load(str(onnx_path))
        outputs = {o.name for o in m.graph.output}
        inferred = onnx.shape_inference.infer_shapes(m)
        types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
        for t in tensors:
            if t not in outputs:
                m.graph.output.append(
                    helper.make_value_info(t, types[t]) if t in types else helper.make_empty_tensor_value_info(t)
                )
        self.tensors = tensors
        self.session = session(m, EMULATION)
        self.lo = {t: np.inf for t in tensors}
        self.hi = {t: -np.inf for t in tensors}
        self.hist: dict[str, np.ndarray] = {}
        self.samples = 0

    def _run(self, sample: dict) -> dict[str, np.ndarray]:
        return dict(zip(self.tensors, self.session.run(self.tensors, sample)))

    def observe(self, samples: Iterable[dict], histograms: bool) -> None:
        samples = list(samples)
        for s in samples:
            for t, v in self._run(s).items():
                self.lo[t] = min(self.lo[t], float(v.min(initial=np.inf)))
                self.hi[t] = max(self.hi[t], float(v.max(initial=-np.inf)))
        self.samples = len(samples)
        if not histograms:
            return
        for s in samples:
            for t, v in self._run(s).items():
                top = max(abs(self.lo[t]), abs(self.hi[t])) or 1.0
                h, _ = np.histogram(np.abs(v), bins=self.BINS, range=(0.0, top))
                self.hist[t] = self.hist.get(t, 0) + h

    def ranges(self, method: str, percentile: float = 99.99) -> dict[str, tuple[float, float]]:
        """Per tensor [lo, hi]: the observed extremes (minmax), or clipped at a threshold on |x|
        (percentile of |x|, or the KL-divergence threshold of TensorRT's entropy calibration)."""
        out = {}
        for t in self.tensors:
            lo, hi = self.lo[t], self.hi[t]
            if method != "minmax" and t in self.hist:
                top = max(abs(lo), abs(hi))
                width = top / self.BINS
                cut = percentile_bin(self.hist[t], percentile) if method == "percentile" else kl_bin(self.hist[t])
                threshold = cut * width
                lo, hi = max(lo, -threshold), min(hi, threshold)
            out[t] = (float(lo), float(hi))
        return out


def percentile_bin(hist: np.ndarray, percentile: float) -> int:
    """The number of leading bins holding ``percentile`` % of the values."""
    total = hist.sum()
    if total == 0:
        return len(hist)
    return int(np.searchsorted(np.cumsum(hist), total * percentile / 100.0) + 1)


def kl_bin(hist: np.ndarray, levels: int = 128, step: int = 8) -> int:
    """TensorRT's entropy calibration on a histogram of |x|: the number of leading bins ``i`` whose
    clipped distribution P (outliers added to the last bin) has the least KL divergence from Q, P
    merged into ``levels`` int8 levels and spread back over the non-empty bins. ``i`` goes in steps
    of ``step`` bins."""
    hist = hist.astype(np.float64)
    n = len(hist)
    if hist.sum() == 0 or n <= levels:
        return n
    best, best_kl = n, np.inf
    for i in range(levels, n + 1, step):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        edges = np.linspace(0, i, levels + 1).astype(int)
        nonzero = (hist[:i] > 0).astype(np.float64)
        sums = np.add.reduceat(hist[:i], edges[:-1])
        counts = np.add.reduceat(nonzero, edges[:-1])
        per = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
        q = np.repeat(per, np.diff(edges)) * nonzero
        ps, qs = p.sum(), q.sum()
        if qs == 0:
            continue
        p, q = p / ps, q / qs
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    return best


class Int8Emulator:
    """The ONNX in onnxruntime with the Cube ops switchable between int8 (QDQ) and float.

    A node in int8 reads its activation inputs through ``QuantizeLinear -> DequantizeLinear`` with
    the calibrated per-tensor (scale, zero point) and its weight fake-quantized per output channel
    (precomputed in numpy); a node kept in float reads them as they are. Every choice is
    ``Where(flag_i, qdq(x), x)`` with ``flag_i`` element ``i`` of one boolean graph input, so one
    session serves every plan. ``ranges`` maps each activation tensor to its calibrated [lo, hi].
    """

    FLAGS = "__t2ms_int8_flags"

    def __init__(
        self,
        onnx_path: Path,
        inputs: list[dict],
        output_names: list[str],
        ranges: dict[str, tuple[float, float]],
        per_channel: bool = True,
    ):
        import onnx
        from onnx import TensorProto, helper

        m = onnx.load(str(onnx_path))
        constants = constant_values(m)
        cubes = cube_nodes(m, constants, per_channel)
        self.inputs, self.output_names = inputs, output_names
        self.names = [c.name for c in cubes]
        self.op_types = [c.op_type for c in cubes]
        self.labels = [c.name or f"<{c.op_type} #{c.index}>" for c in cubes]
        self.macs = [0] * len(cubes)
        self.qparams: dict[str, tuple[float, int]] = {}  # activation tensor -> (scale, zero point)
        self.activations = [[c.node.input[k] for k in c.activations] for c in cubes]  # per node, its quantized inputs
        self.axes = [c.axis for c in cubes]
        shapes = _cube_shapes(m, cubes, onnx_path, inputs)
        nodes, extra_inits = self._switchable_int8(m, cubes, constants, ranges, shapes)
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        m.graph.initializer.extend(extra_inits)
        m.graph.input.append(helper.make_tensor_value_info(self.FLAGS, TensorProto.BOOL, [len(self.names)]))
        self.session = session(m, EMULATION)
        self.runs = 0

    def _switchable_int8(self, m, cubes, constants, ranges, shapes) -> tuple[list, list]:
        """The graph's nodes with each Cube node's activations (QDQ) and weight (fake-quantized)
        behind ``Where(flag_i, int8, float)``; returns (nodes, extra initializers)."""
        from onnx import helper, numpy_helper

        by_index = {c.index: (i, c) for i, c in enumerate(cubes)}
        extra_inits, nodes, qdq = [], [], {}

        def qdq_of(x: str) -> str:
            if x not in qdq:
                lo, hi = ranges[x]
                scale, zero = activation_qparams(lo, hi)
                self.qparams[x] = (float(scale), int(zero))
                s, z, q, out = (f"{x}__q8s", f"{x}__q8z", f"{x}__q8", f"{x}__dq8")
                extra_inits.extend(
                    [
                        numpy_helper.from_array(np.asarray(scale, np.float32), s),
                        numpy_helper.from_array(np.asarray(zero, np.int8), z),
                    ]
                )
                nodes.append(helper.make_node("QuantizeLinear", [x, s, z], [q]))
                nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [out]))
                qdq[x] = out
            return qdq[x]

        for index, n in enumerate(m.graph.node):
            if index not in by_index:
                nodes.append(n)
                continue
            i, c = by_index[index]
            self.macs[i] = node_macs(n, shapes)
            flag = f"__t2ms_q8flag{i}"
            nodes.append(helper.make_node("Constant", [], [f"{flag}__idx"], value_int=i))
            nodes.append(helper.make_node("Gather", [self.FLAGS, f"{flag}__idx"], [flag]))
            for k in c.activations:
                x = n.input[k]
                sel = f"{x}__in8_{i}_{k}"
                nodes.append(helper.make_node("Where", [flag, qdq_of(x), x], [sel]))
                n.input[k] = sel
            if c.weight is not None:
                w = n.input[c.weight]
                fq = f"{w}__fq8_{i}"
                extra_inits.append(numpy_helper.from_array(fake_quant_weight(constants[w], c.axis), fq))
                sel = f"{w}__w8_{i}"
                nodes.append(helper.make_node("Where", [flag, fq, w], [sel]))
                n.input[c.weight] = sel
            nodes.append(n)
        return nodes, extra_inits

    def flags(self, int8: Collection[int]) -> np.ndarray:
        f = np.zeros(len(self.names), bool)
        f[list(int8)] = True
        return f

    def run(self, int8: Collection[int] | None = None, samples: int | None = None) -> list[dict[str, np.ndarray]]:
        """Outputs per sample (the first ``samples``) with the nodes ``int8`` (indices into ``names``;
        default: every one) in int8 and the others in float."""
        flags = self.flags(range(len(self.names)) if int8 is None else int8)
        self.runs += 1
        return run_samples(self.session, self.output_names, self.inputs[:samples], {self.FLAGS: flags})


def _cube_shapes(m, cubes, onnx_path: Path, inputs: list[dict]) -> dict[str, tuple[int, ...]]:
    """Static shapes of the graph's tensors, the Cube nodes' inputs and outputs included: shape
    inference stops at data-dependent sizes (Resize to a Shape), those are measured on one sample."""
    shapes = _shapes(m)
    unknown = sorted({t for c in cubes for t in (*c.node.input[:2], c.node.output[0]) if t and t not in shapes})
    if unknown and inputs:
        shapes.update(_run_shapes(onnx_path, unknown, inputs[0]))
    return shapes


def _shapes(model) -> dict[str, tuple[int, ...]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    out = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.dim_value > 0 for d in dims):
            out[v.name] = tuple(d.dim_value for d in dims)
    for t in model.graph.initializer:
        out[t.name] = tuple(t.dims)
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = tuple(a.t.dims)
    return out


def _run_shapes(onnx_path: Path, tensors: list[str], sample: dict) -> dict[str, tuple[int, ...]]:
    import onnx
    from onnx import helper

    m = onnx.load(str(onnx_path))
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in tensors if t not in have)
    got = session(m, EMULATION).run(tensors, sample)
    return {t: tuple(v.shape) for t, v in zip(tensors, got)}


def node_macs(node, shapes: dict[str, tuple[int, ...]]) -> int:
    """Multiply-accumulates of one Cube node from its static shapes (0 where a shape is unknown):
    Conv: output elements x (C_in / group) x kernel; ConvTranspose: input elements x (C_out / group)
    x kernel; MatMul: output elements x K; Gemm: M x N x K."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, w, y = (shapes.get(node.input[0]), shapes.get(node.input[1]), shapes.get(node.output[0]))
    if x is None or w is None:
        return 0
    if node.op_type == "Conv" and y is not None:
        return int(np.prod(y)) * int(np.prod(w[1:]))
    if node.op_type == "ConvTranspose":
        return int(np.prod(x)) * int(np.prod(w[1:]))
    if node.op_type == "MatMul" and y is not None:
        return int(np.prod(y)) * int(x[-1])
    if node.op_type == "Gemm":
        k = x[0] if attrs.get("transA", 0) else x[-1]
        n = w[0] if attrs.get("transB", 0) else w[-1]
        m = x[-1] if attrs.get("transA", 0) else x[0]
        return int(m) * int(n) * int(k)
    return 0
