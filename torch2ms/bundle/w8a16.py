"""The W8A16 plan of a ``text_generation`` recipe: its Linear weights and token embeddings int8 per
row in the prefill and decode MindIRs, the layers that break generation kept in float.

**What is quantized.** Every ``nn.Dense`` of the fold stage's two networks (``<run>/prefill/fold``,
``<run>/decode/fold``: the Linear layers of attention and MLP, and the ``lm_head``), symmetric int8
per output row, dequantized in the graph (``w8a16_cell.Int8Dense``: int8 Parameter -> Cast -> Mul by
the row's scale -> MatMul); and every gathered table (``w8a16_cell.gather_tables``: the token
embedding, GPT-2's learned positions), int8 per row, its rows and scales gathered, then Cast and Mul.
A tied ``lm_head`` is its own ``nn.Dense`` in the fold networks (the export writes the tied matrix's
transpose as a constant of its own), so it and the embedding are quantized each on its own.

**Method.** A strategy of the precision planner (``precision.py``), its layers the dense layers and
tables by path (the same in both graphs). The emulator (``W8A16Emulator``) loads each layer's
fake-quantized weight (``w8a16_cell.fake_quantized``: the float32 weight the int8 graph computes) or
its float one into the fold cells and runs the generation check's greedy loop (``generation.loop``)
in GRAPH_MODE, teacher-forced on fp32 PyTorch's tokens (``generation/reference.npz``: transformers'
``generate``), a *sample* being one batch of the recipe's prompts. ``judge``: a plan meets the gate
when the share of teacher-forced steps whose top-1 token is the reference's, near-ties counted as
agreeing, is at least ``precision.w8a16_top1_agreement``; the figure ranked by is the worst step's
logits ``max|a - r| / max|r|``.

**Near-ties.** int8 weights cannot hold a choice closer than their own rounding moves it. The int8
noise floor (``W8A16Emulator.noise_floor``) is measured, not derived from the plan's own error: every
weight moved by independent uniform noise within +-scale/2 per element (int8's step, not its
rounding), ``NOISE_DRAWS`` seeded draws, the largest move of the reference's top-2 gap over every
teacher-forced step. A differing step whose reference top-2 gap is within it is a near-tie, listed;
teacher forcing goes on from the reference's token. Only while near-ties are rare: when more than
``precision.w8a16_near_tie_share`` of the reference's steps are within the floor (weights whose int8
step is large against the logits' gaps), there are no near-ties and every differing step counts.

The plan's int8 MindIRs are exported, reloaded (``mindspore.load`` + ``nn.GraphCell``) and checked
as the mindir stage checks generation (``generation.check``: free-running and teacher-forced against
the reference, the first difference and the near-ties recorded): those are the figures shipped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.bundle import precision
from torch2ms.bundle.precision import Strategy
from torch2ms.errors import RecipeError

GRAPHS = ("prefill", "decode")
NOISE_DRAWS = 2  # seeded draws of int8-sized weight noise for the near-tie bound (noise_floor)
PLAN_FILE = "w8a16_plan.json"
METHOD = (
    "the fold stage's MindSpore cells in GRAPH_MODE, every Linear (nn.Dense) weight and gathered table (token "
    "embedding) either float32 or int8 (symmetric, per row, scale max|w|/127) dequantized to float32; greedy "
    "decoding teacher-forced on fp32 PyTorch's tokens"
)


def generation_setup(run_root: Path):
    """``(plan, reference)`` of a converted generation run: its ``generation.plan.Plan`` and
    transformers' tokens and logits (``generation.loop.Generated``)."""
    from torch2ms.generation.check import REFERENCE
    from torch2ms.generation.loop import Generated
    from torch2ms.generation.plan import read_plan

    with np.load(Path(run_root) / "generation" / REFERENCE) as f:
        return read_plan(run_root), Generated(f["tokens"], f["logits"])


def batches(reference, batch: int) -> list:
    """The reference cut into the planner's samples: one ``Generated`` per batch of prompts."""
    from torch2ms.generation.loop import Generated

    n = reference.tokens.shape[0]
    return [Generated(reference.tokens[i : i + batch], reference.logits[i : i + batch]) for i in range(0, n, batch)]


