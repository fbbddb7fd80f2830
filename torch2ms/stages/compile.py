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
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.conversion import PYNATIVE_CALLS
from torch2ms.pipeline.stage import Stage, StageOutput
from torch2ms.pipeline.workspace import write_json
from torch2ms.runtime import latency, msutil
from torch2ms.runtime.memory import release_freed

# timed PyNative calls after the first: the speedup's reference, reported, not decided on
PYNATIVE_RUNS = 3


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
        return f"{e.get('chosen')}: {speed}, compile {e.get('compile_s')} s"

    def run(self, ctx, out: Path) -> StageOutput:
        ms = msutil.mindspore()
        spec = ctx.recipe.compile
        src = ctx.artifact("network.py").parent
        inputs = ctx.reference_inputs()
        names = list(ctx.reference()[1][0])

        pynative = self._pynative(ctx, spec, inputs[0])

        variants = {"auto": [False, True], "on": [True], "off": [False]}[spec.graph_kernel]
        cells, calls, first, last, warm = {}, {}, {}, {}, {}
        for gk in variants:
            key = "graph_kernel" if gk else "graph"
            self._mode(ms, spec, gk)
            cells[key] = msutil.build_network(src, f"compile_{key}")
            calls[key] = self._call(ms, spec, cells[key], gk, inputs[0], last.setdefault(key, {}))
            first[key] = latency.time_call(calls[key])  # compiles
            warm[key] = self._warm_up(ms, spec, cells[key], gk, inputs)
        chosen, times, decision = latency.faster_variant(calls, spec.runs)
        for key in [k for k in cells if k != chosen]:
            del cells[key]
        calls.clear()
        release_freed()
        timings = {k: latency.summary(first[k], times[k]) for k in times}
        self._mode(ms, spec, chosen == "graph_kernel")
        # The timed calls ran the chosen compiled cell on the first sample: its last outputs are that
        # sample's outputs (the same cell on the same input), not recomputed; its warm-up calls ran
        # the next samples; the check compares the same samples as before, the rest run here.
        done = [last[chosen]["outputs"], *warm[chosen]]
        outputs = [dict(zip(names, o)) for o in done] + msutil.run_cell(cells[chosen], inputs[len(done) :], names)
        last.clear()
        warm.clear()
        ms.set_context(mode=ms.PYNATIVE_MODE, enable_graph_kernel=False)
        extra = {
            "source": src.name,
            "chosen": chosen,
            "compile_s": timings[chosen]["first_call_s"],
            "median_ms": timings[chosen]["median_ms"],
            "pynative_median_ms": pynative["median_ms"],
            "speedup_vs_pynative": round(pynative["median_ms"] / timings[chosen]["median_ms"], 2),
            "variants": {"pynative_plain": pynative, **timings},
            **({"decision": decision} if len(variants) > 1 else {}),
        }
        write_json(out / "compile.json", extra)
        return StageOutput(outputs, extra=extra)

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

    def _warm_up(self, ms, spec, cell, graph_kernel: bool, inputs: list) -> list:
        """``spec.warmup`` calls of a compiled ``cell`` after its first, each on the next sample
        (the first sample's outputs come from the timed calls), cycling when the samples run out.
        Returns the outputs of the samples after the first that a warm-up call ran, in order: the
        check takes them instead of calling the chosen cell on those samples again."""
        rest = inputs[1:] or inputs
        outputs: list = []
        for i in range(spec.warmup):
            box: dict = {}
            self._call(ms, spec, cell, graph_kernel, rest[i % len(rest)], box)()
            if len(inputs) > 1 and i < len(rest):
                outputs.append(box["outputs"])
        return outputs

    @staticmethod
    def _mode(ms, spec, graph_kernel: bool) -> None:
        msutil.set_graph_mode(ms, graph_kernel, spec.graph_kernel_flags if graph_kernel else "", spec.jit_level)

    def _call(self, ms, spec, cell, graph_kernel: bool, sample, last: dict):
        """One materialised call of ``cell`` under its own mode (the variants' calls interleave; a
        compiled cell keeps its graph when the context switches). Each call leaves its outputs, as
        arrays, in ``last["outputs"]`` (replacing the previous call's)."""
        args = [ms.Tensor(v) for v in sample.values()]

        def call():
            self._mode(ms, spec, graph_kernel)
            out = cell(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            last["outputs"] = [o.asnumpy() for o in outs]

        return call
