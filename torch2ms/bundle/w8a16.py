"""The W8A16 plan of a ``text_generation`` recipe: its Linear weights int8 per output channel in the
prefill and decode MindIRs, the layers that break generation kept in float.

**What is quantized.** Every ``nn.Dense`` of the fold stage's two networks (``<run>/prefill/fold``,
``<run>/decode/fold``: the Linear layers of attention and MLP, and the ``lm_head``), symmetric int8
per output row, dequantized in the graph (``w8a16_cell.Int8Dense``: int8 Parameter -> Cast -> Mul by
the row's scale -> MatMul). The token embedding is a Gather, not a Linear, and stays float; a tied
``lm_head`` is quantized when the fold network holds it as its own ``nn.Dense`` (the export writes the
tied matrix's transpose as a constant of its own, so the tie does not survive into the networks:
quantizing the lm_head leaves the embedding's float copy as it was).

**Method.** A strategy of the precision planner (``precision.py``), its layers the dense layers by
path (the same in both graphs). The emulator (``W8A16Emulator``) loads each layer's fake-quantized
weight (``w8a16_cell.fake_quantized``: the float32 weight ``Int8Dense`` computes) or its float one
into the fold cells and runs the generation check's greedy loop (``generation.loop``) in GRAPH_MODE,
teacher-forced on fp32 PyTorch's tokens (``generation/reference.npz``: transformers' ``generate``), a
*sample* being one batch of the recipe's prompts. ``judge``: a plan meets the gate when the share
of teacher-forced steps whose top-1 token is the reference's is at least
``precision.w8a16_top1_agreement``; the figure ranked by is the worst step's logits
``max|a - r| / max|r|``. The plan's int8 MindIRs are exported, reloaded (``mindspore.load`` +
``nn.GraphCell``) and checked as the mindir stage checks generation (``generation.check``: free-running
and teacher-forced against the reference, the first difference recorded): those are the figures shipped.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.bundle import precision
from torch2ms.bundle.precision import SENSITIVITY_ROWS, Strategy, fmt, more_rows
from torch2ms.errors import RecipeError
from torch2ms.pipeline.markdown import table

GRAPHS = ("prefill", "decode")
PLAN_FILE = "w8a16_plan.json"
METHOD = (
    "the fold stage's MindSpore cells in GRAPH_MODE, every Linear (nn.Dense) weight either float32 or int8 "
    "(symmetric, per output channel, scale max|w|/127) dequantized to float32; greedy decoding teacher-forced "
    "on fp32 PyTorch's tokens"
)


def generation_setup(run_root: Path):
    """``(plan, reference)`` of a converted generation run: its ``generation.plan.Plan`` and
    transformers' tokens and logits (``generation.loop.Generated``)."""
    from torch2ms.generation.check import REFERENCE
    from torch2ms.generation.convert import PLAN
    from torch2ms.generation.graphs import Geometry
    from torch2ms.generation.loop import Generated
    from torch2ms.generation.plan import Plan

    folder = Path(run_root) / "generation"
    data = json.loads((folder / PLAN).read_text())
    plan = Plan(
        Geometry(**data["geometry"]),
        tuple(tuple(p) for p in data["prompts"]),
        data["batch"],
        data["max_new_tokens"],
        data["cache_length"],
        tuple(data.get("gears") or [max(len(p) for p in data["prompts"])]),  # a run from before the gears
    )
    with np.load(folder / REFERENCE) as f:
        return plan, Generated(f["tokens"], f["logits"])


def batches(reference, batch: int) -> list:
    """The reference cut into the planner's samples: one ``Generated`` per batch of prompts."""
    from torch2ms.generation.loop import Generated

    n = reference.tokens.shape[0]
    return [Generated(reference.tokens[i : i + batch], reference.logits[i : i + batch]) for i in range(0, n, batch)]


