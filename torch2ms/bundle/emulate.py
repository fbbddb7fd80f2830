"""The fp16 emulator and what the emulators share: the exported ONNX in onnxruntime with a lower
precision switchable per node, so that a plan (which layers stay in float) can be measured here
before the board sees it.

* ``Fp16Emulator``: fp16 rounding of a node's inputs, weights and outputs, fp32 accumulation (the
  cube unit's). The fp16 plan (``fp16.py``) and the fp16 error budget (``compat.py``) use it.
* ``emulate_int8.Int8Emulator``: the Cube ops as a QDQ graph, for the INT8 plan (``int8.py``).

Both run as onnxruntime's EMULATION purpose (``graph/onnxrt.py``), every graph optimization off,
on one thread, so that their figures do not depend on the CPU; ``run_samples`` runs the samples
side by side.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np

from torch2ms.compare import compare_arrays
from torch2ms.graph.onnxrt import EMULATION, session

# Inputs that hold sizes, not data: the board computes them at compile time, never in fp16.
SHAPE_INPUTS = {"Resize": (1, 2, 3), "Upsample": (1,)}


class Fp16Emulator:
    """The ONNX in onnxruntime with fp16 rounding switchable per node.

    A node "in fp16" rounds each float input (weights, activations, graph inputs) and each float
    output to fp16; a node kept in fp32 sees its inputs as they arrive (rounded already when their
    producer ran in fp16) and writes exact fp32 outputs, as ATC's ``--keep_dtype`` keeps a node's
    original dtype. Accumulation stays fp32 either way (the cube unit's). Every rounding is
    ``Where(flag_i, Cast(Cast(x, fp16), fp32), x)`` with ``flag_i`` element ``i`` of one boolean
    graph input, so one session serves every choice of fp32 nodes; initializers get their rounded
    copy precomputed. Candidates are the nodes with a float output, Constant nodes excepted (their
    value is rounded by the consumer, like a weight).
    """

    FLAGS = "__t2ms_fp16_flags"

    def __init__(self, onnx_path: Path, inputs: list[dict], output_names: list[str]):
        import onnx
        from onnx import TensorProto, helper

        m = onnx.load(str(onnx_path))
        self.inputs, self.output_names = inputs, output_names
        self.names: list[str] = []  # candidate nodes' ONNX names ('' when unnamed), graph order
        self.op_types: list[str] = []
        self.labels: list[str] = []  # unique label per candidate: the name, or '<op #index>'
        nodes, extra_inits = self._switchable_fp16(m)
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        m.graph.initializer.extend(extra_inits)
        m.graph.input.append(helper.make_tensor_value_info(self.FLAGS, TensorProto.BOOL, [len(self.names)]))
        self.session = session(m, EMULATION)  # no optimization keeps the rounding casts
        self.runs = 0

    def _switchable_fp16(self, m) -> tuple[list, list]:
        """The graph's nodes with each candidate's float inputs and outputs behind
        ``Where(flag_i, rounded, exact)``; returns (nodes, extra initializers: rounded weights)."""
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        inferred = onnx.shape_inference.infer_shapes(m)
        floats = {
            v.name
            for v in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
            if v.type.tensor_type.elem_type == TensorProto.FLOAT
        }
        inits = {t.name: t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT}
        floats |= set(inits)
        rounded: dict[str, str] = {}
        extra_inits = []
        nodes = []

        def round_of(value: str) -> str:
            if value not in rounded:
                rounded[value] = f"{value}__r16"
                if value in inits:
                    arr = numpy_helper.to_array(inits[value]).astype(np.float16).astype(np.float32)
                    extra_inits.append(numpy_helper.from_array(arr, rounded[value]))
                else:
                    nodes.extend(_round_nodes(value, rounded[value]))
            return rounded[value]

        for index, n in enumerate(m.graph.node):
            outs = [o for o in n.output if o in floats]
            if n.op_type == "Constant" or not outs:
                nodes.append(n)
                continue
            i = len(self.names)
            self.names.append(n.name)
            self.op_types.append(n.op_type)
            self.labels.append(n.name or f"<{n.op_type} #{index}>")
            flag = f"__t2ms_flag{i}"
            nodes.append(helper.make_node("Constant", [], [f"{flag}__idx"], value_int=i))
            nodes.append(helper.make_node("Gather", [self.FLAGS, f"{flag}__idx"], [flag]))
            skip = SHAPE_INPUTS.get(n.op_type, ())
            for k, x in enumerate(n.input):
                if x and x in floats and k not in skip:
                    sel = f"{x}__in{i}_{k}"
                    nodes.append(helper.make_node("Where", [flag, round_of(x), x], [sel]))
                    n.input[k] = sel
            post = []
            for k, o in enumerate(n.output):
                if o in floats:
                    raw = f"{o}__fp32"
                    n.output[k] = raw
                    post += _round_nodes(raw, f"{raw}__r16")
                    post.append(helper.make_node("Where", [flag, f"{raw}__r16", raw], [o]))
            nodes += [n, *post]
        return nodes, extra_inits

    def flags(self, fp32: Collection[int] = (), only: int | None = None) -> np.ndarray:
        """Per candidate: True (fp16) unless in ``fp32``; with ``only``, that one node alone in fp16."""
        if only is not None:
            f = np.zeros(len(self.names), bool)
            f[only] = True
            return f
        f = np.ones(len(self.names), bool)
        f[list(fp32)] = False
        return f

    def run(
        self, fp32: Collection[int] = (), only: int | None = None, samples: int | None = None
    ) -> list[dict[str, np.ndarray]]:
        """Outputs per sample (the first ``samples`` of them) with every candidate in fp16 except
        ``fp32`` (indices into ``names``)."""
        self.runs += 1
        return run_samples(self.session, self.output_names, self.inputs[:samples], {self.FLAGS: self.flags(fp32, only)})


def run_samples(sess, names: list[str], samples: list[dict], extra: dict) -> list[dict[str, np.ndarray]]:
    """``sess`` on each sample (plus the ``extra`` feeds), outputs per sample in order. The samples
    run side by side, one per core of the thread budget (``runtime.threads``): each run is the
    one-thread run it was (so its bits are), and onnxruntime lets go of the GIL while it runs
    (benchmarks/results/design_measurements.md, "The emulators' samples")."""
    from concurrent.futures import ThreadPoolExecutor

    from torch2ms.runtime.threads import cores

    def one(sample: dict) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(names, {**sample, **extra})))

    workers = min(len(samples), cores())
    if workers <= 1:
        return [one(s) for s in samples]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, samples))


def _round_nodes(value: str, out: str) -> list:
    """``out = float32(float16(value))``: round to nearest fp16 (overflow to inf, as fp16 does)."""
    from onnx import TensorProto, helper

    return [
        helper.make_node("Cast", [value], [f"{out}__h"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", [f"{out}__h"], [out], to=TensorProto.FLOAT),
    ]


def emulation_metrics(got: list[dict], reference: list[dict]) -> dict:
    """Per output: rel error, max abs, cosine, argmax agreement of emulated outputs vs PyTorch's."""
    metrics = {}
    for name in reference[0]:
        a = np.stack([g[name] for g in got])
        r = np.stack([s[name] for s in reference])
        mt = compare_arrays(name, a.reshape(-1, *a.shape[2:]), r.reshape(-1, *r.shape[2:]))
        metrics[name] = {
            "rel_error": sig(mt.rel_error),
            "max_abs": sig(mt.max_abs),
            "cosine": sig(mt.cosine, 6),
            "argmax_agreement": None if mt.argmax_agreement is None else sig(mt.argmax_agreement, 5),
        }
    return metrics


def fp16_emulation(onnx_path: Path, inputs: list[dict], reference: list[dict]) -> dict:
    """Every node in fp16 (weights, inputs and every float intermediate rounded), per output metrics."""
    emu = Fp16Emulator(onnx_path, inputs, list(reference[0]))
    return emulation_metrics(emu.run(), reference)


def json_error(v) -> float:
    """A recorded error back to a number ('inf', 'nan': an fp16 overflow)."""
    return float("inf") if isinstance(v, str) else float(v)


def sig(v: float, digits: int = 3):
    """Round to a few significant digits so that the report is byte-stable across runs."""
    if v is None or not np.isfinite(v):
        return None if v is None else str(v)
    return float(f"{v:.{digits}g}")