class W8A16Emulator:
    """The fold stage's prefill and decode cells with each dense layer's weight switchable between
    float and int8 (fake-quantized), and greedy decoding with them (see the module docstring)."""

    def __init__(self, run_root: Path, plan, reference, lm_head: bool = True):
        from torch2ms.bundle.w8a16_cell import dense_layers, fake_quantized, gather_tables, layer_key
        from torch2ms.generation.check import _cell_runner
        from torch2ms.runtime import msutil

        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)  # built as the fold stage builds them; run in GRAPH_MODE
        self.ms, self.plan, self.reference = ms, plan, reference
        cells = {g: msutil.build_network(Path(run_root) / g / "fold", f"w8a16_{g}") for g in GRAPHS}
        layers = {g: {layer_key(n): c.weight for n, c in dense_layers(c)} for g, c in cells.items()}
        tables = {g: {layer_key(n): getattr(o, a) for n, o, a in gather_tables(c)} for g, c in cells.items()}
        for kind, found in (("dense layers", layers), ("gathered tables", tables)):
            if sorted(found["prefill"]) != sorted(found["decode"]):
                raise ValueError(f"the prefill and decode fold networks have different {kind}")
        dense = [n for n, _ in dense_layers(cells["decode"]) if lm_head or not is_lm_head(n)]
        gathered = [n for n, _, _ in gather_tables(cells["decode"])]
        self.names = dense + gathered
        self.labels = [n.removeprefix("model.") for n in self.names]
        self.op_types = ["Dense"] * len(dense) + ["Gather"] * len(gathered)
        found = {g: {**layers[g], **tables[g]} for g in GRAPHS}
        self.params = [[found[g][layer_key(n)] for g in GRAPHS] for n in self.names]
        self.float = [p[0].asnumpy() for p in self.params]
        self.int8 = [fake_quantized(w) for w in self.float]
        self.cells = cells
        # GRAPH_MODE without graph-kernel fusion, as the mindir stage exports: compiled once per graph, a
        # weight loaded with Parameter.set_data is the compiled graph's next input (PyNative would
        # dispatch every op of every decode step of every emulation)
        self.runner = _cell_runner(ms, cells, (False, "", None))
        self.low: frozenset[int] = frozenset()
        self.runs = 0

    def tables(self) -> list[str]:
        """The paths of the gathered tables (token embeddings) among the layers."""
        return [n for n, op in zip(self.names, self.op_types) if op == "Gather"]

    def set_low(self, low) -> None:
        """Load the int8 weight into the layers ``low`` (indices), the float one into the others."""
        low = frozenset(low)
        for i in low ^ self.low:
            value = self.ms.Tensor(self.int8[i] if i in low else self.float[i])
            for param in self.params[i]:
                param.set_data(value)
        self.low = low

    def run(self, low, samples: int) -> list:
        """Teacher-forced greedy decoding of the first ``samples`` batches with ``low`` in int8."""
        self.set_low(low)
        self.runs += 1
        return self._forced(samples)

    def _forced(self, samples: int) -> list:
        from torch2ms.generation.loop import gear_for, greedy

        p = self.plan
        out = []
        for k, ref in enumerate(batches(self.reference, p.batch)[:samples]):
            prompts = p.prompts[k * p.batch : (k + 1) * p.batch]
            gear = gear_for(p.gears, prompts)  # as the generation check pads each batch
            out.append(greedy(self.runner, prompts, p.max_new_tokens, p.cache_length, ref.tokens, gear))
        return out

    def noise_floor(self, draws: int = NOISE_DRAWS) -> dict:
        """The int8 noise floor (module docstring): the largest move of the reference's top-2 gap when
        every layer's weight is moved by an independent uniform draw within +-scale/2 per element
        (the size of int8's rounding, not its values), over ``draws`` seeded draws, teacher-forced on
        every batch; the weights are float again afterwards."""
        from torch2ms.bundle.w8a16_cell import row_scales

        rng = np.random.default_rng(0)
        ref = np.concatenate([r.logits for r in batches(self.reference, self.plan.batch)])
        top = np.argsort(ref, axis=-1)[..., -2:]  # [N, steps, 2]: the reference's second and first
        ref_gap = np.take_along_axis(ref, top[..., 1:], -1) - np.take_along_axis(ref, top[..., :1], -1)
        scales = [row_scales(w) for w in self.float]
        moves = []
        for _ in range(draws):
            for w, scale, params in zip(self.float, scales, self.params):
                moved = w + rng.uniform(-0.5, 0.5, w.shape).astype(np.float32) * scale
                for param in params:
                    param.set_data(self.ms.Tensor(moved))
            self.runs += 1
            got = np.concatenate([o.logits for o in self._forced(len(batches(self.reference, self.plan.batch)))])
            gap = np.take_along_axis(got, top[..., 1:], -1) - np.take_along_axis(got, top[..., :1], -1)
            moves.append(float(np.abs(gap - ref_gap).max()))
        self.low = frozenset(range(len(self.names)))  # every weight changed: set_low(()) reloads them all
        self.set_low(())
        return {"draws": draws, "max_gap_move": max(moves), "per_draw": moves}


