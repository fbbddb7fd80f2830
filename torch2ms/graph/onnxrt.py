"""Every onnxruntime session torch2ms opens, one named purpose each, and why each runs as it does.

``session(source, purpose)`` is the only place that builds ``SessionOptions`` or an
``InferenceSession`` (``tests/graph/test_onnxrt_reference.py`` greps the package for any other). A
purpose fixes the options that matter: graph optimization level, memory arena, weight prepacking,
threads and log level.

========== =============================== ============ ===== ========== ======= ===
purpose    used by                         optimization arena prepacking threads log
========== =============================== ============ ===== ========== ======= ===
REFERENCE  export's check, ``diff``,       all / basic  off   on         default 3
           conformance's oracle            (policy)
SHAPES     the loader's shape and constant none         off   off        default 4
           run (``graph.load``)
EMULATION  fp16 / int8 emulators, the      none         on    on         1       3
           calibrator (``bundle.emulate``)
BENCHMARK  ``bench``'s onnxruntime variant all          on    on         bench's 3
VALIDATE   does an exported file load      all          on    on         default 3
           (``export.exporters``)
========== =============================== ============ ===== ========== ======= ===

**REFERENCE** is what every check compares with: the export stage (onnxruntime against PyTorch,
which sets the noise floor later stages may widen to), ``diff`` and the runner's divergence
localization (the generated code's tensors against onnxruntime's), and the conformance harness's
oracle. One reference, one configuration. Its level is ``reference_policy``:

onnxruntime is a *reference* here, so what it computes must not depend on the CPU. It does in one
known place: at ``ORT_ENABLE_EXTENDED`` and above, a QDQ graph (QuantizeLinear -> DequantizeLinear
around Conv / MatMul / Gemm, as a quantization-aware PyTorch model exports) is fused into
``QLinearConv`` / ``QGemm`` / ``MatMulInteger``, and MLAS runs those with integer kernels chosen by
the instruction set. Without VNNI (an AVX2-only AMD EPYC, or ``qemu-x86_64 -cpu Haswell``), the
uint8 x int8 kernels add pairs of products into saturating 16-bit lanes, so their outputs are wrong
where a VNNI CPU's are exact (figures: benchmarks/results/design_measurements.md).

So the reference rule is: the **PyTorch model is the reference** for the export stage, and
onnxruntime, checked against it, runs a graph that holds quantization ops at ``ORT_ENABLE_BASIC``
(constant folding and redundant-node removal only, no QDQ fusion): its Q/DQ pairs then compute the
same float32 fake-quant arithmetic as PyTorch on every CPU. A graph without quantization ops runs
at onnxruntime's default level. ``reference_policy`` says which, and why, and the export stage
records it in ``stage.json`` (``extra.onnxruntime``). The reference runs a few samples inside the
converting process, so it keeps no memory arena: the arena's blocks outlive the session in the heap
(see SHAPES); an allocator changes where a tensor lives, not what is computed.

**SHAPES** runs the model once, extended to output every tensor's shape and every constant's value,
for a result read by name, where memory matters more than speed: no graph optimization (a tensor
read by name stays the tensor of that node), no arena (its blocks stay resident after the run), no
prepacked copy of the weights (MLAS keeps one per MatMul/Conv weight). Nodes run in index order
(``ExecutionOrder.PRIORITY_BASED``): the default order runs the Shape nodes the loader appends only
after the whole model, so every activation lives until the end (the peaks of both orders:
benchmarks/results/design_measurements.md). The order changes
no value, since each node reads the same inputs either way: the folded constants and inferred
shapes are identical (tests/graph/test_load_order.py). Its errors reach the user inside torch2ms's own
message, so onnxruntime logs only fatal ones.

**EMULATION** keeps every node as written: the fp16 emulator's rounding casts stay, and QDQ stays
float32 Q/DQ nodes (no integer kernels), the same on every CPU; one intra-op thread gives the same
reduction order on every run, since its report is part of a reproducible archive. Its sessions run
many times (a plan search), so the arena stays.

**BENCHMARK** measures latency as a deployment runs the model: onnxruntime's default level and
arena, intra-op threads as ``bench``'s settings say (``threads``), one inter-op thread.

**VALIDATE** only asks whether a file an exporter wrote loads in onnxruntime at its default
settings; an exporter's path that writes one that does not has failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch2ms.runtime.threads import budget

# Ops whose presence makes onnxruntime's higher optimization levels substitute integer kernels.
QUANTIZATION_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
    }
)


@dataclass(frozen=True)
class Purpose:
    """How a session of this purpose runs (see the module's table). ``optimization``: "all"
    (onnxruntime's default), "basic", "none", or "policy" (``reference_policy`` of the graph's op
    types); ``threads``: intra-op threads, None for the thread budget (``runtime.threads``) or
    else onnxruntime's default, "caller" for the caller's ``threads``."""

    name: str
    optimization: str
    arena: bool = True
    prepacking: bool = True
    threads: int | str | None = None
    log_severity: int = 3
    node_order: bool = False  # run nodes in index order (onnxruntime's PRIORITY_BASED), see SHAPES


REFERENCE = Purpose("reference", "policy", arena=False)
SHAPES = Purpose("shapes", "none", arena=False, prepacking=False, log_severity=4, node_order=True)
EMULATION = Purpose("emulation", "none", threads=1)
BENCHMARK = Purpose("benchmark", "all", threads="caller")
VALIDATE = Purpose("validate", "all")
PURPOSES = (REFERENCE, SHAPES, EMULATION, BENCHMARK, VALIDATE)

_LEVELS = {"all": "ORT_ENABLE_ALL", "basic": "ORT_ENABLE_BASIC", "none": "ORT_DISABLE_ALL"}


def reference_policy(op_types) -> dict:
    """How the reference session runs a graph with these op types: ``graph_optimization`` and ``why``."""
    quantized = sorted(QUANTIZATION_OPS.intersection(op_types))
    if not quantized:
        return {"graph_optimization": "all", "why": "onnxruntime's default: the graph holds no quantization ops"}
    return {
        "graph_optimization": "basic",
        "why": (
            f"the graph holds {', '.join(quantized)}: above ORT_ENABLE_BASIC onnxruntime fuses QDQ into integer "
            "kernels whose uint8 x int8 sums saturate on CPUs without VNNI; at basic level Q/DQ stay float32 "
            "fake-quant, the arithmetic of the PyTorch model, which is the reference"
        ),
    }


def session_options(purpose: Purpose, op_types=None, threads: int | None = None):
    """The ``SessionOptions`` of ``purpose``; ``op_types`` (REFERENCE) picks the policy's level,
    ``threads`` (BENCHMARK) the intra-op threads."""
    import onnxruntime as ort

    level = purpose.optimization
    if level == "policy":
        if op_types is None:
            raise ValueError(f"a {purpose.name} session needs the graph's op types for its policy")
        level = reference_policy(op_types)["graph_optimization"]
    opts = ort.SessionOptions()
    opts.log_severity_level = purpose.log_severity
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    if not purpose.arena:
        opts.enable_cpu_mem_arena = False
    if not purpose.prepacking:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if purpose.node_order:
        opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if purpose.threads == "caller":
        if threads is None:
            raise ValueError(f"a {purpose.name} session needs its threads")
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    elif purpose.threads is not None:
        opts.intra_op_num_threads = purpose.threads
    elif (cap := budget()) is not None:
        opts.intra_op_num_threads = cap
    return opts


def session(source, purpose: Purpose, op_types=None, threads: int | None = None, weights=None):
    """An onnxruntime CPU session of ``purpose`` on ``source``: a path, serialized bytes, or a
    ``ModelProto``. REFERENCE takes the graph's ``op_types`` (a ``ModelProto``'s own by default).
    ``weights``: for a ``ModelProto``, the data of initializers taken out of it
    (``graph.load._take_weights``), by name."""
    import onnxruntime as ort

    if hasattr(source, "graph"):
        if op_types is None and purpose.optimization == "policy":
            op_types = {n.op_type for n in source.graph.node}
        return _from_model(source, session_options(purpose, op_types, threads), weights or {})
    opts = session_options(purpose, op_types, threads)
    data = str(source) if isinstance(source, (str, Path)) else source
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


# an initializer this large reaches onnxruntime as external data in a file, which it maps
EXTERNAL_TENSOR = 16 * 2**20
# beyond this in all, every initializer goes to the file (protobuf serializes at most 2 GB)
SERIALIZED_MAX = 1 << 30


def tensor_nbytes(t) -> int:
    """An initializer's data size from its dims and type (reading ``raw_data`` would copy it)."""
    from onnx import helper

    return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _from_model(model, opts, weights: dict[str, np.ndarray]):
    """A session on ``model``, which is given back as it was. Its large initializers (and those whose
    data ``weights`` holds) go as external data in a temporary file: onnxruntime maps the file
    instead of copying the tensors out of the serialized model, which held the weights twice (the
    bytes and onnxruntime's tensors: benchmarks/results/design_measurements.md). The mapping
    outlives the file."""
    import tempfile

    import onnxruntime as ort

    inits = [t for t in model.graph.initializer if t.name in weights or t.HasField("raw_data")]
    whole = sum(tensor_nbytes(t) for t in inits) > SERIALIZED_MAX
    large = [t for t in inits if t.name in weights or whole or tensor_nbytes(t) >= EXTERNAL_TENSOR]
    if not large:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(prefix="torch2ms-session-") as tmp:
        path = Path(tmp) / "model.onnx"
        restore = _to_external(large, Path(tmp) / "weights.bin", weights)
        try:
            path.write_bytes(model.SerializeToString())
        finally:
            restore()
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _to_external(tensors: list, path: Path, weights: dict[str, np.ndarray]):
    """Move the tensors' data (from ``weights``, else their ``raw_data``) into ``path`` as ONNX
    external data, in place; returns the function that puts them back as they were."""
    import onnx

    moved = []
    try:
        with open(path, "wb") as f:
            for t in tensors:
                raw = None if t.name in weights else t.raw_data  # None: the proto holds no data
                data = memoryview(np.ascontiguousarray(weights[t.name])).cast("B") if raw is None else raw
                offset = -f.tell() % 4096 + f.tell()  # page-aligned
                f.seek(offset)
                f.write(data)
                t.ClearField("raw_data")
                moved.append((t, raw))
                t.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(len(data)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
    except BaseException:
        _from_external(moved)
        raise
    return lambda: _from_external(moved)


def _from_external(moved: list) -> None:
    for t, raw in moved:
        del t.external_data[:]
        t.ClearField("data_location")
        if raw is not None:
            t.raw_data = raw


def reference_session(path: Path, op_types):
    """A REFERENCE session on ``path``; returns (session, ``reference_policy(op_types)``)."""
    return session(path, REFERENCE, op_types), reference_policy(op_types)


def run_reference(path: Path, op_types, samples, names) -> tuple[list[dict[str, np.ndarray]], dict]:
    """The reference session's outputs ``names`` for each sample; returns (outputs, policy)."""
    sess, policy = reference_session(path, op_types)
    return [dict(zip(names, sess.run(names, s))) for s in samples], policy
