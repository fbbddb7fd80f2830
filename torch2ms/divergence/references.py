"""onnxruntime's side: every compared tensor of one sample, computed a segment of the graph at a
time."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


class _References(dict):
    """onnxruntime's values of one sample's compared tensors, by name, computed a segment of the
    graph at a time (``SEGMENT``). Above ``IN_MEMORY`` bytes in all they wait on disk (one ``.npy``
    each, memory-mapped when a statement reads one) while MindSpore runs both passes.

    One run returning them all held them at once (the rebuild and fold stages' peak on a detector,
    benchmarks/results/design_measurements.md), and the heap kept most of it after they went to
    disk. So each
    segment (consecutive nodes whose compared outputs make about ``SEGMENT`` bytes, by ONNX shape
    inference) runs as a model of its own, whose inputs are the values earlier segments computed
    (kept, on disk past ``IN_MEMORY``, while a later node reads them) and whose outputs are its
    compared tensors and those later nodes read. Each statement's inputs and output are still
    onnxruntime's, one computed from the other (a cut may stop a fusion across it: RT-DETR's values
    move by up to 5.6e-7 relative, a rounding). The sessions are the export's check's configuration
    (``graph.onnxrt.REFERENCE``, its policy taken from the whole graph's op types). One segment (the
    sizes fit, or shape inference knows none) is ``model`` itself with its outputs swapped, as before
    segments: no copy of its weights."""

    IN_MEMORY = 256 * 2**20
    SEGMENT = 256 * 2**20

    def __init__(self, model, names: list[str], sample: dict[str, np.ndarray]):
        super().__init__()
        self.folder = None
        self.in_memory = 0
        self.carried: dict[str, np.ndarray | Path] = dict(sample)  # values later segments read
        self._compute(model, set(names), sample)
        self.carried.clear()

    def _compute(self, model, wanted: set[str], sample) -> None:
        from torch2ms.graph import onnxrt
        from torch2ms.graph.load import session_with_outputs
        from torch2ms.runtime.memory import trim_heap

        nodes = list(model.graph.node)
        op_types = {n.op_type for n in nodes}
        reads = [_node_reads(n) for n in nodes]
        last_read = {name: i for i, r in enumerate(reads) for name in r}
        initializers = {t.name: t for t in model.graph.initializer}
        cuts = _segments(model, nodes, last_read, wanted, self.SEGMENT)
        for lo, hi in zip(cuts, cuts[1:]):
            produced = [o for n in nodes[lo:hi] for o in n.output if o]
            outputs = [o for o in dict.fromkeys(produced) if o in wanted or last_read.get(o, -1) >= hi]
            if len(cuts) == 2:  # one segment: the model itself, its weights not copied into another
                sess, feeds = session_with_outputs(model, outputs, purpose=onnxrt.REFERENCE), set(sample)
            else:
                inner = set(produced)
                feeds = {x for r in reads[lo:hi] for x in r if x not in inner and x in self.carried}
                sub = _segment_model(
                    model, nodes[lo:hi], reads[lo:hi], sorted(feeds), outputs, initializers, self.carried
                )
                sess = onnxrt.session(sub, onnxrt.REFERENCE, op_types)
                del sub
            values = sess.run(outputs, {x: self._value(self.carried[x]) for x in feeds})
            del sess
            for name, value in zip(outputs, values):
                if name in wanted:
                    self[name] = self._keep(name, value)
                if last_read.get(name, -1) >= hi:
                    self.carried[name] = self.get_raw(name) if name in wanted else self._keep(name, value)
            del values
            for name in [x for x in self.carried if last_read.get(x, -1) < hi and x not in sample]:
                del self.carried[name]  # no later node reads it (its file, if any, stays until the end)
            trim_heap()  # onnxruntime's buffers and the arrays gone to disk: back to the system

    def get_raw(self, name: str):
        return super().__getitem__(name)

    def _keep(self, name: str, value: np.ndarray):
        """``value`` as it is, or past ``IN_MEMORY`` bytes the ``.npy`` it was written to."""
        if self.in_memory + value.nbytes <= self.IN_MEMORY:
            self.in_memory += value.nbytes
            return value
        if self.folder is None:
            import tempfile

            self.folder = tempfile.TemporaryDirectory(prefix="torch2ms_replay_")
        path = Path(self.folder.name) / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.npy"
        np.save(path, value)
        return path

    @staticmethod
    def _value(value):
        return np.load(value, mmap_mode="r") if isinstance(value, Path) else value

    def __getitem__(self, name: str) -> np.ndarray:
        return self._value(super().__getitem__(name))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.clear()
        if self.folder is not None:
            self.folder.cleanup()


def _segments(model, nodes, last_read: dict[str, int], wanted: set[str], budget: int) -> list[int]:
    """Node indices cutting ``nodes`` into segments whose ``wanted`` outputs of a size ONNX shape
    inference knows (static shapes) add up to about ``budget`` bytes each: [0, ..., len(nodes)].
    Never where a sequence or optional value made before the cut is read after it."""
    from onnx import helper, shape_inference

    from torch2ms.graph.load import _without_large_initializers

    try:
        inferred = shape_inference.infer_shapes(_without_large_initializers(model), data_prop=True)
    except Exception:  # noqa: BLE001 - no sizes: one segment, as onnxruntime runs the whole graph
        return [0, len(nodes)]
    size, not_tensors = {}, set()
    for vi in inferred.graph.value_info:
        if not vi.type.HasField("tensor_type"):
            not_tensors.add(vi.name)  # a sequence or optional: no numpy feed can carry it to a segment
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if vi.name in wanted and tt.HasField("shape") and min(dims, default=0) >= 0:
            size[vi.name] = int(np.prod(dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
    del inferred
    cuts, held, open_not_tensors = [0], 0, set()
    for i, n in enumerate(nodes):
        held += sum(size.get(o, 0) for o in n.output)
        open_not_tensors = {x for x in open_not_tensors | (set(n.output) & not_tensors) if last_read.get(x, -1) > i}
        if held >= budget and i + 1 < len(nodes) and not open_not_tensors:
            cuts.append(i + 1)
            held = 0
    return cuts + [len(nodes)]


def _node_reads(node) -> set[str]:
    """The tensors a node reads: its inputs and, for If/Loop/Scan, those its subgraphs read from
    outside (a name a subgraph computes itself is never one computed outside it)."""
    import onnx

    out = {x for x in node.input if x}
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for n in g.node:
                out |= _node_reads(n)
    return out


def _segment_model(model, nodes, reads, feeds: list[str], outputs: list[str], initializers: dict, values: dict):
    """A model of ``nodes`` alone (``reads``: what each reads, ``_node_reads``): ``feeds`` as its
    inputs (their types from ``values``), the initializers they read, ``outputs`` as its outputs;
    the rest (opset, functions) as ``model``."""
    import onnx
    from onnx import helper

    sub = onnx.ModelProto()
    sub.ir_version = model.ir_version
    sub.opset_import.extend(model.opset_import)
    sub.functions.extend(model.functions)
    g = sub.graph
    g.name = model.graph.name
    g.node.extend(nodes)
    read = set().union(*reads) if reads else set()
    g.initializer.extend(initializers[x] for x in sorted(read) if x in initializers and x not in feeds)
    for x in feeds:
        v = _References._value(values[x])
        g.input.append(helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    g.output.extend(helper.ValueInfoProto(name=o) for o in outputs)
    return sub