def _example(ms, spec: dict, gears: bool):
    """An export input of ``graph_inputs``' ``spec``; with prompt ``gears`` its length (dimension 1:
    the prefill's ids and mask) dynamic, as the mindir stage exports a sequence-length profile."""
    if not gears:
        return ms.Tensor(np.zeros(spec["shape"], dtype=spec["dtype"]))
    shape = [None if k == 1 else d for k, d in enumerate(spec["shape"])]
    return ms.Tensor(shape=shape, dtype=ms.Tensor(np.zeros((), dtype=spec["dtype"])).dtype)


def judge(recipe, outputs: list, reference: list, near_tie: float = 0.0) -> dict:
    """Teacher-forced runs against the reference's batches: top-1 agreement, the near-ties (a step
    whose token differs where the reference's top-2 gap is within ``near_tie``, the int8 noise floor),
    the worst step's logits error, and whether the agreement, near-ties counted as agreeing, meets
    ``precision.w8a16_top1_agreement``."""
    from torch2ms.generation.compare import step_errors, top2_gaps
    from torch2ms.generation.loop import Generated

    ref = Generated(np.concatenate([r.tokens for r in reference]), np.concatenate([r.logits for r in reference]))
    got = Generated(np.concatenate([o.tokens for o in outputs]), np.concatenate([o.logits for o in outputs]))
    equal = int((got.tokens == ref.tokens).sum())
    gaps = top2_gaps(ref.logits)
    wrong = np.argwhere((got.tokens != ref.tokens).T)  # (step, row), step-major
    ties = [(int(s), int(r)) for s, r in wrong if gaps[r, s] <= near_tie]
    beyond = [(int(s), int(r)) for s, r in wrong if gaps[r, s] > near_tie]
    agreement = (equal + len(ties)) / ref.tokens.size
    error = max(e.rel_error for e in step_errors(ref, got))

    def where(step: int, row: int) -> str:
        return (
            f"step {step}, row {row}: token {int(got.tokens[row, step])} instead of {int(ref.tokens[row, step])} "
            f"(reference top-2 gap {float(gaps[row, step]):.3g})"
        )

    return {
        "error": error if math.isfinite(error) else "inf",
        "top1_agreement": round(agreement, 6),
        "teacher_forced_equal": f"{equal}/{ref.tokens.size}",
        "near_ties": [where(*t) for t in ties],
        "first_mismatch": where(*beyond[0]) if beyond else None,
        "ok": bool(agreement >= recipe.precision.w8a16_top1_agreement),
    }


def _unreachable(recipe, judged: dict) -> RecipeError:
    return RecipeError(
        f"precision.w8a16_top1_agreement: even with every Linear in float the fold networks' teacher-forced top-1 "
        f"agreement is {judged['top1_agreement']} (< {recipe.precision.w8a16_top1_agreement:g})",
        hint="the fold stage does not generate PyTorch's tokens: see its generation check; or lower the gate",
    )


W8A16 = Strategy(
    name="w8a16 plan",
    high="float",
    low="int8",
    figure="error",
    judge=judge,
    run=lambda emu, low, samples: emu.run(low, samples),
    negligible=lambda recipe: 0.0,  # the gate is on tokens: every block with an error is worth splitting
    unreachable=_unreachable,
)


