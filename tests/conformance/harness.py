"""ONNX's own backend node test cases, run through torch2ms's real conversion path.

``onnx.backend.test.case.node.collect_testcases()`` gives every node test case the ONNX
project ships (one model, its inputs, the expected outputs, rtol/atol). Each case goes through
what ``torch2ms convert`` does to a model: the loader (``graph.load``: opset and dtype checks,
static shapes, constant folding), the rebuild passes, ``analyse`` + the converters
(``codegen.convert.convert_graph``), ``network.py`` + ``network.ckpt`` on disk, and
``msutil.build_network`` run in MindSpore PyNative mode. The outputs are compared like ONNX's
backend runner does: same count, shape and dtype, then ``np.testing.assert_allclose`` with the
case's rtol/atol.

The loader infers static shapes with placeholder input values, as in ``torch2ms convert`` (the
case's own values would make a converter that ignores a non-constant shape input look right).

Every case ends in one status:

- ``pass``: the converted network reproduced the expected outputs. ``how`` says by which route:
  ``converted`` (as the case is), ``constant inputs`` (see below), or ``folded`` (the loader
  folded every node into a constant, e.g. the Shape of an input of static shape, so the
  network returns a stored tensor: what was tested is the loader, no converter ran).
- ``refused``: torch2ms said no, with a reason (opset outside the supported range, a dtype
  MindSpore lacks, no converter, an attribute value a converter cannot express).
- ``pass-vs-onnxruntime``: an output differs from the case's expected one, but onnxruntime, run
  on the same model and inputs, differs from it too and torch2ms reproduces onnxruntime's outputs
  (within the case's rtol/atol). onnxruntime is the oracle the whole pipeline checks against;
  where it and ONNX's reference implementation disagree (align_corners Resize by a scale whose
  length x scale is not integral: onnxruntime and PyTorch divide by out - 1, ONNX's reference by
  in x scale - 1) torch2ms follows onnxruntime and PyTorch. Counted on its own, never as a pass,
  with ONNX's difference in ``reason``; ``tests/conformance`` lists the cases expected so.
- ``wrong``: it converted and ran, but an output differs (value, shape or dtype) from the
  expected one, and from onnxruntime's (or onnxruntime cannot run the case).
- ``crash``: any other exception, in the loader, a converter, the code generator or MindSpore,
  or the worker process died or timed out.

``wrong`` and ``crash`` are bugs. A case whose converter refuses an input because it "must be a
constant" (Reshape's shape, Expand's shape, Resize's scales, ... given as graph inputs) is run a
second time with exactly those inputs baked in as initializers, as a user with static shapes
would export them; it passes as ``constant inputs`` only if some node still reaches a converter
(if the whole graph then folds into a constant, nothing of torch2ms was tested and the case
stays refused).

Cases run in worker processes (``python -m conformance.harness --worker``, with ``tests/`` on the path), each in its own
temporary folder, so MindSpore's caches, a stray ``set_context`` or a segfault in one case
cannot change the next. A worker serves ``RECYCLE`` cases and is replaced; a case that ends
``wrong`` or ``crash`` is run again alone in a fresh worker, and that result is the one kept
(``note`` says when the first run, after other cases, differed).
"""

from __future__ import annotations

import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STATUSES = ("pass", "pass-vs-onnxruntime", "refused", "wrong", "crash")
# Cases one worker process runs before it is replaced. Each new worker spends ~2 s of CPU importing
# MindSpore and onnxruntime: make test's 1513 cases took 57.6 CPU-s with 150 a worker and 44.7 with 600
# (33 -> 25 s wall on 2 workers), the largest worker's RSS 755 MB either way, every case passing.
RECYCLE = 600
TIMEOUT = 300.0  # CPU seconds one case may take (a worker's first case includes importing MindSpore)


@dataclass(frozen=True)
class Case:
    """One ONNX node test case, picklable: the model as bytes, its first data set."""

    name: str
    op_type: str  # the op the case tests; for an ``_expanded`` case, the op of its base case
    model: bytes
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]
    rtol: float
    atol: float


