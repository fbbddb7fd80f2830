"""Run the stages in order: skip what is up to date, run the rest, check each against PyTorch.

A stage is up to date when its record says ``passed``, its fingerprint matches, and its
artifacts still hash to what the record says. The fingerprint covers the stage's part of the
recipe, the previous stage's fingerprint (so changing one stage's option re-runs it and every
stage after it), the hashes of the artifacts it reads, the tool and framework versions, and a
hash of torch2ms's own conversion code (``pipeline.fingerprint``).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch2ms.bounds import ceiling, widen
from torch2ms.compare import OutputMetrics, Tolerance, compare_outputs, worst
from torch2ms.errors import StageFailed, Torch2msError
from torch2ms.pipeline import evidence as proof
from torch2ms.pipeline.checks import Checks
from torch2ms.pipeline.context import VERDICT_KEY, RunContext
from torch2ms.pipeline.fingerprint import fingerprint, framework_versions
from torch2ms.pipeline.record import Floors, StageRecord
from torch2ms.pipeline.result import RunResult, StageResult, raise_for
from torch2ms.pipeline.stage import Stage, StageOutput, writer_of
from torch2ms.pipeline.workspace import RECORD, RunDir, artifact_hashes, write_json
from torch2ms.recipe import Recipe
from torch2ms.runtime.cpu import cpu_choice
from torch2ms.runtime.memory import StageMemory, release_freed

__all__ = ["Runner", "RunResult", "StageResult", "raise_for"]  # the run's results live in result.py


@dataclass
class Measured:
    """A stage's outputs measured against PyTorch's under its tolerance."""

    metrics: list[OutputMetrics] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # every bound missed
    tensor_violations: list[str] = field(default_factory=list)  # the per-output tensor bounds missed
    beyond: list[str] = field(default_factory=list)  # within a widened bound, beyond check.ceiling: needs evidence
    bounds: dict = field(default_factory=dict)
    task_result: Any = None
    batch_metrics: dict[int, list[OutputMetrics]] = field(default_factory=dict)
    length_metrics: dict[int, list[OutputMetrics]] = field(default_factory=dict)


@dataclass
class Verdict:
    """A stage's status and why, with what diff's replay and the evidence added."""

    status: str
    reason: str
    violations: list[str]
    bounds: dict
    diff: Any = None
    accumulated: dict | None = None
    evidence: dict | None = None


@dataclass
class TaskGate:
    """The task check's violation (or None) for a stage's candidate outputs, a plain object so that
    it crosses into the process the compile stage builds a graph-kernel variant again in."""

    checks: Checks
    recipe: Recipe
    reference: list
    floor: float | None
    source: str

    def __call__(self, outputs: list[dict]) -> str | None:
        return self.checks.task_check(self.recipe, outputs, self.reference, self.floor, self.source)[1]


class Runner:
    def __init__(
        self,
        recipe: Recipe,
        out_root: Path | None = None,
        log: Callable[[str], None] = print,
        on_stage: Callable[[str, str], None] | None = None,
        *,
        stages: list[Stage],
        checks: Checks,
        own_processes: bool = False,
        alone: bool = False,
    ):
        self.recipe = recipe
        # what the runner asks of the layers above pipeline/: the task, plugins, localisation, evidence
        self.checks = checks
        # the recipe's converter plugins, in every process that converts it (this one, a stage's own)
        self.plugins = checks.plugins(recipe)
        # stages that declare ``own_process`` run in a process of their own (``pipeline.own_process``);
        # with plugins, every stage does: a user's kernel that crashes ends its stage's process only
        self.own_processes = own_processes
        # the runner runs one stage in a process of its own (``pipeline.stage_process``): no later stage
        # in this process reads what the stage loaded
        self.alone = alone
        root = Path(out_root or recipe.output)
        self.run_dir = RunDir(root / recipe.name)
        self.ctx = RunContext(recipe, self.run_dir, log=log)
        self.on_stage = on_stage or (lambda stage, state: None)
        self.stages = stages
        self.names = [st.name for st in self.stages]
        self.ctx.stages = self.stages
        self.versions = framework_versions()

    def run(self, from_stage: str | None = None, force: bool = False, until: str | None = None) -> RunResult:
        if from_stage is not None and from_stage not in self.names:
            raise Torch2msError(f"--from {from_stage!r} is not a stage; choose one of {', '.join(self.names)}")
        t_start = time.perf_counter()
        result = RunResult(self.recipe, self.run_dir.root, task_note=self.checks.task_note(self.recipe))
        took_over = self.run_dir.lock()
        try:
            if took_over:
                self.ctx.log(f"took over the lock left by pid {took_over}, which is no longer running")
            stale = self.run_dir.cleanup_stale()
            if stale:
                self.ctx.log(f"removed leftovers of an interrupted run: {', '.join(stale)}")
            gc.freeze()  # what the run starts with (torch, onnxruntime) is not garbage: see _checked
            self._run_stages(result, from_stage, force, until)
        finally:
            gc.unfreeze()
            self.run_dir.unlock()
            result.seconds = time.perf_counter() - t_start
        return result

    def _run_stages(self, result: RunResult, from_stage: str | None, force: bool, until: str | None) -> None:
        """Each stage in order: skipped when up to date, else run and checked; after a failure the
        rest are not run. Each stage's record hands the next its floors (``record.Floors``)."""
        prev_fp = ""
        done: list[str] = []
        floors = Floors()
        stop = False
        for i, stage in enumerate(self.stages):
            if stop or (until and i > self.names.index(until)):
                result.stages.append(StageResult(stage.name, "not run", declared=stage))
                continue
            if not stage.enabled(self.recipe):
                result.stages.append(StageResult(stage.name, "disabled", declared=stage))
                continue
            fp_payload = self._fingerprint_of(i, stage, prev_fp)
            fp = fingerprint(fp_payload)
            forced = force or (from_stage is not None and i >= self.names.index(from_stage))
            res = None if forced else self._up_to_date(stage, fp)
            if res is None:
                self.on_stage(stage.name, "running")
                res = self._execute(stage, fp, fp_payload, done, floors)
                # not checkable: its artifacts are sound
                stop = res.status not in ("passed", proof.NOT_CHECKABLE)
            floors = floors.after(stage, res.record)
            result.stages.append(res)
            self.on_stage(stage.name, res.status)
            prev_fp = fp
            done.append(stage.name)

    def _fingerprint_of(self, i: int, stage: Stage, prev_fp: str) -> dict:
        """What stage ``i``'s fingerprint covers: its config, the previous stage's fingerprint, the
        hashes of the artifacts it reads, the versions."""
        inputs = {}
        for source in self._sources(i, stage):
            rec = self.run_dir.read_record(source) or {}
            inputs.update({f"{source}/{k}": v for k, v in rec.get("artifacts", {}).items()})
        payload = {
            "stage": stage.name,
            "config": stage.config(self.recipe),
            "previous": prev_fp,
            "inputs": inputs,
            "versions": self.versions,
        }
        if self.plugins:  # a plugin's code and kernels convert as torch2ms's own do
            # the kernels' sources, for the stages that run a network.py (the export runs none)
            kernels = "network.py" in (*stage.reads, *stage.writes)
            payload["plugins"] = self.checks.plugin_fingerprint(self.plugins, kernels)
        return payload

    def _up_to_date(self, stage: Stage, fp: str) -> StageResult | None:
        """The stage's cached result when its record settled at this fingerprint and its artifacts
        are unchanged; None when it must run."""
        record = self.run_dir.read_record(stage.name)
        settled = record and record.get("status") in ("passed", proof.NOT_CHECKABLE)
        if not settled or record.get("fingerprint") != fp:
            return None
        changed = self.run_dir.changed_artifacts(stage.name, record)
        if changed:
            self.ctx.log(f"{stage.name}: {', '.join(changed)} changed since it was written; running it again")
            return None
        # a not checkable verdict stays one: the same inputs decide the same
        cached, why = "up to date", ""
        if record["status"] == proof.NOT_CHECKABLE:
            cached, why = proof.NOT_CHECKABLE, proof.reason(record["evidence"])
        return StageResult(stage.name, cached, record, why, declared=stage)

    def _sources(self, i: int, stage: Stage) -> list[str]:
        """The earlier stages ``stage`` reads from: for each artifact it reads, the last enabled stage
        before it that writes that artifact."""
        out = []
        for name in stage.reads:
            try:
                source = writer_of(name, self.recipe, self.stages[:i])
            except KeyError:
                raise Torch2msError(
                    f"stage {stage.name!r} reads {name!r}, which no enabled stage before it writes"
                ) from None
            if source not in out:
                out.append(source)
        return out

    def _execute(self, stage: Stage, fp: str, fp_payload: dict, done: list[str], floors: Floors) -> StageResult:
        """Run, check and commit ``stage`` (``_execute_here``): in this process, or in one of its own
        when it declares ``own_process`` and the runner was asked for that."""
        if self.own_processes and (stage.own_process or self.plugins):
            from torch2ms.pipeline.own_process import run_in_child

            return run_in_child(self, stage, fp, fp_payload, done, floors)
        return self._execute_here(stage, fp, fp_payload, done, floors)

    def _execute_here(self, stage: Stage, fp: str, fp_payload: dict, done: list[str], floors: Floors) -> StageResult:
        """On any error or interrupt before the commit (in its ``run``, its check or its replay), the
        stage's partial folder goes. The folder is made inside the ``try``: a Ctrl-C that lands as
        ``fresh_partial`` returns (Python raises it there, right after the ``mkdir``) left it behind."""
        try:
            out = self.run_dir.fresh_partial(stage.name)
            return self._checked(stage, out, fp, fp_payload, done, floors)
        except BaseException:
            self.run_dir.discard_partial(stage.name)
            raise

    def _checked(self, stage: Stage, out: Path, fp: str, fp_payload: dict, done: list[str], floors: Floors):
        memory = StageMemory().start()
        t0, cpu0 = time.perf_counter(), time.process_time()
        self.ctx.tolerance = None if stage.noise_floor else self._tolerance(stage, StageOutput(None), floors)
        self.ctx.task_gate = None if stage.noise_floor else self._task_gate(floors)
        produced = self._run(stage, out, done)
        seconds_run = time.perf_counter() - t0
        gc.collect()  # the stage's cells and sessions sit in reference cycles; free them before the next stage
        m = self._measure(stage, produced, floors, out, done) if produced.outputs is not None else Measured()
        later = [] if self.alone else self.stages[self.names.index(stage.name) + 1 :]
        if not any("model.onnx" in st.reads for st in later):
            self.ctx.drop_graphs()  # no later stage generates code from the ONNX; the checks build their own graphs
        for check in stage.checks:  # the stage's checks beyond its outputs (generation.check), recorded in extra
            found, produced.extra[check.name] = check(self.ctx, stage, out, produced, m)
            m.violations += found
        verdict = self._verdict(stage, out, m, produced.outputs)
        counts, extra = produced.counts, produced.extra
        del produced
        release_freed()  # what the stage freed goes back to the system before the next one runs
        # what is alive now (modules, the run's caches) outlives the stage: later collections skip
        # it (a full one walks all that torch and MindSpore made, a dozen times per run);
        # refcounting still frees it, and the run's end hands it back to the collector
        gc.freeze()
        memory.stop()
        w = worst(m.metrics) if m.metrics else None
        record = StageRecord(
            stage=stage.name,
            status=verdict.status,
            fingerprint=fp,
            fingerprint_of=fp_payload,
            artifacts=artifact_hashes(out),
            seconds=round(seconds_run, 3),
            seconds_total=round(time.perf_counter() - t0, 3),
            memory=memory.to_dict(),
            cpu_seconds=round(time.process_time() - cpu0, 3),
            metrics=[x.to_dict() for x in m.metrics],
            worst=w.to_dict() if w else None,
            bounds=verdict.bounds,
            batches={str(k): worst(v).to_dict() for k, v in m.batch_metrics.items()},
            lengths={str(k): worst(v).to_dict() for k, v in m.length_metrics.items()},
            task=m.task_result.to_dict() if m.task_result else None,
            violations=verdict.violations,
            diff=verdict.diff.summary() if verdict.diff is not None else None,
            accumulated=verdict.accumulated,
            evidence=verdict.evidence,
            counts=counts,
            extra=extra,
            cpu=cpu_choice().to_dict() if cpu_choice() else None,
        ).to_dict()
        write_json(out / RECORD, record)
        self.run_dir.commit(stage.name, out)
        return StageResult(stage.name, verdict.status, record, verdict.reason, declared=stage)

    def _run(self, stage: Stage, out: Path, done: list[str]) -> StageOutput:
        """The stage's ``run``; an error that is not the tool's own becomes ``StageFailed`` naming the
        stages done before it (``_execute`` discards the partial folder on any error)."""
        try:
            return stage.run(self.ctx, out)
        except (Torch2msError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            raise StageFailed(
                f"stage {stage.name!r} failed after {done}: {type(err).__name__}: {err}",
                hint="re-run with --debug for the traceback",
            ) from err

    def _tolerance(self, stage: Stage, produced: StageOutput, floors: Floors) -> Tolerance:
        """The bound a stage's outputs are held to: the recipe's, widened by a floor (the noise-floor
        stage's own float32 floor, else the export stage's, or a replay's accumulated error)."""
        check = self.recipe.check
        # the noise-floor stage's own floor: float32 PyTorch against float64, which it measured
        floor = produced.extra.get("float32_floor") if stage.noise_floor else floors.tensor
        source = "float32 PyTorch's distance from float64" if stage.noise_floor else None
        if not stage.noise_floor and not stage.localize and floors.replay:
            floor, source = floors.replay, floors.replay_source
        tol = Tolerance(
            check.rel_error, check.cosine, check.argmax_agreement, check.noise_factor, floor, ceiling=ceiling(check)
        )
        return dataclasses.replace(tol, floor_source=source) if source else tol

    def _measure(self, stage: Stage, produced: StageOutput, floors: Floors, out: Path, done: list[str]) -> Measured:
        """The stage's outputs against PyTorch's: per output, per extra batch size, and the task."""
        _, ref_out = self.ctx.reference()
        try:  # e.g. an output of another shape than PyTorch's: the stage failed, not the tool
            metrics = compare_outputs(produced.outputs, ref_out)
        except (ValueError, KeyError) as err:
            raise StageFailed(
                f"stage {stage.name!r} failed after {done}: its outputs cannot be compared with PyTorch's: {err}"
            ) from err
        tol = self._tolerance(stage, produced, floors)
        m = Measured(metrics=metrics)
        for x in metrics:
            m.tensor_violations += [f"output {x.name!r}: {v}" for v in tol.violations(x)]
            m.beyond += [f"output {x.name!r}: {v}" for v in tol.beyond_ceiling(x)]
        m.violations += m.tensor_violations
        m.bounds = {x.name: tol.bound(x.name) for x in metrics}
        if stage.noise_floor:
            task_floor = (
                (produced.extra.get("float32_task_floor") or {}).get("agreement"),
                "float32 PyTorch's disagreement with float64",
            )
        else:
            task_floor = self._task_floor(floors)
        m.task_result, task_violation = self._task_check(produced.outputs, ref_out, *task_floor)
        if task_violation:
            m.violations.append(task_violation)
        for size, outs in (produced.batches or {}).items():
            ref = self.ctx.batch_reference()[size][1]
            m.batch_metrics[size] = compare_outputs([outs], [ref])
            for x in m.batch_metrics[size]:
                m.violations += [f"at batch {size}, output {x.name!r}: {v}" for v in tol.violations(x)]
                m.beyond += [f"at batch {size}, output {x.name!r}: {v}" for v in tol.beyond_ceiling(x)]
        for length, outs in (produced.lengths or {}).items():
            ref = self.ctx.sequence_reference()[length][1]
            m.length_metrics[length] = compare_outputs([outs], [ref])
            for x in m.length_metrics[length]:
                where = f"at sequence length {length}, output {x.name!r}"
                m.violations += [f"{where}: {v}" for v in tol.violations(x)]
                m.beyond += [f"{where}: {v}" for v in tol.beyond_ceiling(x)]
        return m

    def _verdict(self, stage: Stage, out: Path, m: Measured, outputs) -> Verdict:
        """Passed, failed or not checkable, from the measurements: a failed or beyond-ceiling check of
        a localized stage runs diff's replay, which may accept accumulated rounding or give evidence."""
        violations, bounds = list(m.violations), m.bounds
        beyond = [] if violations else m.beyond
        diff = self._localize(stage.name, out) if (violations or beyond) and stage.localize else None
        accumulated = evidence = None
        if diff is not None and violations and violations == m.tensor_violations:
            accumulated = self._accept_accumulated(diff, m.metrics, bounds)
            if accumulated:
                violations = []
                bounds = accumulated["bounds"]
                evidence = proof.from_replay(diff, stage.name, ["accumulated rounding past the bound"])
            elif diff.accumulated and diff.reference_off:
                accumulated, evidence = self._reference_off(stage, diff, m, outputs)
                if evidence:
                    violations, bounds = [], accumulated["bounds"]
        decided = self.ctx.cache.pop(VERDICT_KEY, None) if stage.noise_floor else None
        if decided and violations and violations == m.tensor_violations:  # export.verdict decided it
            evidence = decided
            violations = [f"{'; '.join(violations)}, and {decided['why']}"] if decided["by"] == "wrong" else []
        if beyond:
            evidence = self._evidence(stage, out, beyond, diff, outputs)
            if evidence["by"] == "wrong" and diff is None:  # export: its float64 run
                violations.append(f"{'; '.join(beyond)}, and {evidence['why']}")
            elif evidence["by"] == "wrong":
                named = "diff's replay finds a node wrong" if diff.first is not None else diff.local_summary()
                violations.append(f"{'; '.join(beyond)}, and {named}")
        status = "failed" if violations else proof.NOT_CHECKABLE if evidence and evidence["by"] == "none" else "passed"
        reason = "; ".join(violations) or (proof.reason(evidence) if status == proof.NOT_CHECKABLE else "")
        if diff is not None and diff.first is not None and violations:
            reason += f"; {diff.summary()}"
        return Verdict(status, reason, violations, bounds, diff, accumulated, evidence)

    def _accept_accumulated(self, diff, metrics: list[OutputMetrics], bounds: dict) -> dict | None:
        """A stage out of its bound only through accumulated rounding passes: ``diff``'s replay found
        no node wrong on onnxruntime's own inputs (each within ``LOCAL_SHARE`` of the tolerance), and
        every output is within ``check.noise_factor`` times its bound. Returns the widened bounds and
        the floor later stages without a replay of their own are judged against; None otherwise."""
        k = self.recipe.check.noise_factor
        if not diff.accumulated or k <= 0 or any(m.nonfinite for m in metrics):
            return None
        wide = {
            name: dict(zip(("rel_error", "cosine"), widen(b["rel_error"], b["cosine"], k)))
            for name, b in bounds.items()
        }
        if any(m.rel_error > wide[m.name]["rel_error"] or m.cosine < wide[m.name]["cosine"] for m in metrics):
            return None
        by = f"{k:g}x the bound, as {diff.local_summary()}"
        return {
            "bounds": {name: {**w, "by": by} for name, w in wide.items()},
            "floor": {m.name: [m.rel_error, m.cosine] for m in metrics},
        }

    def _reference_off(self, stage: Stage, diff, m: Measured, outputs) -> tuple[dict | None, dict | None]:
        """Out of its bound against onnxruntime where onnxruntime itself is off float64 and no statement
        is wrong (``divergence.arbitration``): the stage passes when its outputs are within the recipe's
        bound of ``model.onnx`` in float64; the stages after it take its error as their floor."""
        found = self.checks.reference_off(self.ctx, diff, stage.name, outputs, ["onnxruntime's own error"])
        if found is None:
            return None, None
        check, ref = self.recipe.check, found["reference"]
        by = f"the recipe's bound against model.onnx in float64, as {diff.local_summary()}"
        bounds = {x.name: {"rel_error": check.rel_error, "cosine": check.cosine, "by": by} for x in m.metrics}
        self.ctx.log(f"{stage.name}: within {check.rel_error:g} of float64 ({ref['max_rel_error']:.3g}); {by}")
        return {"bounds": bounds, "floor": {x.name: [x.rel_error, x.cosine] for x in m.metrics}}, found

    def _evidence(self, stage: Stage, out: Path, beyond: list[str], diff, outputs) -> dict:
        """Whether every node is right, for outputs beyond check.ceiling (``pipeline.evidence``)."""
        return self.checks.evidence(self.ctx, stage, out, beyond, diff, outputs)

    def _task_gate(self, floors: Floors) -> TaskGate | None:
        """The task check a stage's candidate outputs must pass, as ``_measure`` applies it after the run;
        None where the run has no PyTorch reference (a stage list without the export's)."""
        if not any("reference.npz" in st.writes and st.enabled(self.recipe) for st in self.ctx.pipeline()):
            return None
        return TaskGate(self.checks, self.recipe, self.ctx.reference()[1], *self._task_floor(floors))

    @staticmethod
    def _task_floor(floors: Floors) -> tuple[float | None, str]:
        return floors.task, "onnxruntime's disagreement with PyTorch"

    def _task_check(self, outputs, reference, floor: float | None, source: str | None):
        return self.checks.task_check(self.recipe, outputs, reference, floor, source)

    def _localize(self, stage: str, out: Path):
        """After a failed rebuild/fold check, or one that needs evidence past check.ceiling: the
        first node of the generated code that leaves onnxruntime and the replay's local errors,
        written as diff.json/diff.md beside it. If it fails, that is logged and the stage's own
        verdict stands (failed, or not checkable for want of evidence)."""
        try:
            return self.checks.localize(self.ctx, stage, out)
        except Exception as err:
            self.ctx.log(
                f"{stage}: the divergence could not be localized ({type(err).__name__}: {err});"
                " run `torch2ms diff` for details"
            )
            return None