def search(recipe, emu, near_tie: float) -> tuple[list[str], dict]:
    """The layers kept in float (paths, most sensitive first) and the search's record; ``near_tie``:
    the int8 noise floor under which a differing step is a near-tie (``judge``)."""
    strategy = dataclasses.replace(W8A16, judge=functools.partial(judge, near_tie=near_tie))
    samples = batches(emu.reference, emu.plan.batch)
    found = precision.search_layers(strategy, recipe, emu, samples, exhaustive=False)
    sens = precision.sensitivity(strategy, found, emu)
    record = {
        "search": precision.search_record(strategy, found, exhaustive=False),
        "before": found.before.detail,
        "after": found.verdict.detail,
        "sensitivity": sens,
    }
    return [emu.names[i] for i in found.keep], record


def export_mindirs(run_root: Path, graph: str, out: Path, dense: list[str], tables: list[str]) -> list[Path]:
    """The fold stage's ``graph`` network as a MindIR in ``out/<graph>/`` (``mindir_layout``), the dense
    layers ``dense`` replaced by ``Int8Dense`` and the gathered tables ``tables`` by their int8 rows
    (``quantize_tables``, the rewritten classes' source in ``out/source/<graph>``), every other weight
    float (both empty: the fp32 MindIR). Exported in GRAPH_MODE without graph-kernel fusion, as the
    mindir stage does. Built from the fold checkpoint, not from the emulator's cells: it runs in a
    process of its own (``make_plan``). Returns the files written."""
    from torch2ms.bundle.w8a16_cell import quantize_network, quantize_tables
    from torch2ms.generation.convert import graph_inputs
    from torch2ms.generation.plan import read_plan
    from torch2ms.runtime import mindir_layout, msutil

    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)  # built as the fold stage builds it
    plan = read_plan(run_root)
    cell = msutil.build_network(Path(run_root) / graph / "fold", f"w8a16_export_{graph}")
    quantize_network(cell, dense)
    quantize_tables(cell, tables, Path(out) / "source" / graph)
    msutil.set_graph_mode(ms)
    gears = graph == "prefill" and len(plan.gears) > 1
    example = [_example(ms, i, gears) for i in graph_inputs(graph, plan)]
    folder = Path(out) / graph
    folder.mkdir(parents=True, exist_ok=True)
    return mindir_layout.export(ms, cell, *example, folder=folder)


def check_mindirs(out: Path, plan, reference, near_tie: float) -> tuple[list[str], dict]:
    """The reloaded MindIRs in ``out/<graph>/`` generating, against the reference: free-running and
    teacher-forced, judged by the generation check (``generation.check.judge``), a differing step
    whose reference top-2 gap is within ``near_tie`` (the int8 noise floor) a near-tie; ``(violations,
    record)``."""
    from torch2ms.generation.check import judge as judge_generation
    from torch2ms.generation.check import stage_generation
    from torch2ms.runtime import msutil

    folders = {g: Path(out) / g for g in GRAPHS}
    try:  # as the mindir stage checks its MindIRs: one graph loaded at a time
        args = (plan.prompts, plan.batch, plan.max_new_tokens, plan.cache_length, reference.tokens)
        free, forced = stage_generation("mindir", folders, {}, None, *args, gears=plan.gears)
    finally:
        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    bound = {"rel_error": math.inf, "cosine": -1.0}
    violations, record = judge_generation(reference, free, forced, bound, near_tie)
    record.pop("logits_bound")
    record["top1_agreement"] = round(float((forced.tokens == reference.tokens).mean()), 6)
    return violations, record


def is_lm_head(name: str) -> bool:
    """Whether the dense layer at path ``name`` is the output projection to the vocabulary."""
    key = name.replace(".", "_")  # either layout's name (w8a16_cell.layer_key)
    return key == "lm_head" or key.endswith("_lm_head")


def _bytes(files) -> int:
    return sum(Path(f).stat().st_size for f in files)