@dataclass
class Outcome:
    name: str
    op_type: str
    status: str  # one of STATUSES
    reason: str = ""  # refused: why; wrong/crash: what happened
    how: str = ""  # pass: converted / constant inputs / folded
    seconds: float = 0.0
    note: str = ""
    ops: tuple[str, ...] = field(default_factory=tuple)  # op types that reached the converters


def load_cases() -> list[Case]:
    """Every node test case of the installed onnx package, sorted by name."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases()
    single = {c.name: _op_of(c.model) for c in raw if len(c.model.graph.node) == 1}
    cases = []
    for c in raw:
        if len(c.model.graph.node) == 1:
            op = single[c.name]
        else:
            op = single.get(re.sub(r"_expanded.*$", "", c.name)) or _op_of(c.model)
        inputs, outputs = c.data_sets[0] if c.data_sets else ((), ())
        cases.append(
            Case(
                c.name,
                op,
                c.model.SerializeToString(),
                tuple(_plain(a) for a in inputs),
                tuple(_plain(a) for a in outputs),
                float(c.rtol),
                float(c.atol),
            )
        )
    return sorted(cases, key=lambda c: c.name)


def cached_cases() -> list[Case]:
    """``load_cases()``, kept in the user's cache folder per onnx and numpy version: collecting
    runs every case's numpy reference (~10 s); reading the cache takes 0.1 s."""
    import onnx

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch2ms"
    path = root / f"onnx-node-cases-{onnx.__version__}-numpy-{np.__version__}-v2.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        pass
    cases = load_cases()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(cases, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: collect every time
    return cases


def _op_of(model) -> str:
    n = model.graph.node[0]
    return n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"


def _plain(a):
    """Data sets hold numpy arrays, TensorProtos (for dtypes numpy lacks), and lists/None for
    sequence and optional values."""
    import onnx
    from onnx import numpy_helper

    if isinstance(a, onnx.TensorProto):
        return numpy_helper.to_array(a)
    return np.asarray(a) if isinstance(a, np.ndarray) or np.isscalar(a) else a


# --- one case, in the current process ---


class _Refused(Exception):
    """A case torch2ms declines, with the reason."""


def run_case(case: Case, workdir: Path) -> Outcome:
    """Convert and run ``case`` in this process; never raises."""
    t0 = time.perf_counter()
    out = Outcome(case.name, case.op_type, "crash")
    try:
        status, detail, how, ops = _run(case, workdir)
        out.status, out.reason, out.how, out.ops = status, detail, how, tuple(ops)
    except _Refused as err:
        out.status, out.reason = "refused", str(err)
    except Exception as err:
        out.status, out.reason = "crash", _crash_text(err)
    out.seconds = round(time.perf_counter() - t0, 3)
    return out


def _crash_text(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "torch2ms" in f.filename), "")
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {first}" + (f" (at {where})" if where else "")


def _run(case: Case, workdir: Path) -> tuple[str, str, str, list[str]]:
    import onnx

    from torch2ms.converters.registry import analyse

    model = onnx.ModelProto()
    model.ParseFromString(case.model)
    feeds = _feeds(model, case)
    how = "converted"
    try:
        # As `torch2ms convert` does: shapes inferred with placeholder values for the inputs.
        graph = _load(model, feeds, sample=False)
        problems = analyse(graph)
        if problems:
            raise _Refused(_reasons(problems))
    except _Refused as refusal:
        model, feeds, graph = _with_constant_inputs(model, feeds, refusal)
        how = "constant inputs"
    if not graph.nodes:
        how = "folded"
    ops = sorted({n.op_type for n in graph.nodes})
    actual = _convert_and_run(graph, feeds, workdir)
    problem = compare(actual, list(case.outputs), case.rtol, case.atol)
    if problem:
        return (*_judge_by_onnxruntime(model, feeds, actual, case, problem), how, ops)
    return "pass", "", how, ops


def _judge_by_onnxruntime(model, feeds, actual, case: Case, problem: str) -> tuple[str, str]:
    """(status, reason) of a case whose outputs differ from the expected ones: ``pass-vs-onnxruntime``
    only if onnxruntime runs ``model`` (the case as converted), itself differs from the expected
    outputs, and torch2ms's outputs match onnxruntime's within the case's tolerances."""
    reference = _onnxruntime_outputs(model, feeds)
    if reference is None:
        return "wrong", problem
    ort_vs_onnx = compare(reference, list(case.outputs), case.rtol, case.atol)
    if ort_vs_onnx and not compare(actual, reference, case.rtol, case.atol):
        return "pass-vs-onnxruntime", f"matches onnxruntime; ONNX's reference differs from both: {problem}"
    return "wrong", problem