class W8A16Emulator:
    """The fold stage's prefill and decode cells with each dense layer's weight switchable between
    float and int8 (fake-quantized), and greedy decoding with them (see the module docstring)."""

    def __init__(self, run_root: Path, plan, reference, lm_head: bool = True):
        from torch2ms.bundle.w8a16_cell import dense_layers, fake_quantized, layer_key
        from torch2ms.generation.check import _cell_runner
        from torch2ms.runtime import msutil

        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)  # built as the fold stage builds them; run in GRAPH_MODE
        self.ms, self.plan, self.reference = ms, plan, reference
        cells = {g: msutil.build_network(Path(run_root) / g / "fold", f"w8a16_{g}") for g in GRAPHS}
        layers = {g: {layer_key(n): c for n, c in dense_layers(c)} for g, c in cells.items()}
        if sorted(layers["prefill"]) != sorted(layers["decode"]):
            raise ValueError("the prefill and decode fold networks have different dense layers")
        self.names = [n for n, _ in dense_layers(cells["decode"]) if lm_head or not is_lm_head(n)]
        self.labels = [n.removeprefix("model.") for n in self.names]
        self.op_types = ["Dense"] * len(self.names)
        self.params = [[layers[g][layer_key(n)].weight for g in GRAPHS] for n in self.names]
        self.float = [p[0].asnumpy() for p in self.params]
        self.int8 = [fake_quantized(w) for w in self.float]
        self.cells = cells
        # GRAPH_MODE without graph-kernel fusion, as the mindir stage exports: compiled once per graph, a
        # weight loaded with Parameter.set_data is the compiled graph's next input (PyNative would
        # dispatch every op of every decode step of every emulation)
        self.runner = _cell_runner(ms, cells, (False, "", None))
        self.low: frozenset[int] = frozenset()
        self.runs = 0

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
        from torch2ms.generation.loop import gear_for, greedy

        self.set_low(low)
        self.runs += 1
        p = self.plan
        out = []
        for k, ref in enumerate(batches(self.reference, p.batch)[:samples]):
            prompts = p.prompts[k * p.batch : (k + 1) * p.batch]
            gear = gear_for(p.gears, prompts)  # as the generation check pads each batch
            out.append(greedy(self.runner, prompts, p.max_new_tokens, p.cache_length, ref.tokens, gear))
        return out


def _example(ms, spec: dict, gears: bool):
    """An export input of ``graph_inputs``' ``spec``; with prompt ``gears`` its length (dimension 1:
    the prefill's ids and mask) dynamic, as the mindir stage exports a sequence-length profile."""
    if not gears:
        return ms.Tensor(np.zeros(spec["shape"], dtype=spec["dtype"]))
    shape = [None if k == 1 else d for k, d in enumerate(spec["shape"])]
    return ms.Tensor(shape=shape, dtype=ms.Tensor(np.zeros((), dtype=spec["dtype"])).dtype)


