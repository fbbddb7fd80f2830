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

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torch2ms.bounds import widen
from torch2ms.compare import MetricsAccumulator, OutputMetrics, Tolerance
from torch2ms.errors import Torch2msError
from torch2ms.pipeline.arbitration import arbitrate
from torch2ms.pipeline.markdown import cell, table

# A node is wrong when its output, computed from onnxruntime's own inputs, leaves this share of
# the tolerance: a correct float32 op differs by ~1e-7..1e-6 relative, and each injected fault
# (tests/test_fault_injection.py) by far more than 1e-5.
LOCAL_SHARE = 0.1
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
    reference_off: str = ""  # onnxruntime off float64 where the statement is not (``pipeline.arbitration``)
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


# --- the probe --------------------------------------------------------------------------------


def _construct(source: str | ast.Module) -> ast.FunctionDef:
    tree = ast.parse(source) if isinstance(source, str) else source
    # the network's class is the file's last (the modules layout defines its module classes first)
    construct = next(
        (
            f
            for c in reversed(tree.body)
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, ast.FunctionDef) and f.name == "construct"
        ),
        None,
    )
    if construct is None or not isinstance(construct.body[-1], ast.Return):
        raise Torch2msError(
            "network.py: no `construct` method ending in `return` to probe",
            hint="the file was edited; re-generate it with `torch2ms convert --from rebuild`",
        )
    return construct


def statement_lines(source: str) -> dict[str, int]:
    """Variable -> line of the ``construct`` statement assigning it (each is assigned once)."""
    lines = {}
    for st in _construct(source).body:
        if isinstance(st, ast.Assign):
            for target in st.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        lines.setdefault(name.id, st.lineno)
    return lines


def probe_source(source: str, variables: list[str]) -> str:
    """``source`` with ``construct`` returning ``variables`` (a tuple) instead of the outputs.

    Only the lines of the final ``return`` change (the first becomes the new return, the rest
    blank), so every other statement keeps its line number.
    """
    ret = _construct(source).body[-1]
    lines = source.splitlines()
    indent = lines[ret.lineno - 1][: ret.col_offset]
    lines[ret.lineno - 1 : ret.end_lineno] = [f"{indent}return ({', '.join(variables)},)"] + [""] * (
        ret.end_lineno - ret.lineno
    )
    return "\n".join(lines) + "\n"


def replay_tree(source: str, variables: set[str]) -> ast.Module:
    """``source`` (already a probe) with ``v = torch2ms_replay('v', v)`` after each statement that
    assigns a variable in ``variables`` (and at the top for such an argument): the hook takes the
    computed value (``_Stream``) and hands the next statements its own or onnxruntime's. The
    inserted statements carry their statement's line number."""
    tree = ast.parse(source)
    _hook_assignments(_construct(tree), lambda name: name in variables)
    return ast.fix_missing_locations(tree)