def _with_constant_inputs(model, feeds, refusal: _Refused):
    """The case with the inputs converters ask to be constants baked in as initializers, loaded
    as ``torch2ms convert`` would; re-raises ``refusal`` when that is not what stood in the way.

    Which inputs: the converters' "must be a constant" problems on the graph loaded with the
    case's own values (with placeholders, onnxruntime may not even get through a Reshape)."""
    from torch2ms.converters.registry import analyse

    try:
        sampled = _load(model, feeds, sample=True)
    except _Refused:
        raise refusal from None
    baked = _must_be_constant(sampled, analyse(sampled), feeds)
    if not baked:
        raise refusal
    model2 = _bake(model, {k: feeds[k] for k in baked})
    feeds2 = {k: v for k, v in feeds.items() if k not in baked}
    try:
        graph = _load(model2, feeds2, sample=False)
    except _Refused:
        raise refusal from None
    if analyse(graph) or not graph.nodes:  # still refused, or nothing of it left to convert
        raise refusal
    return model2, feeds2, graph


def _feeds(model, case: Case) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    if len(names) != len(case.inputs):
        raise _Refused(f"the case feeds {len(case.inputs)} inputs to a graph of {len(names)}")
    feeds = {}
    for name, value in zip(names, case.inputs):
        if not isinstance(value, np.ndarray):
            kind = "an optional" if value is None else "a sequence"
            raise _Refused(f"input {name!r} is {kind} value (torch2ms converts tensors only)")
        feeds[name] = value
    for k, value in enumerate(case.outputs):
        if not isinstance(value, np.ndarray):
            raise _Refused(f"output {k} is a sequence or optional value (torch2ms converts tensors only)")
    return feeds


def _load(model, feeds: dict[str, np.ndarray], sample: bool):
    """The loader, with placeholder input values as ``torch2ms convert`` runs it, or with the
    case's values (``sample``). Its errors are refusals, except when its onnxruntime session
    cannot load or run what onnxruntime runs as it is: then the loader broke the model, a crash."""
    from torch2ms.errors import OnnxError
    from torch2ms.graph.load import graph_from_model
    from torch2ms.graph.validate import check_model

    shapes = {k: v.shape for k, v in feeds.items()}
    try:
        opset = check_model(model, "case")
        return graph_from_model(model, opset, shapes, source="case", input_values=feeds if sample else None)
    except OnnxError as err:
        broke = "cannot load the model" in err.message or (sample and "fails on" in err.message)
        if "onnxruntime (which torch2ms runs" in err.message and broke and _onnxruntime_runs(model, feeds):
            raise
        raise _Refused(err.message.removeprefix("case: ")) from None


def _onnxruntime_runs(model, feeds) -> bool:
    return _onnxruntime_outputs(model, feeds) is not None


def _onnxruntime_outputs(model, feeds) -> list[np.ndarray] | None:
    """onnxruntime's outputs for ``model`` on ``feeds``, run as every check's reference
    (``graph.onnxrt.REFERENCE``); None if it cannot load or run it."""
    from torch2ms.graph.onnxrt import REFERENCE, session

    try:
        sess = session(model, REFERENCE)
        return [np.asarray(o) for o in sess.run(None, feeds)]
    except Exception:
        return None


# "shape (input 1) must be a constant" (Emitter.require_const), or "B must be a constant" naming
# the input by its name in the ONNX spec
_CONST_INPUT = re.compile(r"(\w+) (?:\(input (\d+)\) )?must be a constant")


def _must_be_constant(graph, problems, feeds) -> set[str]:
    """Graph inputs the problems ask to be constants, if that is all the problems ask."""
    nodes = {n.name: n for n in graph.nodes}
    wanted = set()
    for p in problems:
        m = _CONST_INPUT.search(p.reason)
        node = nodes.get(p.node)
        if not m or node is None:
            return set()
        index = int(m.group(2)) if m.group(2) else _formal_input_index(node, graph.opset, m.group(1))
        if index is None or index >= len(node.inputs) or node.inputs[index] not in feeds:
            return set()
        wanted.add(node.inputs[index])
    return wanted