def judge(recipe, outputs: list, reference: list) -> dict:
    """Teacher-forced runs against the reference's batches: top-1 agreement, the worst step's logits
    error, and whether the agreement meets ``precision.w8a16_top1_agreement``."""
    from torch2ms.generation.compare import step_errors, top2_gaps
    from torch2ms.generation.loop import Generated

    ref = Generated(np.concatenate([r.tokens for r in reference]), np.concatenate([r.logits for r in reference]))
    got = Generated(np.concatenate([o.tokens for o in outputs]), np.concatenate([o.logits for o in outputs]))
    equal = int((got.tokens == ref.tokens).sum())
    agreement = equal / ref.tokens.size
    error = max(e.rel_error for e in step_errors(ref, got))
    wrong = np.argwhere((got.tokens != ref.tokens).T)  # (step, row), step-major
    first = None
    if len(wrong):
        step, row = (int(i) for i in wrong[0])
        gap = float(top2_gaps(ref.logits[row, step]))
        first = f"step {step}, row {row}: token {int(got.tokens[row, step])} instead of {int(ref.tokens[row, step])} "
        first += f"(reference top-2 gap {gap:.3g})"
    return {
        "error": error if math.isfinite(error) else "inf",
        "top1_agreement": round(agreement, 6),
        "teacher_forced_equal": f"{equal}/{ref.tokens.size}",
        "first_mismatch": first,
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


def search(recipe, emu) -> tuple[list[str], dict]:
    """The dense layers kept in float (paths, most sensitive first) and the search's record."""
    samples = batches(emu.reference, emu.plan.batch)
    found = precision.search_layers(W8A16, recipe, emu, samples, exhaustive=False)
    sens = precision.sensitivity(W8A16, found, emu)
    record = {
        "search": precision.search_record(W8A16, found, exhaustive=False),
        "before": found.before.detail,
        "after": found.verdict.detail,
        "sensitivity": sens,
    }
    return [emu.names[i] for i in found.keep], record


def export_mindirs(emu: W8A16Emulator, out: Path, int8: list[str] | None) -> dict[str, list[Path]]:
    """The emulator's two networks as MindIRs in ``out/<graph>/`` (``mindir_layout``), every weight
    float and the dense layers ``int8`` (paths) replaced by ``Int8Dense`` (for good: the emulator's
    cells are W8A16 afterwards); ``None``: all float (the fp32 MindIRs). Exported in GRAPH_MODE without
    graph-kernel fusion, as the mindir stage does. Returns each graph's files."""
    from torch2ms.generation.convert import graph_inputs
    from torch2ms.runtime import mindir_layout, msutil

    ms = emu.ms
    emu.set_low(())
    written = {}
    for graph, cell in emu.cells.items():
        if int8:
            from torch2ms.bundle.w8a16_cell import quantize_network

            quantize_network(cell, int8)
            cell.compile_cache.clear()  # else mindspore.export reuses the graph compiled before the rewrite
        msutil.set_graph_mode(ms)
        gears = graph == "prefill" and len(emu.plan.gears) > 1
        example = [_example(ms, i, gears) for i in graph_inputs(graph, emu.plan)]
        folder = Path(out) / graph
        folder.mkdir(parents=True, exist_ok=True)
        written[graph] = mindir_layout.export(ms, cell, *example, folder=folder)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return written


def check_mindirs(out: Path, plan, reference) -> tuple[list[str], dict]:
    """The reloaded MindIRs in ``out/<graph>/`` generating, against the reference: free-running and
    teacher-forced, judged by the generation check (``generation.check.judge``) with no near-tie
    allowance; ``(violations, record)``."""
    from torch2ms.generation.check import judge as judge_generation
    from torch2ms.generation.check import stage_runner
    from torch2ms.generation.loop import greedy_batches
    from torch2ms.runtime import msutil

    runner = stage_runner("mindir", {g: Path(out) / g for g in GRAPHS}, {})
    try:
        args = (plan.prompts, plan.batch, plan.max_new_tokens, plan.cache_length)
        free = greedy_batches(runner, *args, gears=plan.gears)
        forced = greedy_batches(runner, *args, teacher=reference.tokens, gears=plan.gears)
    finally:
        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    violations, record = judge_generation(reference, free, forced, {"rel_error": math.inf, "cosine": -1.0}, 0.0)
    record.pop("logits_bound")
    record.pop("near_tie_bound")
    record.pop("near_ties")
    record["top1_agreement"] = round(float((forced.tokens == reference.tokens).mean()), 6)
    return violations, record


def is_lm_head(name: str) -> bool:
    """Whether the dense layer at path ``name`` is the output projection to the vocabulary."""
    key = name.replace(".", "_")  # either layout's name (w8a16_cell.layer_key)
    return key == "lm_head" or key.endswith("_lm_head")


def _bytes(files) -> int:
    return sum(Path(f).stat().st_size for f in files)


def fp32_mindirs(run_root: Path, out: Path, emu: W8A16Emulator) -> dict[str, int]:
    """The fp32 MindIRs' bytes per graph: the run's mindir stage's when it ran, else exported from
    the fold networks into ``out/fp32`` (before ``export_mindirs`` makes them W8A16)."""
    from torch2ms.runtime import mindir_layout

    stages = {g: Path(run_root) / g / "mindir" for g in GRAPHS}
    if all((s / mindir_layout.GRAPH).is_file() for s in stages.values()):
        return {g: _bytes(mindir_layout.files(s)) for g, s in stages.items()}
    return {g: _bytes(f) for g, f in export_mindirs(emu, Path(out) / "fp32", None).items()}


def sizes(fp32: dict[str, int], emu: W8A16Emulator, written: dict) -> dict:
    """The MindIRs' bytes, fp32 against W8A16, and the Linear weights' share of the fp32 ones."""
    w8 = {g: _bytes(f) for g, f in written.items()}
    linear = sum(w.nbytes for w in emu.float)
    total = sum(fp32.values())
    return {
        "fp32_bytes": fp32,
        "w8a16_bytes": w8,
        "ratio": round(sum(w8.values()) / total, 4),
        "linear_fp32_bytes_per_graph": linear,
        "linear_share": round(len(GRAPHS) * linear / total, 4),
    }


def make_plan(recipe, run_root: Path, out: Path, log: Callable = print, lm_head: bool = True) -> dict:
    """The W8A16 plan of a run converted up to the fold stage (module docstring): the search, the int8
    MindIRs written to ``out/<graph>/`` and their reloaded check, the sizes; ``lm_head`` False keeps
    the lm_head float."""
    t0 = time.perf_counter()
    plan, reference = generation_setup(run_root)
    emu = W8A16Emulator(run_root, plan, reference, lm_head)
    keep, record = search(recipe, emu)
    log(
        f"w8a16 plan: {len(emu.names)} Linear layers; all in int8: {record['before']['teacher_forced_equal']} "
        f"teacher-forced tokens equal; {len(keep)} kept in float"
    )
    int8 = [n for n in emu.names if n not in keep]
    fp32 = fp32_mindirs(run_root, out, emu)
    written = export_mindirs(emu, out, int8)
    violations, generation = check_mindirs(out, plan, reference)
    figures = sizes(fp32, emu, written)
    log(f"w8a16 plan: MindIRs {figures['ratio']}x fp32; reloaded: {generation['tokens_equal']} tokens equal")
    return {
        "method": METHOD,
        **record,
        "bound": {"w8a16_top1_agreement": recipe.precision.w8a16_top1_agreement},
        "samples": len(batches(reference, plan.batch)),
        "layers": len(emu.names),
        "lm_head": "int8" if lm_head and any(map(is_lm_head, int8)) else "float",
        "embedding": "float (a Gather, not a Linear)",
        "keep_float": [emu.labels[emu.names.index(n)] for n in keep],
        "int8": [emu.labels[emu.names.index(n)] for n in int8],
        "mindir": {**figures, "files": {g: [str(p) for p in f] for g, f in written.items()}},
        "generation": generation,
        "violations": violations,
        "emulations": emu.runs,
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


def _first(judged: dict) -> str:
    return judged.get("first_mismatch") or "none"


def plan_markdown(plan: dict, name: str) -> str:
    """precision.md of a W8A16 plan: the sizes, the agreement figures, the layers kept in float."""
    m, g = plan["mindir"], plan["generation"]
    fp32, w8 = sum(m["fp32_bytes"].values()), sum(m["w8a16_bytes"].values())
    lines = [
        f"# W8A16 plan: {name}",
        "",
        f"Method: {plan['method']}. Gate: teacher-forced top-1 agreement >= {plan['bound']['w8a16_top1_agreement']}.",
        f"Search: {plan['search']['how']}.",
        "",
        *table(
            ["", "fp32", "W8A16", "ratio"],
            [["MindIRs (prefill + decode), bytes", str(fp32), str(w8), f"{m['ratio']:.3f}"]],
        ),
        "",
        f"Linear weights: {m['linear_share']:.1%} of the fp32 MindIRs; lm_head {plan['lm_head']}; "
        f"embedding {plan['embedding']}.",
        "",
        *table(
            ["run", "teacher-forced equal", "tokens equal (free-running)", "first difference"],
            [
                ["all Linear in int8 (emulated)", plan["before"]["teacher_forced_equal"], "-", _first(plan["before"])],
                ["the plan (emulated)", plan["after"]["teacher_forced_equal"], "-", _first(plan["after"])],
                [
                    "the plan, reloaded MindIRs",
                    g["teacher_forced_equal"],
                    g["tokens_equal"],
                    g["first_difference"] or "none",
                ],
            ],
        ),
        "",
        f"Kept in float ({len(plan['keep_float'])} of {plan['layers']}): " + (", ".join(plan["keep_float"]) or "none"),
        "",
    ]
    rows = [[s["label"], fmt(s["error"]), s["measured"]] for s in plan["sensitivity"][:SENSITIVITY_ROWS]]
    if rows:
        lines += [
            "Sensitivity (worst step's logits rel error, the layer's block alone in int8):",
            "",
            *table(["layer", "rel error", "measured"], rows + more_rows(plan, 3)),
            "",
        ]
    return "\n".join(lines)
