"""Per-op test harness: a one- or few-node ONNX model, onnxruntime as the oracle, and the real
conversion path (``graph/load.py`` -> passes -> converters -> ``network.py`` + checkpoint ->
``msutil.build_network``) run in MindSpore PyNative mode, and in GRAPH mode too for the first
case of every test function (all cases with ``TORCH2MS_OP_TEST_MODES=pynative,graph``; see
conftest.py).

A test describes the node and its inputs::

    check_op("Conv", [x(1, 3, 8, 8), const(w)], {"pads": [1, 1, 1, 1]}, tmp_path)

``x(*shape)`` is a graph input filled with seeded random float32 data (``x(..., data=a)`` gives
the data), ``const(a)`` an initializer (folded into the generated code as a literal or a stored
tensor), ``None`` an omitted optional input. ``check_op`` asserts the node survived constant
folding (so its converter really ran), then compares every output with onnxruntime: float
outputs by ``max|a - r| / max|r|``, integer and bool outputs exactly, shapes and dtypes always.
``check_unsupported`` asserts the converter refuses a node with a message naming the attribute.
"""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from converters import exact
from onnx import helper, numpy_helper

from torch2ms.ascend.placement import UNKNOWN, place_graph
from torch2ms.codegen.convert import convert_graph
from torch2ms.converters.registry import analyse, lookup, registrations
from torch2ms.graph.load import graph_from_model
from torch2ms.graph.validate import SUPPORTED_OPSETS
from torch2ms.passes import run_passes
from torch2ms.runtime import msutil

REL_TOL = 1e-5


@dataclass
class Input:
    """A graph input; ``data`` is what both runtimes get."""

    data: np.ndarray


@dataclass
class Const:
    """An initializer."""

    data: np.ndarray


def rand(*shape, seed: int | None = None, low: float = -2.0, high: float = 2.0, dtype=np.float32) -> np.ndarray:
    """Seeded uniform data; the seed defaults to one derived from the shape (stable across runs)."""
    if seed is None:
        seed = zlib.crc32(repr(shape).encode())
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def x(*shape, data: np.ndarray | None = None, seed: int | None = None) -> Input:
    return Input(rand(*shape, seed=seed) if data is None else np.asarray(data))


def const(data, dtype=None) -> Const:
    return Const(np.asarray(data, dtype=dtype))


def i64(*values) -> Const:
    return Const(np.array(values, np.int64))


def f32(*values) -> Const:
    return Const(np.array(values, np.float32))


def batchnorm(inp: str, out: str, channels: int, name: str, **attrs) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """A BatchNormalization node with seeded, well-conditioned statistics (gamma, beta, mean, var)."""
    ranges = {"gamma": (0.5, 1.5), "beta": (-0.5, 0.5), "mean": (-0.5, 0.5), "var": (0.5, 2.0)}
    inits = [numpy_helper.from_array(rand(channels, seed=len(k), low=lo, high=hi), k) for k, (lo, hi) in ranges.items()]
    return helper.make_node("BatchNormalization", [inp, *ranges], [out], name=name, **attrs), inits