def fp32_mindirs(run_root: Path, out: Path) -> dict[str, int]:
    """The fp32 MindIRs' bytes per graph: the run's mindir stage's when it ran, else exported from
    the fold networks into ``out/fp32``, each in a process of its own."""
    from torch2ms.runtime import mindir_layout
    from torch2ms.runtime.fresh import call_fresh

    stages = {g: Path(run_root) / g / "mindir" for g in GRAPHS}
    if all((s / mindir_layout.GRAPH).is_file() for s in stages.values()):
        return {g: _bytes(mindir_layout.files(s)) for g, s in stages.items()}
    fp32 = Path(out) / "fp32"
    return {g: _bytes(call_fresh(f"the fp32 {g} MindIR", export_mindirs, run_root, g, fp32, [], [])) for g in GRAPHS}


def sizes(fp32: dict[str, int], per_graph: dict[str, int], written: dict) -> dict:
    """The MindIRs' bytes, fp32 against W8A16, and the Linear weights' and tables' share of the fp32
    ones (``per_graph``: their float bytes in one graph, by op type ``Dense`` and ``Gather``)."""
    w8 = {g: _bytes(f) for g, f in written.items()}
    total = sum(fp32.values())
    return {
        "fp32_bytes": fp32,
        "w8a16_bytes": w8,
        "ratio": round(sum(w8.values()) / total, 4),
        "linear_fp32_bytes_per_graph": per_graph["Dense"],
        "linear_share": round(len(GRAPHS) * per_graph["Dense"] / total, 4),
        "tables_fp32_bytes_per_graph": per_graph["Gather"],
        "tables_share": round(len(GRAPHS) * per_graph["Gather"] / total, 4),
    }


def near_tie_record(recipe, reference, floor: dict) -> dict:
    """How rare near-ties are in the reference (its top-2 gaps against the int8 noise floor) and the
    near-tie bound that follows: the floor while at most ``precision.w8a16_near_tie_share`` of the
    steps are within it, else 0 (no near-ties)."""
    from torch2ms.generation.compare import top2_gaps

    gaps = top2_gaps(reference.logits)
    q = np.quantile(gaps, [0.01, 0.1, 0.5])
    within = int((gaps <= floor["max_gap_move"]).sum())
    rare = within <= recipe.precision.w8a16_near_tie_share * gaps.size
    return {
        **floor,
        "bound": floor["max_gap_move"] if rare else 0.0,
        "rare": bool(rare),
        "share_limit": recipe.precision.w8a16_near_tie_share,
        "steps": int(gaps.size),
        "steps_within": within,
        "gaps": {"min": float(gaps.min()), "p1": float(q[0]), "p10": float(q[1]), "p50": float(q[2])},
    }


def searched(recipe, run_root: Path, lm_head: bool) -> dict:
    """The plan's search (module docstring) on the emulator: the layers, which stay float, the
    near-tie record, the search's record, and the layers' float bytes per op type."""
    plan, reference = generation_setup(run_root)
    emu = W8A16Emulator(run_root, plan, reference, lm_head)
    ties = near_tie_record(recipe, reference, emu.noise_floor())
    keep, record = search(recipe, emu, ties["bound"])
    weights = {op: sum(w.nbytes for w, o in zip(emu.float, emu.op_types) if o == op) for op in ("Dense", "Gather")}
    return {
        "names": emu.names,
        "labels": emu.labels,
        "tables": emu.tables(),
        "keep": keep,
        "ties": ties,
        "record": record,
        "weights": weights,
        "runs": emu.runs,
    }


