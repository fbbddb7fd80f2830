"""A stage checked as generation: greedy decoding with the stage's own prefill and decode graphs,
against transformers' ``generate`` (``reference``), in the runner's check (``Stage.checks``).

``GenerationCheck`` is set on the decode graph's stages (``generation.convert``): the prefill graph's
same stage has run by then, in its own run folder. ``graph_call`` runs a graph the stage's way:

* export: the two ``model.onnx`` in onnxruntime (the reference sessions);
* rebuild, fold: the generated ``network.py`` cells in PyNative;
* compile: the fold's cells in GRAPH_MODE, with the graph-kernel flags the compile stage chose;
* mindir: the reloaded ``network.mindir`` (``mindspore.load`` + ``nn.GraphCell``).

Two greedy runs over the recipe's prompts (``stage_generation``): free-running (the tokens the stage
would produce) and teacher-forced on the reference's tokens (the logits compared like with like at
every step), from one prefill of each batch. The graphs are built one at a time, the prefill's
released before the decode graph is built, so that the check holds one graph's weights besides the
stage's own. The stage fails when

* a teacher-forced step's argmax is not the reference's token, unless the reference's own top-2
  gap there is within float noise (``GenerationCheck.noise``: from the export stage's teacher-forced
  logits, onnxruntime's distance from transformers, as the export measures the tensor floor). Such
  a step is a near-tie, listed; the run goes on from the reference's token, so one tie hides no
  later error;
* a step's logits (teacher-forced, every row) are beyond the stage's bound for the decode graph's
  ``logits`` output (the runner's ``Measured.bounds``: the recipe's, widened by the export floor).

The record (``extra["generation"]`` of the decode graph's stage.json) has the token counts, the
free-running run's first difference (step, row, both tokens, top-2 gap), the near-ties, the worst
step's logits error and the bounds used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch2ms.generation.compare import first_divergence, step_errors, top2_gaps
from torch2ms.generation.loop import Generated, Runner, decode_batches, prefill_batches

REFERENCE = "reference.npz"  # in the generation folder: transformers' tokens and logits


@dataclass(frozen=True)
class GenerationCheck:
    """What a stage's generation check needs, picklable (a stage may run in its own process)."""

    prefill_root: Path  # the prefill graph's run folder (its stages' folders inside)
    reference: Path  # REFERENCE: transformers' tokens [N, steps] and logits [N, steps, V]
    prompts: tuple[tuple[int, ...], ...]
    batch: int
    max_new_tokens: int
    cache_length: int
    noise_factor: float
    gears: tuple[int, ...] | None = None  # the prefill graph's prompt lengths (default: the longest prompt)
    name: str = "generation"

    def __call__(self, ctx, stage, out: Path, produced, measured) -> tuple[list[str], dict]:
        """(violations, record) for ``stage`` of the decode graph, whose partial folder is ``out``."""
        with np.load(self.reference) as f:
            reference = Generated(f["tokens"], f["logits"])
        folders = self._folders(ctx, stage, out)
        try:
            run = (self.prompts, self.batch, self.max_new_tokens, self.cache_length)
            calls = (stage.name, folders, produced.extra, ctx.recipe.compile.jit_level)
            free, forced = stage_generation(*calls, *run, reference.tokens, self.gears)
        finally:
            if stage.name != "export":  # the next stage starts in PyNative, as the compile stage leaves it
                from torch2ms.runtime import msutil

                msutil.mindspore().set_context(mode=msutil.mindspore().PYNATIVE_MODE, enable_graph_kernel=False)
        bound = measured.bounds.get("logits") or next(iter(measured.bounds.values()))
        return judge(reference, free, forced, bound, self.noise(ctx, stage, reference, forced))

    def noise(self, ctx, stage, reference: Generated, forced: Generated) -> float:
        """The near-tie bound: ``max(check.noise_factor, 1)`` times the export stage's largest
        teacher-forced logit difference (onnxruntime's against transformers': two correct float32
        implementations), the export's own run for the export stage."""
        if stage.name == "export":
            measured = float(np.abs(forced.logits - reference.logits).max())
        else:
            export = ctx.run.read_record("export") or {}
            measured = export["extra"][self.name]["max_abs_logit_diff"]
        return max(self.noise_factor, 1.0) * measured

    def _folders(self, ctx, stage, out: Path) -> dict[str, Path]:
        """Per graph, the folder holding the stage's artifact (network.py for compile, which writes none)."""
        if stage.name != "compile":
            return {"prefill": self.prefill_root / stage.name, "decode": out}
        source = ctx.artifact("network.py").parent
        return {"prefill": self.prefill_root / source.name, "decode": source}