def _hook_assignments(fn: ast.FunctionDef, wanted, owner: str = "") -> None:
    """Insert ``v = torch2ms_replay(<owner>'v', v)`` into ``fn`` for each ``wanted`` name: at the
    top for an argument (a statement left out as ``y = x`` is its argument x), and after each
    assignment to it. The inserted statements carry their statement's line number."""

    def hook(name: str, at: ast.stmt) -> ast.stmt:
        return ast.copy_location(ast.parse(f"{name} = {REPLAY_HOOK}({owner}{name!r}, {name})").body[0], at)

    body = [hook(a.arg, fn.body[0]) for a in fn.args.args[1:] if wanted(a.arg)]
    for st in fn.body:
        body.append(st)
        if isinstance(st, ast.Assign):
            names = (n.id for t in st.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            body.extend(hook(name, st) for name in names if wanted(name))
    fn.body = body


def load_probe(stage_dir: Path, variables: list[str], tag: str, hook):
    """The stage's network with the probe's ``construct``, weights from its ``network.ckpt``, each
    of ``variables`` going through ``hook`` (``replay_tree``)."""
    source = probe_source((stage_dir / "network.py").read_text(), variables)
    return _build_instrumented(stage_dir, source, replay_tree(source, set(variables)), tag, hook)


def _build_instrumented(stage_dir: Path, source: str, tree: ast.Module, tag: str, hook):
    """The stage's network built from ``tree`` (its ``source``, instrumented) with ``hook`` as the
    replay hook, in a module of its own that leaves ``sys.modules`` again once built."""
    path = stage_dir / "network.py"
    name = f"torch2ms_probe_{tag}_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        module.__dict__[REPLAY_HOOK] = hook
        exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - our own generated code
        return module.build(str(stage_dir / "network.ckpt"))
    finally:
        sys.modules.pop(name, None)


def entry_key(entry: dict) -> str:
    """A tensor_map entry's variable: ``module:var`` in the modules layout (a class's locals are
    per instance), the variable itself in the flat one."""
    return f"{entry['module']}:{entry['var']}" if "module" in entry else entry["var"]


class _CellHook:
    """The modules layout's probe hook, called as ``hook(self, 'var', var)`` after every statement
    of every class: keys the value by the calling cell's path (``backbone.layer1.0:conv1``) and
    hands it to ``take``, whose return value the next statements see."""

    def __init__(self, take):
        self.take = take
        self.paths: dict[int, str] = {}

    def __call__(self, cell, var: str, value):
        return self.take(f"{self.paths.get(id(cell), '?')}:{var}", value)


def instrument_classes(source: str) -> ast.Module:
    """``source`` with ``v = torch2ms_replay(self, 'v', v)`` after each assignment of every class's
    ``construct``; the inserted statements carry their statement's line number."""
    tree = ast.parse(source)
    for c in tree.body:
        if not isinstance(c, ast.ClassDef):
            continue
        for f in c.body:
            if isinstance(f, ast.FunctionDef) and f.name == "construct":
                _hook_assignments(f, lambda name: name != "_", owner="self, ")
    return ast.fix_missing_locations(tree)


def load_class_probe(stage_dir: Path, tag: str, hook: _CellHook):
    """The stage's modules-layout network with every class instrumented (``instrument_classes``)."""
    source = (stage_dir / "network.py").read_text()
    net = _build_instrumented(stage_dir, source, instrument_classes(source), tag, hook)
    hook.paths = {id(c): n for n, c in net.cells_and_names()}
    return net


class _Stream:
    """The probe's hook for one pass over a sample: each compared statement's value is added to its
    tensor's metrics as it is computed and then let go, so a sample holds onnxruntime's values and
    the network's live tensors only (keeping every computed value for the end made RT-DETR's replay
    peak at 10 GB). A statement that runs more than once (a module called twice) takes its
    entries in order. With ``replay``, it hands the next statements onnxruntime's value of the
    same tensor, in the computed value's dtype (the computed one where the shapes differ)."""

    def __init__(self, ms, compared: list[dict], acc: dict, replay: bool):
        self.ms, self.acc, self.replay = ms, acc, replay
        self.tensors: dict[str, list[str]] = {}
        self.keep: set[str] = set()  # tensors whose computed value is kept (``pipeline.arbitration``)
        self.kept: dict[str, np.ndarray] = {}
        for e in compared:
            self.tensors.setdefault(entry_key(e), []).append(e["tensor"])
        self.start({})

    def start(self, reference: dict[str, np.ndarray]) -> None:
        self.reference, self.calls, self.last = reference, {}, {}

    def __call__(self, key: str, value):
        tensors = self.tensors.get(key)
        is_tensor = hasattr(value, "asnumpy")
        if tensors is None or (self.replay and not is_tensor):
            return value
        n = self.calls[key] = self.calls.get(key, 0) + 1
        tensor = tensors[min(n, len(tensors)) - 1]
        got = value.asnumpy() if is_tensor else np.asarray(value)
        ref = self.reference[tensor]
        if n <= len(tensors):
            self.acc[tensor].add(got, ref)
            if tensor in self.keep:
                self.kept[tensor] = got
        if len(tensors) > 1 and not self.replay:
            self.last[key] = got
        if self.replay and ref.shape == got.shape:
            return self.ms.Tensor(np.ascontiguousarray(ref, dtype=got.dtype))
        return value

    def finish(self) -> None:
        """The pass is over. The run pass: entries whose statement ran fewer times than there are
        entries take its last value; a statement that never ran leaves its tensor a problem
        (nothing to compare). Then the sample's values are let go."""
        if not self.replay:
            for key, tensors in self.tensors.items():
                n = self.calls.get(key, 0)
                for tensor in tensors[n:]:
                    self.acc[tensor].add(self.last[key] if n else np.asarray(None), self.reference[tensor])
        self.start({})


# --- the two sides ----------------------------------------------------------------------------


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
    from torch2ms.graph.load import _attr_value

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
                # one probe network at a time, built once onnxruntime's values are there: RT-DETR's
                # two held 0.66 GB beside each other (a second sample builds them again, ~1 s each)
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


class _References(dict):
    """onnxruntime's values of one sample's compared tensors, by name, computed a segment of the
    graph at a time (``SEGMENT``). Above ``IN_MEMORY`` bytes in all they wait on disk (one ``.npy``
    each, memory-mapped when a statement reads one) while MindSpore runs both passes.

    RT-DETR at 640² has 2.5 GB of them: one run returning them all held them at once (+2.2 GB, the
    rebuild and fold stages' peak), and the heap kept most of it after they went to disk. So each
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


# --- output -----------------------------------------------------------------------------------


def _attrs_text(attrs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in attrs.items()) or "no attributes"


def _fmt(m: OutputMetrics | None) -> str:
    if m is None:
        return "-"
    if m.nonfinite:
        return m.nonfinite
    return f"max abs {m.max_abs:.3g}, rel error {m.rel_error:.3g}, cosine {m.cosine:.7f}"


def render_text(report: DiffReport) -> str:
    tol = report.tolerance
    lines = [
        f"{report.stage}: {len(report.tensors)} tensors of the generated code compared with onnxruntime on "
        f"{report.samples} sample(s) "
        f"(rel error <= {tol.rel_error:g}, cosine >= {tol.cosine})"
    ]
    t = report.first
    if t is None:
        lines.append("no diverging node: every tensor is within tolerance")
        return "\n".join(lines)
    by_tensor = {x.tensor: x for x in report.tensors}
    lines += [
        f"first diverging node: {t.op} {t.node} (computes {t.tensor!r})",
        f"  code:   {report.location()}",
        f"          {report.code.strip()}",
        f"  error:  {_fmt(t.metrics)}" + (f" ({t.problem})" if t.metrics is None or not t.metrics.nonfinite else ""),
    ]
    for i in t.inputs:
        src = by_tensor.get(i)
        what = (
            f"({src.var}): {_fmt(src.metrics)}"
            if src
            else "(a graph input)"
            if i in report.graph_inputs
            else "(not compared)"
        )
        lines.append(f"  input:  {i!r} {what}")
    for k, n in enumerate(report.onnx_nodes):
        lines.append(f"  {'onnx:' if k == 0 else '':<7} {n['node']} ({n['op']}: {_attrs_text(n['attributes'])})")
    rest = report.inherited
    if rest:
        lines.append(
            f"  after it: {len(rest)} more tensor(s) out of tolerance, inherited (last: {rest[-1].var}, "
            f"{_fmt(rest[-1].metrics)})"
        )
    if t.local is not None:
        lines.append(f"  local:  on onnxruntime's own inputs: {_fmt(t.local)}")
    if report.replayed:
        lines.append(f"replay: {report.local_summary()}")
    return "\n".join(lines)


def render_markdown(report: DiffReport) -> str:
    lines = [
        f"# Divergence localization: stage {report.stage}",
        "",
        "```",
        render_text(report),
        "```",
        "",
    ]
    header = ("line", "variable", "op", "node", "tensor", "result", "on onnxruntime's inputs")
    rows = []
    for t in report.tensors:
        mark = "**first divergence**: " if t is report.first else ""
        local = "-" if t.local is None else ("**wrong**: " if t.local_problem else "") + _fmt(t.local)
        local += f" ({t.reference_off})" if t.reference_off else ""
        rows.append(
            (t.line, f"`{t.var}`", t.op, t.node, t.tensor, cell(mark + (t.problem or _fmt(t.metrics))), cell(local))
        )
    lines += table(header, rows, right=(0,))
    if report.not_compared:
        lines += ["", f"Not compared (not an ONNX node output): {', '.join(report.not_compared)}"]
    return "\n".join(lines) + "\n"


def write_diff(report: DiffReport, folder: Path) -> list[Path]:
    from torch2ms.pipeline.workspace import atomic_write_text, write_json

    paths = [folder / "diff.json", folder / "diff.md"]
    write_json(paths[0], report.to_dict())
    atomic_write_text(paths[1], render_markdown(report))
    return paths