def make_plan(recipe, run_root: Path, out: Path, log: Callable = print, lm_head: bool = True) -> dict:
    """The W8A16 plan of a run converted up to the fold stage (module docstring): the search, the int8
    MindIRs written to ``out/<graph>/`` and their reloaded check, the sizes; ``lm_head`` False keeps
    the lm_head float. The search and each graph's export run in processes of their own
    (``runtime.fresh``): the emulator holds both networks, their float and int8 weights and their
    compiled graphs, which a MindIR export beside them would add to."""
    from torch2ms.runtime.fresh import call_fresh

    t0 = time.perf_counter()
    plan, reference = generation_setup(run_root)
    found = call_fresh("the w8a16 plan's search", searched, recipe, run_root, lm_head)
    ties, record, keep, tables = found["ties"], found["record"], found["keep"], found["tables"]
    log(
        f"w8a16 plan: {len(found['names'])} layers ({len(tables)} gathered tables); int8 noise floor "
        f"{ties['max_gap_move']:.3g} ({ties['steps_within']}/{ties['steps']} reference steps' top-2 gaps within it"
        f"{'' if ties['rare'] else ': not rare, no near-ties'}); "
        f"all in int8: {record['before']['teacher_forced_equal']} teacher-forced tokens equal, "
        f"{len(record['before']['near_ties'])} near-ties; {len(keep)} kept in float"
    )
    int8 = [n for n in found["names"] if n not in keep]
    fp32 = fp32_mindirs(run_root, out)
    dense, int8_tables = [n for n in int8 if n not in tables], [n for n in int8 if n in tables]
    written = {
        g: call_fresh(f"the w8a16 {g} MindIR", export_mindirs, run_root, g, out, dense, int8_tables) for g in GRAPHS
    }
    violations, generation = check_mindirs(out, plan, reference, ties["bound"])
    figures = sizes(fp32, found["weights"], written)
    log(f"w8a16 plan: MindIRs {figures['ratio']}x fp32; reloaded: {generation['tokens_equal']} tokens equal")
    label = dict(zip(found["names"], found["labels"]))
    return {
        "method": METHOD,
        **record,
        "bound": {"w8a16_top1_agreement": recipe.precision.w8a16_top1_agreement},
        "near_tie": ties,
        "samples": len(batches(reference, plan.batch)),
        "layers": len(found["names"]),
        "lm_head": "int8" if lm_head and any(map(is_lm_head, int8)) else "float",
        "embedding": {label[n]: "int8" if n in int8 else "float" for n in tables},
        "keep_float": [label[n] for n in keep],
        "int8": [label[n] for n in int8],
        "mindir": {**figures, "files": {g: [str(p) for p in f] for g, f in written.items()}},
        "generation": generation,
        "violations": violations,
        "emulations": found["runs"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def plan_key(recipe, run_root: Path, lm_head: bool) -> str:
    """What decides the plan: both graphs' ONNX and fold networks, the reference, the gate, the code."""
    from torch2ms.bundle import w8a16_cell
    from torch2ms.generation.check import REFERENCE
    from torch2ms.pipeline.workspace import sha256_file

    root = Path(run_root)
    folds = {g: [sha256_file(root / g / "fold" / f) for f in ("network.py", "network.ckpt")] for g in GRAPHS}
    return precision.plan_key(
        recipe,
        root / "decode" / "export" / "model.onnx",
        root / "generation" / REFERENCE,
        __file__,
        prefill_onnx=sha256_file(root / "prefill" / "export" / "model.onnx"),
        folds=folds,
        cell=sha256_file(Path(w8a16_cell.__file__)),
        gate=recipe.precision.w8a16_top1_agreement,
        near_tie_share=recipe.precision.w8a16_near_tie_share,
        lm_head=lm_head,
    )


def w8a16_mindirs(recipe, run_dir: Path, out_dir: Path, log: Callable = print, lm_head: bool = True) -> dict:
    """The bundle's seam: the W8A16 prefill and decode MindIRs of a generation run converted up to the
    fold stage (``run_dir``: ``<output>/<name>``), written to ``out_dir/<graph>/network.mindir`` with the
    plan ``out_dir/w8a16_plan.json`` (reused while ``plan_key`` is the same and the files are there).
    Returns ``{"prefill": path, "decode": path, "plan": path}``."""
    from torch2ms.runtime import mindir_layout

    out_dir = Path(out_dir)
    key = plan_key(recipe, run_dir, lm_head)
    graphs = {g: out_dir / g / mindir_layout.GRAPH for g in GRAPHS}
    if not all(p.is_file() for p in graphs.values()):
        (out_dir / PLAN_FILE).unlink(missing_ok=True)
    precision.cached_plan(
        out_dir / PLAN_FILE, key, lambda: make_plan(recipe, run_dir, out_dir, log, lm_head), "w8a16 plan", log
    )
    return {**graphs, "plan": out_dir / PLAN_FILE}