def judge(reference: Generated, free: Generated, forced: Generated, bound: dict, noise: float):
    """The violations and the record of a stage's generation (see the module docstring); ``noise``:
    the near-tie bound on the reference's top-2 gap."""
    diff = np.abs(forced.logits - reference.logits)
    gaps = top2_gaps(reference.logits)
    wrong = np.argwhere(forced.tokens != reference.tokens)  # (row, step)
    ties = [(int(r), int(s)) for r, s in wrong if gaps[r, s] <= noise]
    errors = [(int(r), int(s)) for r, s in wrong if gaps[r, s] > noise]
    steps = step_errors(reference, forced)
    worst = max(steps, key=lambda e: e.rel_error)
    first = first_divergence(reference, free)
    total = reference.tokens.size
    record = {
        "tokens_equal": f"{int((free.tokens == reference.tokens).sum())}/{total}",
        "teacher_forced_equal": f"{total - len(wrong)}/{total}",
        "first_difference": first.describe() if first else None,
        "near_tie_bound": noise,
        "near_ties": [_where(reference, forced, gaps, r, s) for r, s in ties],
        "worst_step": {"step": worst.step, "rel_error": worst.rel_error, "cosine": worst.cosine},
        "min_cosine": min(e.cosine for e in steps),
        "max_abs_logit_diff": float(diff.max()),
        "logits_bound": bound,
    }
    violations = []
    if errors:
        r, s = errors[0]
        violations.append(
            f"generation: {len(errors)} teacher-forced tokens differ from transformers' generate, the first "
            f"{_where(reference, forced, gaps, r, s)}; free-running {record['tokens_equal']} tokens equal"
            + (f", first difference at {first.describe()}" if first else "")
        )
    if worst.rel_error > bound["rel_error"] or record["min_cosine"] < bound["cosine"]:
        violations.append(
            f"generation: the logits of step {worst.step} are {worst.rel_error:.3g} from transformers' generate "
            f"(min cosine {record['min_cosine']:.6f}; bound {bound['rel_error']:.3g}, cosine {bound['cosine']:g})"
        )
    return violations, record


def _where(reference: Generated, forced: Generated, gaps, row: int, step: int) -> str:
    return (
        f"step {step}, row {row}: token {int(forced.tokens[row, step])} instead of "
        f"{int(reference.tokens[row, step])} (reference top-2 gap {float(gaps[row, step]):.3g})"
    )


def stage_generation(
    stage: str,
    folders: dict[str, Path],
    extra: dict,
    jit_level: str | None,
    prompts,
    batch: int,
    max_new_tokens: int,
    cache_length: int,
    teacher: np.ndarray,
    gears=None,
    checkpoints: dict | None = None,
) -> tuple[Generated, Generated]:
    """``(free-running, teacher-forced)`` greedy decoding with the stage's graphs (``graph_call``): each
    batch prefilled once, the prefill graph released, then the decode graph built and run twice."""
    from torch2ms.runtime.memory import release_freed

    checkpoints = checkpoints or {}
    call = graph_call(stage, "prefill", folders, extra, jit_level, checkpoints.get("prefill"))
    starts = prefill_batches(call, prompts, batch, max_new_tokens, cache_length, gears)
    del call
    release_freed()
    call = graph_call(stage, "decode", folders, extra, jit_level, checkpoints.get("decode"))
    return (
        decode_batches(call, starts, max_new_tokens, cache_length),
        decode_batches(call, starts, max_new_tokens, cache_length, teacher),
    )


def stage_runner(stage: str, folders: dict[str, Path], extra: dict, jit_level: str | None = None) -> Runner:
    """Both graphs as the stage runs them (``graph_call``), built at once: for a caller that times or
    alternates them (``generation.bench``)."""
    return Runner(*(graph_call(stage, g, folders, extra, jit_level) for g in ("prefill", "decode")))


def graph_call(
    stage: str, graph: str, folders: dict[str, Path], extra: dict, jit_level: str | None = None, checkpoint=None
):
    """The ``graph`` ("prefill", "decode") of ``folders`` as the stage runs it (see the module
    docstring), a function of numpy arrays; ``extra``: the decode graph's stage extra (the compile
    stage's chosen variant and its flags); ``checkpoint``: another checkpoint than the rebuild or fold
    stage's network.ckpt (``load-weights``')."""
    folder = folders[graph]
    if stage == "export":
        from torch2ms.generation.export import onnx_call

        return onnx_call(folder / "model.onnx", graph)
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    tag = f"generation_{stage}_{graph}"
    if stage in ("rebuild", "fold"):
        ms.set_context(mode=ms.PYNATIVE_MODE)
        if checkpoint:
            cell = msutil.load_network_module(folder / "network.py", tag).build(str(checkpoint))
        else:
            cell = msutil.build_network(folder, tag)
        return _cell_call(ms, cell, None)
    if stage == "compile":
        fused = extra.get("chosen") == "graph_kernel"
        mode = (True, extra.get("graph_kernel_flags") or "", jit_level) if fused else (False, "", jit_level)
        msutil.set_graph_mode(ms, *mode)
        return _cell_call(ms, msutil.build_network(folder, tag), mode)
    if stage == "mindir":
        from torch2ms.runtime import mindir_layout

        mode = (False, "", None)
        msutil.set_graph_mode(ms, *mode)
        return _cell_call(ms, ms.nn.GraphCell(ms.load(str(folder / mindir_layout.GRAPH))), mode)
    raise ValueError(f"no generation runner for stage {stage!r}")


def _cell_runner(ms, cells: dict, mode: tuple | None) -> Runner:
    """Both graphs' cells as a runner (``_cell_call`` each)."""
    return Runner(_cell_call(ms, cells["prefill"], mode), _cell_call(ms, cells["decode"], mode))


def _cell_call(ms, cell, mode: tuple | None):
    """A MindSpore cell as a function of numpy arrays: in PyNative (``mode`` None), else in GRAPH_MODE
    under ``mode`` (``msutil.set_graph_mode``'s graph_kernel, flags, jit_level), set before every call
    as the compile stage's variants do (the environment's flags are the process's)."""
    from torch2ms.runtime import msutil

    def call(*arrays):
        if mode is not None:
            msutil.set_graph_mode(ms, *mode)
        out = cell(*(ms.Tensor(np.ascontiguousarray(a)) for a in arrays))
        return tuple(o.asnumpy() for o in out)

    return call
