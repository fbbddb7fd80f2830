"""Stage 4, compile: GRAPH_MODE build of the folded network with the recipe's fusion settings.

Records the compile (first call) seconds and the median latency of the compiled network next to
the PyNative rebuild's, measured in the same process on the same input. ``graph_kernel: auto``
builds with and without graph-kernel fusion and keeps the faster one (on this CPU, fusion was
not assumed to help: measure it): after ``warmup`` calls each, the two are timed in alternating
rounds until one is faster at p <= 0.05 (exact Mann-Whitney, ``torch2ms.runtime.latency``), ``runs``
rounds ran, or no outcome of the remaining rounds could reach p <= 0.05; ``decision`` in the record
says how many rounds and the p reached. The check's first sample is the chosen cell's output
from its last timed call (on that sample); each warm-up call runs the next sample, so the chosen
cell's warm-up calls give the next samples' outputs; the others run after the decision. The PyNative
reference is the unfolded network's check calls in its own stage (one per sample; a first call
and ``min(runs, 3)`` more here when its record has none). Checked: compiled outputs vs PyTorch.

Under ``auto``, every variant's outputs are checked against the bound the runner holds the stage to
(``ctx.tolerance``), and the fastest that passes is kept: graph-kernel fusion reorders float32
arithmetic, and its error can cross a bound the plain graph stays within. The outputs mostly come
from the variants' timed and warm-up calls, so checking all costs little and the record says, for
any timing, which variants failed (``check_failures``: the worst output's error and bound). When
none passes, the fastest is kept and the runner's check fails the stage with its error.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from torch2ms.codegen.convert import PYNATIVE_CALLS
from torch2ms.compare import Tolerance, compare_outputs, worst
from torch2ms.divergence import evidence
from torch2ms.errors import StageFailed
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import write_json
from torch2ms.runtime import graph_kernel, latency, msutil
from torch2ms.runtime.memory import release_freed

# timed PyNative calls after the first: the speedup's reference, reported, not decided on
PYNATIVE_RUNS = 3
# graph-kernel builds again, each in a new process, after rejected kernels (graph_kernel_retry)
RETRIES = 3


class CompileStage(Stage):
    name = "compile"
    summary = "GRAPH_MODE build of the folded network, compile time and latency vs PyNative"
    section = "compile"
    reads = ("network.py", "network.ckpt")
    writes = ("compile.json",)

    def notes(self, record: dict) -> str:
        e = record.get("extra", {})
        speed = (
            f"{e.get('median_ms')} ms vs PyNative {e.get('pynative_median_ms')} ms ({e.get('speedup_vs_pynative')}x)"
        )
        note = f"{e.get('chosen')}: {speed}, compile {e.get('compile_s')} s"
        for f in e.get("check_failures") or []:
            why = f.get("task") or f"{f['output']}: {f['rel_error']:.3g} > {f['bound']:.3g}"
            note += f"; {f['variant']} failed the check ({why})"
        failed = e.get("graph_kernel_failures") or []
        if failed:
            rule = e.get("graph_kernel_rule")
            after = f"built with disable_cluster_ops={rule['disable_cluster_ops']}" if rule else "not built"
            rejected = ", ".join(str(f.get("fused_op") or f.get("raised_in")) for f in failed if "akg_error" in f)
            note += f"; graph kernel: rejected {rejected}, {after}"
        return note

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        spec = ctx.recipe.compile
        src = ctx.artifact("network.py").parent
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])

        pynative = self._pynative(ctx, spec, inputs[0])
        check = VariantCheck.for_stage(ctx, src, names)
        measured = self.measure(ms, spec, src, inputs, names, ctx.log, check=check)
        if measured["fusion"].get("retry"):
            measured = graph_kernel_retry(spec, src, inputs, names, measured, ctx.log, check)
        chosen, timings, fusion = measured["chosen"], measured["timings"], measured["fusion"]
        extra = {
            "source": src.name,
            "chosen": chosen,
            "compile_s": timings[chosen]["first_call_s"],
            "median_ms": timings[chosen]["median_ms"],
            "pynative_median_ms": pynative["median_ms"],
            "speedup_vs_pynative": round(pynative["median_ms"] / timings[chosen]["median_ms"], 2),
            "variants": {"pynative_plain": pynative, **timings},
            **({"decision": measured["decision"]} if len(timings) > 1 else {}),
            **self._fusion_record(spec, fusion),
            **({"check_failures": measured["rejected"]} if measured.get("rejected") else {}),
        }
        write_json(out / "compile.json", extra)
        return StageOutput(measured["outputs"], extra=extra)

    def measure(
        self, ms, spec, src, inputs: list, names: list, log, rule: dict | None = None, failures=(), check=None
    ) -> dict:
        """Builds the variants ``graph_kernel`` asks for (the graph-kernel one under ``rule`` when given),
        times them, runs each on every sample and keeps the fastest that passes ``check`` (None: the
        fastest). Returns the chosen key, the timings, the decision, the outputs per sample,
        the variants that failed the check (``rejected``) and the fusion record (``failures``: those
        before, then this run's)."""
        wanted = {"auto": [False, True], "on": [True], "off": [False]}[spec.graph_kernel]
        cells, calls, first, last, warm, modes = {}, {}, {}, {}, {}, {}
        fusion: dict = {"failures": list(failures)}
        state = (cells, calls, first, last, warm)
        for gk in wanted:
            if not gk:
                self._variant(ms, spec, src, "graph", None, inputs, state)
                modes["graph"] = None
                continue
            flags = self._build(ms, spec, src, "graph_kernel", inputs, fusion, state, log, rule)
            if flags is not None:  # None under auto: it did not build (fusion["failures"] says why)
                modes["graph_kernel"] = flags
        fastest, times, decision = latency.faster_variant(calls, spec.runs)
        calls.clear()
        timings = {k: latency.summary(first[k], times[k]) for k in times}
        order = sorted(timings, key=lambda k: (k != fastest, timings[k]["median_ms"]))

        def outputs_of(key: str) -> list:
            # The timed calls ran the compiled cell on the first sample: its last outputs are that
            # sample's outputs (the same cell on the same input), not recomputed; its warm-up calls ran
            # the next samples; the check compares the same samples as before, the rest run here.
            self._mode(ms, spec, modes[key])
            done = [last[key]["outputs"], *warm[key]]
            return [dict(zip(names, o)) for o in done] + msutil.run_cell(cells[key], inputs[len(done) :], names)

        chosen, outputs, rejected = passing_variant(order, outputs_of, check)
        for v in rejected:
            log(f"compile: {v['variant']} failed the check ({'; '.join(v['violations'])}), not kept")
        cells.clear()
        release_freed()
        ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
        return {
            "chosen": chosen,
            "timings": timings,
            "decision": {**decision, "fastest": fastest} if chosen != fastest else decision,
            "outputs": outputs,
            "rejected": rejected,
            "fusion": fusion,
        }

    def _variant(self, ms, spec, src, key: str, flags: str | None, inputs: list, state) -> None:
        """Builds one compiled variant (``flags`` None: the plain graph), makes its compiling first
        call and its warm-up calls, and files them under ``key`` in ``state`` (cells, calls, first, last,
        warm)."""
        cells, calls, first, last, warm = state
        self._mode(ms, spec, flags)
        cells[key] = msutil.build_network(src, f"compile_{key}")
        calls[key] = self._call(ms, spec, cells[key], flags, inputs[0], last.setdefault(key, {}))
        first[key] = latency.time_call(calls[key])  # compiles
        warm[key] = self._warm_up(ms, spec, cells[key], flags, inputs)

    def _build(self, ms, spec, src, key: str, inputs: list, fusion: dict, state, log, rule) -> str | None:
        """The graph-kernel variant under the recipe's rules and ``rule``; returns the flags it built
        with. A build or run that fails is recorded in ``fusion["failures"]``: under ``on`` it fails the
        stage, naming the fused kernel, its module and the rule that keeps it out; under ``auto`` (and
        while the kernel names op types ``rule`` does not keep out yet) ``fusion["retry"]`` gets
        ``rule`` with those added to ``disable_cluster_ops``, and None is returned."""
        flags = graph_kernel.flags(spec, rule)
        try:
            with graph_kernel.captured_output() as captured:
                self._variant(ms, spec, src, key, flags, inputs, state)
        except Exception as err:  # noqa: BLE001 - AKG's failures surface as RuntimeError/ValueError/TypeError
            self._discard(key, state)
            failure = {"variant": key, "flags": flags, **graph_kernel.describe_failure(err, "".join(captured))}
            fusion["failures"].append(failure)
            log(f"compile: the graph-kernel build failed: {_failed_where(failure)}: {failure['akg_error']}")
            if spec.graph_kernel == "on":
                raise StageFailed(*_on_failure(failure)) from None
            kept_out = (rule or {}).get("disable_cluster_ops", [])
            if any(op not in kept_out for op in failure["op_types"]):
                fusion["retry"] = {"disable_cluster_ops": list(dict.fromkeys([*kept_out, *failure["op_types"]]))}
            return None
        if rule:
            because = [f.get("fused_op") or f.get("akg_error") for f in fusion["failures"] if f.get("op_types")]
            fusion["rule"] = {**rule, "because": because}
        fusion["flags"] = flags
        fusion["rules"] = graph_kernel.rules(spec, rule)
        return flags

    @staticmethod
    def _discard(key: str, state) -> None:
        for part in state:
            part.pop(key, None)
        release_freed()

    @staticmethod
    def _fusion_record(spec, fusion: dict) -> dict:
        """compile.json's fusion entries: the flags and rules the graph-kernel variant built under, the
        rule a retry added (``graph_kernel_rule``) and every failed build (``graph_kernel_failures``)."""
        if spec.graph_kernel == "off":
            return {}
        out = {"graph_kernel_flags": fusion.get("flags"), "fusion_rules": fusion.get("rules")}
        if fusion.get("rule"):
            out["graph_kernel_rule"] = fusion["rule"]
        if fusion["failures"]:
            out["graph_kernel_failures"] = fusion["failures"]
        return out

    @staticmethod
    def _pynative(ctx, spec, sample) -> dict:
        """The PyNative figure the speedup is stated against (reported, not decided on): the
        unfolded network's calls that its stage's check made on every sample, timed there; timed
        here (a first call, then ``min(runs, 3)``) when that record holds none."""
        src = ctx.artifact("network.py", first=True).parent
        calls = ((ctx.run.read_record(src.name) or {}).get("extra") or {}).get(PYNATIVE_CALLS)
        if calls:
            return {**latency.summary(calls[0], calls), "timed_in": f"the {src.name} stage's check"}
        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)
        cell = msutil.build_network(src, "compile_pynative")
        pynative = msutil.time_cell(cell, sample, 0, min(spec.runs, PYNATIVE_RUNS))
        del cell
        release_freed()
        return pynative

    def _warm_up(self, ms, spec, cell, flags: str | None, inputs: list) -> list:
        """``spec.warmup`` calls of a compiled ``cell`` after its first, each on the next sample
        (the first sample's outputs come from the timed calls), cycling when the samples run out.
        Returns the outputs of the samples after the first that a warm-up call ran, in order: the
        check takes them instead of calling the chosen cell on those samples again."""
        rest = inputs[1:] or inputs
        outputs: list = []
        for i in range(spec.warmup):
            box: dict = {}
            self._call(ms, spec, cell, flags, rest[i % len(rest)], box)()
            if len(inputs) > 1 and i < len(rest):
                outputs.append(box["outputs"])
        return outputs

    @staticmethod
    def _mode(ms, spec, flags: str | None) -> None:
        """GRAPH_MODE, with graph-kernel fusion under ``flags`` unless they are None (the plain graph)."""
        msutil.set_graph_mode(ms, flags is not None, flags or "", spec.jit_level)

    def _call(self, ms, spec, cell, flags: str | None, sample, last: dict):
        """One materialised call of ``cell`` under its own mode (the variants' calls interleave; a
        compiled cell keeps its graph when the context switches). Each call leaves its outputs, as
        arrays, in ``last["outputs"]`` (replacing the previous call's)."""
        args = [ms.Tensor(v) for v in sample.values()]

        def call():
            self._mode(ms, spec, flags)
            out = cell(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            last["outputs"] = [o.asnumpy() for o in outs]

        return call


class VariantCheck:
    """The stage's check on one variant's outputs, as the runner's verdict will judge the variant
    kept: ``tolerance`` (``compare.Tolerance``) against PyTorch's ``reference`` outputs per sample;
    then, for outputs beyond ``check.ceiling``, the evidence the verdict asks for there
    (``pipeline.evidence.for_compiled``): the outputs of the network.py it was compiled from in
    PyNative (``source``), matched within ``same`` (the recipe's bound), which graph kernels that
    reorder a sum can miss where the plain graph does not; then the recipe's task (``task_gate``:
    detection boxes, OCR text, top-1). Calling it returns the failure's record (the worst violating
    output, its relative error and bound, every violation; ``task`` when the task failed) or None
    when the outputs pass."""

    def __init__(self, tolerance, reference: list[dict], task_gate=None, source=None, same=None):
        self.tolerance, self.reference, self.task_gate = tolerance, reference, task_gate
        self.source, self.same = source, same

    def __call__(self, outputs: list[dict]) -> dict | None:
        metrics = compare_outputs(outputs, self.reference)
        failing = [m for m in metrics if self.tolerance.violations(m)]
        violations = [f"output {m.name!r}: {v}" for m in failing for v in self.tolerance.violations(m)]
        beyond = [m for m in metrics if self.tolerance.beyond_ceiling(m)]
        if beyond and self.source is not None:
            apart = [m for m in compare_outputs(outputs, self.source) if self.same.violations(m)]
            failing += [m for m in beyond if m.name in {a.name for a in apart}]
            violations += [
                f"output {a.name!r}: beyond check.ceiling, and apart from network.py in PyNative: {v}"
                for a in apart
                for v in self.same.violations(a)
            ]
        task = self.task_gate(outputs) if self.task_gate is not None else None
        if not violations and task is None:
            return None
        w = worst(failing or metrics)
        return {
            "output": w.name,
            "rel_error": w.rel_error,
            "bound": self.tolerance.bound(w.name)["rel_error"],
            "violations": violations + ([f"task: {task}"] if task else []),
            **({"task": task} if task else {}),
        }

    @classmethod
    def for_stage(cls, ctx, src, names: list[str]):
        """The check for the compile stage of ``ctx``'s run (None where the runner gives no bound);
        ``source`` is computed only where there are variants to choose from (``auto``) and a bound
        reaches past the ceiling: a single variant is kept whatever the check says, and the verdict's
        evidence runs the source itself when it needs it."""
        tol = ctx.tolerance
        if tol is None:
            return None
        past = (
            ctx.recipe.compile.graph_kernel == "auto"
            and tol.ceiling is not None
            and any(
                tol.bound(n)["rel_error"] > tol.ceiling[0] or tol.bound(n)["cosine"] < tol.ceiling[1] for n in names
            )
        )
        source = evidence.pynative_outputs(ctx, src, names, "compile_evidence")[0] if past else None
        same = Tolerance(ctx.recipe.check.rel_error, ctx.recipe.check.cosine)
        return cls(tol, ctx.reference()[1], ctx.task_gate, source, same)


def passing_variant(order: list[str], outputs_of, check) -> tuple[str, list, list[dict]]:
    """The first of ``order`` (fastest first) whose outputs, ``outputs_of(key)``, pass ``check``; the
    first when none does. Every variant is checked (``check`` None: none is, the first is kept).
    Returns the key, its outputs and, per variant that failed, the failure's record with its
    ``variant``."""
    if check is None:
        return order[0], outputs_of(order[0]), []
    outputs = {key: outputs_of(key) for key in order}
    rejected = []
    for key in order:
        failure = check(outputs[key])
        if failure is not None:
            rejected.append({"variant": key, **failure})
    failed = {r["variant"] for r in rejected}
    chosen = next((k for k in order if k not in failed), order[0])
    return chosen, outputs[chosen], rejected


def _failed_where(failure: dict) -> str:
    """Where a graph-kernel build failed: the fused kernel and its module, else MindSpore's pass."""
    if not failure["fused_op"]:
        where = failure.get("raised_in") or "(unnamed)"
        return f"in MindSpore's graph-kernel pass {where}, before any kernel was named"
    # MindSpore 2.10 names a fused kernel's ops without the cells above them (Default/Gather-op0)
    module = failure["module"]
    where = f"in module {module!r}" if module else "(MindSpore's kernel description names no module)"
    return f"on {failure['fused_op']} {where} (scope {failure['scope']})"


def _on_failure(failure: dict) -> tuple[str, str]:
    """The message and hint of a graph-kernel build that failed under ``graph_kernel: on``."""
    ops = failure["op_types"]
    message = f"stage 'compile': graph-kernel fusion failed {_failed_where(failure)}: {failure['akg_error']}"
    if ops:
        hint = f"keep it out with compile.fusion.disable_cluster_ops: {ops}, or set compile.graph_kernel: auto"
        return message, f"{hint} to record the failure and go on"
    return message, "set compile.graph_kernel: auto to record the failure and keep the plain graph, or off"


def graph_kernel_retry(spec, src, inputs: list, names: list, measured: dict, log, check=None) -> dict:
    """The compile stage's measurement again in a fresh process, the graph-kernel variant under
    ``measured``'s retry rule, up to ``RETRIES`` times while each build names op types to keep out
    that the rule does not hold yet (a model may have several kernels AKG rejects). After AKG's
    failure a process cannot build graph kernels any more (MindSpore's build client answers "Get
    response before Open() error"), while the plain graph still builds."""
    for _ in range(RETRIES):
        rule = measured["fusion"].pop("retry", None)
        if rule is None:
            break
        measured = _retry(spec, src, inputs, names, measured, rule, log, check)
    measured["fusion"].pop("retry", None)
    return measured


def _retry(spec, src, inputs: list, names: list, measured: dict, rule: dict, log, check) -> dict:
    """One retry's measurement (the child's), or ``measured`` (the plain graph's) with the child's
    failure recorded when it gave none."""
    fusion = measured["fusion"]
    log(f"compile: building the graph-kernel variant again in a new process with {rule}")
    with tempfile.TemporaryDirectory(prefix="torch2ms_compile_") as tmp:
        job, result = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        with open(job, "wb") as f:
            pickle.dump({"path": sys.path, "spec": spec, "src": src, "inputs": inputs, "names": names}, f)
            pickle.dump({"rule": rule, "failures": fusion["failures"], "check": check}, f)
        code = subprocess.run([sys.executable, "-m", "torch2ms.stages.compile", str(job), str(result)]).returncode
        if code == 0 and result.exists():
            with open(result, "rb") as f:
                return pickle.load(f)
    fusion["failures"].append(
        {
            "variant": "graph_kernel",
            "flags": graph_kernel.flags(spec, rule),
            "exception": f"retry process: status {code}",
        }
    )
    return measured


def _child(job: str, result: str) -> None:
    """``python -m torch2ms.stages.compile JOB RESULT``: the measurement of ``graph_kernel_retry``."""
    with open(job, "rb") as f:
        head = pickle.load(f)
        sys.path[:] = head["path"]
        retry = pickle.load(f)
    ms = msutil.mindspore()
    measured = CompileStage().measure(
        ms,
        head["spec"],
        head["src"],
        head["inputs"],
        head["names"],
        print,
        retry["rule"],
        retry["failures"],
        retry["check"],
    )
    with open(result + ".part", "wb") as f:
        pickle.dump(measured, f)
    os.replace(result + ".part", result)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