def _formal_input_index(node, opset: int, name: str) -> int | None:
    import onnx

    try:
        formal = [i.name for i in onnx.defs.get_schema(node.op_type, opset, node.domain).inputs]
    except Exception:
        return None
    return formal.index(name) if name in formal else None


def _bake(model, values: dict[str, np.ndarray]):
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in values.items())
    return m


def _reasons(problems) -> str:
    seen = []
    for p in problems:
        text = f"{p.op_type}: {p.reason}"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)


def _convert_and_run(graph, feeds: dict[str, np.ndarray], workdir: Path) -> list[np.ndarray]:
    from torch2ms.codegen.convert import convert_graph
    from torch2ms.converters.api import Unsupported
    from torch2ms.errors import UnsupportedOpsError
    from torch2ms.passes import rebuild_passes, run_passes
    from torch2ms.runtime import msutil

    run_passes(graph, rebuild_passes(True))
    try:
        net = convert_graph(graph, "Network", "model.onnx", "0" * 64, "conformance")
    except (UnsupportedOpsError, Unsupported) as err:
        raise _Refused(str(err)) from None
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "network.py").write_text(net.source)
    ms.save_checkpoint(
        [{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()], str(workdir / "network.ckpt")
    )
    cell = msutil.build_network(workdir, "conformance")
    names = [f"o{j}" for j in range(len(graph.outputs))]
    outs = msutil.run_cell(cell, [{k: feeds[k] for k in graph.inputs}], names)[0]
    return [outs[n] for n in names]


def compare(actual: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float) -> str:
    """What differs, as ONNX's backend runner judges it (count, shape, dtype, allclose); '' if nothing."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for j, (a, r) in enumerate(zip(actual, expected)):
        a, r = np.asarray(a), np.asarray(r)
        if a.shape != r.shape:
            return f"output {j}: shape {a.shape}, expected {r.shape}"
        if a.dtype != r.dtype:
            return f"output {j}: dtype {a.dtype}, expected {r.dtype}"
        if r.dtype == object:
            if not np.array_equal(a, r):
                return f"output {j}: values differ"
            continue
        tol = max(rtol, 2**-6) if r.dtype.name == "bfloat16" else rtol
        a64, r64 = a.astype(np.float64), r.astype(np.float64)
        with np.errstate(invalid="ignore"):
            bad = ~np.isclose(a64, r64, rtol=tol, atol=atol, equal_nan=True)
        if bad.any():
            k = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
            return (
                f"output {j}: {int(bad.sum())} of {bad.size} values differ "
                f"(first at {tuple(int(i) for i in k)}: {a64[k]!r} vs expected {r64[k]!r}; rtol={tol:g}, atol={atol:g})"
            )
    return ""


# --- worker processes ---


def _write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_frame(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def worker_main() -> None:
    """Serve cases over stdin/stdout frames; anything else printed goes to stderr."""
    import shutil

    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # MindSpore and converters printing cannot corrupt the frames
    proto_in = sys.stdin.buffer
    root = Path(tempfile.mkdtemp(prefix="t2ms-conformance-"))
    os.chdir(root)  # kernel_meta/ and friends land here, not in the caller's folder
    try:
        from torch2ms.runtime import msutil

        msutil.mindspore()
        k = 0
        while True:
            try:
                case = _read_frame(proto_in)
            except EOFError:
                return
            k += 1
            outcome = run_case(case, root / f"case{k}")
            shutil.rmtree(root / f"case{k}", ignore_errors=True)
            _write_frame(proto_out, outcome)
    finally:
        os.chdir(tempfile.gettempdir())
        shutil.rmtree(root, ignore_errors=True)


class Worker:
    """One worker process; ``run`` sends a case and waits for its outcome."""

    def __init__(self):
        env = dict(os.environ)
        env.setdefault("GLOG_v", "3")
        here = Path(__file__).resolve()
        roots = [str(here.parents[2]), str(here.parents[1])]  # the repository (torch2ms) and tests/ (this package)
        env["PYTHONPATH"] = os.pathsep.join(roots + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conformance.harness", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.served = 0

    def run(self, case: Case, timeout: float = TIMEOUT) -> Outcome:
        """The case's outcome; a crash if the worker dies or spends ``timeout`` CPU seconds on it.

        CPU time, not wall time: on a shared machine a process can be stopped or starved for
        minutes without that being the case's fault."""
        self.served += 1
        t0 = time.perf_counter()
        cpu0 = self._cpu_seconds()
        result: list = []

        def talk():
            _write_frame(self.proc.stdin, case)
            result.append(_read_frame(self.proc.stdout))

        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(talk)
            while True:
                try:
                    fut.result(timeout=1.0)
                    return result[0]
                except TimeoutError:
                    if self._cpu_seconds() - cpu0 < timeout:
                        continue
                    why = f"timed out after {timeout:.0f} CPU seconds"
                except Exception:
                    why = None
                self.close(kill=True)
                if why is None:
                    why = f"the worker process died (exit code {self.proc.returncode})"
                return Outcome(case.name, case.op_type, "crash", why, seconds=round(time.perf_counter() - t0, 3))

    def _cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_cases(
    cases: Iterable[Case],
    workers: int = 2,
    progress: Callable[[Outcome], None] | None = None,
    confirm: bool = True,
) -> dict[str, Outcome]:
    """Run ``cases`` in ``workers`` worker processes; with ``confirm``, a wrong or crashed case
    is run again alone in a fresh one."""
    from torch2ms.runtime.cpu import configure_cpu

    configure_cpu()  # chosen once here; the workers inherit it through the environment
    cases = list(cases)
    queue = list(reversed(cases))
    outcomes: dict[str, Outcome] = {}

    def lane():
        w = None
        try:
            while True:
                try:
                    case = queue.pop()
                except IndexError:
                    return
                if w is None or not w.alive() or w.served >= RECYCLE:
                    if w is not None:
                        w.close()
                    w = Worker()
                first_in_worker = w.served == 0
                out = w.run(case)
                if confirm and out.status in ("wrong", "crash") and not first_in_worker:
                    w.close(kill=not w.alive())
                    w = Worker()
                    again = w.run(case)
                    if (again.status, again.reason) != (out.status, out.reason):
                        again.note = f"after other cases in the same process it was {out.status}: {out.reason}"
                    out = again
                    w.served = RECYCLE  # a fresh worker for whatever comes next
                outcomes[case.name] = out
                if progress:
                    progress(out)
        finally:
            if w is not None:
                w.close()

    n = max(1, min(workers, len(cases)))
    with ThreadPoolExecutor(n) as ex:
        for f in [ex.submit(lane) for _ in range(n)]:
            f.result()
    return {c.name: outcomes[c.name] for c in cases}


def main(argv: list[str]) -> int:
    """``python -m conformance.harness --write docs/conformance.md`` (from ``tests/``; ``make conformance``):
    run every case and write the table; ``--worker`` serves cases to ``run_cases``."""
    import argparse

    if argv == ["--worker"]:
        from conformance import harness  # by its name: outcomes pickle as conformance.harness.Outcome

        harness.worker_main()
        return 0
    parser = argparse.ArgumentParser(prog="python -m conformance.harness")
    parser.add_argument("--write", type=Path, help="write the table here (docs/conformance.md)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    from conformance import table

    cases = cached_cases()
    outcomes = run_cases(cases, workers=args.workers, progress=_progress(len(cases)))
    text = table.render_markdown(cases, outcomes)
    if args.write is None:
        sys.stdout.write(text)
    else:
        from torch2ms.pipeline.workspace import atomic_write_text

        atomic_write_text(args.write, text)
        print(f"wrote {args.write}: {table.Tally.of(outcomes.values()).line()}", file=sys.stderr)
    return 0


def _progress(total: int) -> Callable[[Outcome], None]:
    done = [0]

    def progress(o: Outcome) -> None:
        done[0] += 1
        if o.status in ("wrong", "crash"):
            print(f"{o.status}: {o.name} ({o.op_type}): {o.reason}", file=sys.stderr)
        if done[0] % 200 == 0:
            print(f"{done[0]}/{total} cases", file=sys.stderr)

    return progress


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