def make_model(
    op_type: str, inputs: list, attrs: dict | None = None, *, opset: int = 17, n_outputs: int = 1, domain: str = ""
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One ``op_type`` node over ``inputs``; returns the model and its feeds."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for k, inp in enumerate(inputs):
        if inp is None:
            names.append("")
        elif isinstance(inp, Input):
            name = f"in{k}"
            names.append(name)
            feeds[name] = inp.data
            elem = helper.np_dtype_to_tensor_dtype(inp.data.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(inp.data.shape)))
        elif isinstance(inp, Const):
            name = f"c{k}"
            names.append(name)
            inits.append(numpy_helper.from_array(inp.data, name))
        else:
            raise TypeError(f"input {k}: use x(...), const(...) or None, not {type(inp).__name__}")
    outs = [f"out{j}" for j in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name=f"/op/{op_type}", domain=domain, **(attrs or {}))
    value_infos = [onnx.ValueInfoProto(name=o) for o in outs]  # type and shape left to inference
    graph = helper.make_graph([node], "op_test", graph_inputs, value_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)  # onnxruntime 1.2x reads IR <= 10
    return model, feeds


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs; for a model with integer-accumulating ops, the exact evaluation of
    ``exact.py`` instead, checked against onnxruntime (see ``reference``)."""
    if exact.has_integer_ops(model):
        return reference(model, feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The oracle for a model with MatMulInteger / ConvInteger / QLinearMatMul / QLinearConv: integer
    nodes in int64 numpy, the rest in onnxruntime (``exact.evaluate``), compared with a whole-graph
    onnxruntime run without graph optimizations. They must agree to the bit, except where this CPU's
    onnxruntime saturates (``exact.onnxruntime_saturates``: no VNNI) and a node multiplies uint8 by
    int8: then the exact result is the reference and a warning says how far onnxruntime was off."""
    mixed: list[str] = []
    expected = exact.evaluate(model, feeds, mixed)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    wrong = sum(int((np.asarray(g) != e).sum()) for g, e in zip(got, expected))
    if wrong:
        saturates, note = _saturation()
        assert saturates and mixed, (
            f"onnxruntime and the exact integer evaluation differ in {wrong} values, on a CPU whose kernels "
            f"do not saturate or without a uint8 x int8 node: the oracle's semantics are wrong ({note})"
        )
        warnings.warn(
            f"exact integer oracle used for {', '.join(mixed)}: onnxruntime differs in {wrong} values ({note})",
            stacklevel=2,
        )
    return expected


_SATURATION: list[tuple[bool, str]] = []


def _saturation() -> tuple[bool, str]:
    if not _SATURATION:
        _SATURATION.append(exact.onnxruntime_saturates())
    return _SATURATION[0]


def load(model: onnx.ModelProto, feeds: dict[str, np.ndarray], passes=()):
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    graph = graph_from_model(model, opset, {k: v.shape for k, v in feeds.items()})
    fired = run_passes(graph, list(passes))
    return graph, fired


# Which MindSpore modes a test runs the generated network in; set per test by conftest.py.
MODES = ["pynative"]
# (domain, op type, since) of every converter registration whose code ``convert_and_run`` built
# and ran in this session (every caller compares the outputs with onnxruntime's); test_coverage.py
# checks, after the whole folder ran, that no registration is missing.
RAN: set[tuple[str, str, int]] = set()


def unrun_registrations(ran: set[tuple[str, str, int]], with_fusion: bool) -> list[str]:
    """The converter registrations missing from ``ran``; torch2ms-domain ones (what the fusion passes
    make, run by tests/passes/test_fusion.py) only ``with_fusion``. A registration no supported opset looks
    up (an old Clip below opset 11) cannot run and is not asked for."""

    def reachable(r) -> bool:
        return any(lookup(r.op_type, o, r.domain) == r for o in SUPPORTED_OPSETS)

    return sorted(
        f"{r.domain + '.' if r.domain else ''}{r.op_type} (since opset {r.since})"
        for r in registrations()
        if (r.domain, r.op_type, r.since) not in ran and (not r.domain or with_fusion) and reachable(r)
    )


def convert_and_run(graph, feeds: dict[str, np.ndarray], out_dir: Path) -> tuple[dict[str, list[np.ndarray]], str]:
    """Generate network.py + network.ckpt into ``out_dir``, build it, run it on ``feeds`` in
    every mode of ``MODES``; returns {mode: outputs} and the source."""
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = convert_graph(graph, "Network", "model.onnx", "0" * 64, "op-test")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "network.py").write_text(net.source)
    ms.save_checkpoint(
        [{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()], str(out_dir / "network.ckpt")
    )
    for n in graph.nodes:
        reg = lookup(n.op_type, graph.opset, n.domain)
        if reg is not None:
            RAN.add((reg.domain, reg.op_type, reg.since))
    # every MindSpore call this code holds has a placement on the Ascend 310 (torch2ms/ascend/lowering.py)
    unknown = sorted({o.call for info in place_graph(graph) for o in info.ops if o.where.placement == UNKNOWN})
    assert not unknown, f"add {unknown} to torch2ms/ascend/lowering.py (the CANN ops they lower to)"
    results = {}
    try:
        for mode in MODES:
            ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
            cell = msutil.build_network(out_dir, "optest")  # the generated build(), weights or not
            outs = msutil.run_cell(
                cell, [{k: feeds[k] for k in graph.inputs}], [f"o{j}" for j in range(len(graph.outputs))]
            )[0]
            results[mode] = list(outs.values())
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return results, net.source


def assert_close(actual: np.ndarray, ref: np.ndarray, rel_tol: float, where: str) -> None:
    actual, ref = np.asarray(actual), np.asarray(ref)
    assert actual.shape == ref.shape, f"{where}: shape {actual.shape} != onnxruntime's {ref.shape}"
    if ref.dtype.kind in "biu":
        assert actual.dtype == ref.dtype, f"{where}: dtype {actual.dtype} != onnxruntime's {ref.dtype}"
        mismatch = int((actual != ref).sum())
        assert mismatch == 0, f"{where}: {mismatch} of {ref.size} elements differ (exact comparison)"
        return
    assert actual.dtype.kind == "f", f"{where}: dtype {actual.dtype}, onnxruntime gives {ref.dtype}"
    assert np.isfinite(actual).all() == np.isfinite(ref).all(), f"{where}: non-finite values differ"
    a, r = actual.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(a - r)
    scale = np.abs(r).max(initial=0.0)
    rel = diff.max(initial=0.0) / scale if scale > 0 else diff.max(initial=0.0)
    assert rel <= rel_tol, (
        f"{where}: relative error {rel:.3g} > {rel_tol:.1g} (worst at {np.unravel_index(diff.argmax(), diff.shape)})"
    )


def check_op(
    op_type: str,
    inputs: list,
    attrs: dict | None = None,
    tmp_path: Path | None = None,
    *,
    opset: int = 17,
    n_outputs: int = 1,
    rel_tol: float = REL_TOL,
    passes=(),
    expect_nodes: list[str] | None = None,
) -> str:
    """Convert the one-node model and compare with onnxruntime; returns the generated source.

    ``expect_nodes``: the op types the graph must hold after loading and ``passes`` (default:
    ``[op_type]``), i.e. what the generated code was made from.
    """
    assert tmp_path is not None, "pass pytest's tmp_path"
    model, feeds = make_model(op_type, inputs, attrs, opset=opset, n_outputs=n_outputs)
    expected = run_ort(model, feeds)
    graph, _ = load(model, feeds, passes)
    assert [n.op_type for n in graph.nodes] == (expect_nodes if expect_nodes is not None else [op_type]), (
        "the node was folded or rewritten"
    )
    results, source = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        assert len(actual) == len(expected)
        for j, (a, r) in enumerate(zip(actual, expected)):
            assert_close(a, r, rel_tol, f"{op_type} {attrs or {}} output {j} ({mode} mode)\n{_construct(source)}")
    return source


def check_model(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    tmp_path: Path,
    *,
    passes=(),
    rel_tol: float = REL_TOL,
    expect_nodes: list[str] | None = None,
) -> tuple[str, dict]:
    """Like ``check_op`` for a hand-built multi-node model; returns (source, pass fire counts)."""
    expected = run_ort(model, feeds)
    graph, fired = load(model, feeds, passes)
    if expect_nodes is not None:
        assert [n.op_type for n in graph.nodes] == expect_nodes
    results, source = convert_and_run(graph, feeds, tmp_path / "net")
    for mode, actual in results.items():
        for j, (a, r) in enumerate(zip(actual, expected)):
            assert_close(a, r, rel_tol, f"output {j} ({mode} mode)\n{_construct(source)}")
    return source, fired


def check_unsupported(
    op_type: str, inputs: list, attrs: dict | None, match: str, *, opset: int = 17, n_outputs: int = 1
) -> str:
    """torch2ms must refuse the node with a reason that contains ``match``: its converter, or the
    loader, which refuses a dtype MindSpore lacks before any converter runs."""
    from torch2ms.errors import OnnxError

    model, feeds = make_model(op_type, inputs, attrs, opset=opset, n_outputs=n_outputs)
    try:
        graph, _ = load(model, feeds)
    except OnnxError as err:
        reasons = err.message
    else:
        problems = analyse(graph)
        assert problems, f"{op_type} {attrs} converted; expected Unsupported naming {match!r}"
        reasons = "; ".join(p.reason for p in problems)
    assert match in reasons, f"{op_type} {attrs}: reason {reasons!r} does not name {match!r}"
    return reasons


def _construct(source: str) -> str:
    """The generated ``construct`` body, for assertion messages."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if "def construct" in line), 0)
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("def build")), len(lines))
    return "\n".join(lines[start:end]).rstrip()
