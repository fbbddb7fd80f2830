"""``report.json`` / ``report.md`` in the run folder and the summary table on the terminal."""

from __future__ import annotations

import math

from torch2ms.pipeline.fingerprint import framework_versions
from torch2ms.pipeline.markdown import table
from torch2ms.pipeline.result import RunResult
from torch2ms.pipeline.workspace import atomic_write_text, write_json
from torch2ms.runtime.cpu import cpu_choice

COLUMNS = ("stage", "status", "seconds", "peak RSS MB", "max abs err", "max rel err", "cosine", "task", "notes")
NUMERIC = ("seconds", "peak RSS MB", "max abs err", "max rel err", "cosine")
# Task figures shown beside the gated agreement (key in TaskResult.figures -> label).
# Figures a task result may carry, shown after its gated agreement (ratios with 4 digits, counts whole).
TASK_FIGURES = {
    "top5_overlap": "top-5 overlap",
    "miou": "mIoU",
    "matched": "PyTorch detections matched",
    "detections": "of",
    "extra": "extra",
    "worst_position_agreement": "worst position",
    "mean_cosine": "mean",
}


def task_summary(task: dict | None, digits: int = 4) -> str:
    """One line for a stage's task result (stage.json ``task``): the gated agreement, then the
    figures in ``TASK_FIGURES``, e.g. ``top-1 agreement 1.0000, top-5 overlap 1.0000``."""
    if not task:
        return "-"
    figures = task.get("figures", {})
    parts = [f"{task['metric']} {task['agreement']:.{digits}f}"]
    for key, label in TASK_FIGURES.items():
        if key in figures:
            value = figures[key]
            parts.append(f"{label} {value}" if isinstance(value, int) else f"{label} {value:.{digits}f}")
    return ", ".join(parts)


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec) if math.isfinite(v) else str(v)


def _notes(stage, rec: dict | None) -> str:
    if not rec:
        return ""
    if rec.get("status") == "failed":
        return "; ".join(rec.get("violations", []))[:120]
    ev = rec.get("evidence") or {}
    if rec.get("status") == "not checkable":
        return f"not checkable: {ev.get('needed', [''])[0]}, no per-node evidence ({ev.get('why', '')})"[:160]
    if ev.get("by") == "replay":
        proof = f"replay: every node within {ev['local_bound']:g} (worst {ev['max_local_error']:.2g}, {ev['node']})"
        ref = ev.get("reference")
        if ref:  # divergence.arbitration: onnxruntime, not the code, off float64
            proof += (
                f"; {ref['max_rel_error']:.2g} from model.onnx in float64, onnxruntime "
                f"{ref['onnxruntime_rel_error']:.2g} (its own {ref['op']} {ref['node']})"
            )
        return "; ".join(n for n in (stage.notes(rec) if stage is not None else "", proof) if n)
    own = stage.notes(rec) if stage is not None else ""
    generation = (rec.get("extra") or {}).get("generation")  # a generation recipe's decode graph (generation.check)
    if generation:
        ties = len(generation["near_ties"])
        said = f"generation: {generation['tokens_equal']} tokens" + (f", {ties} near-ties" if ties else "")
        own = f"{own}; {said}" if own else said
    return own


def rows(result: RunResult) -> list[tuple[str, ...]]:
    out = []
    for s in result.stages:
        rec = s.record
        w = (rec or {}).get("worst") or {}
        ran = s.status not in ("disabled", "not run", "up to date")
        # run + check (``seconds_total``) where the record has it; a cached stage cost nothing now
        seconds = (
            "-"
            if s.status in ("disabled", "not run")
            else ("0 (cached)" if not ran else f"{rec.get('seconds_total', rec.get('seconds', 0)):.1f}")
        )
        peak = (rec or {}).get("memory", {}).get("peak_rss_mb") if ran else None
        out.append(
            (
                s.stage,
                s.status,
                seconds,
                _fmt(peak, ".0f"),
                _fmt(w.get("max_abs"), ".3g"),
                _fmt(w.get("rel_error"), ".3g"),
                _fmt(w.get("cosine"), ".7f"),
                task_summary((rec or {}).get("task")),
                _notes(s.declared, rec),
            )
        )
    return out


def write_reports(result: RunResult) -> None:
    choice = cpu_choice()
    data = {
        "recipe": result.recipe.name,
        "recipe_sha256": result.recipe.sha256(),
        "passed": result.passed,
        "seconds": round(result.seconds, 2),
        "cpu": choice.to_dict() if choice else None,
        "versions": framework_versions(),
        "stages": [
            {"stage": s.stage, "status": s.status, "reason": s.reason, "record": s.record} for s in result.stages
        ],
    }
    write_json(result.root / "report.json", data)
    lines = [
        f"# torch2ms report: {result.recipe.name}",
        "",
        f"**{'PASSED' if result.passed else 'FAILED'}** in {result.seconds:.1f} s. "
        f"Tolerance: relative error <= {result.recipe.check.rel_error:g}, cosine >= {result.recipe.check.cosine}; "
        f"{result.recipe.check.samples} sample(s), seed {result.recipe.check.seed}.",
        "",
        *table(COLUMNS, rows(result)),
    ]
    lines += _task_lines(result)
    if choice:
        lines += ["", f"CPU setting: ONEDNN_MAX_CPU_ISA={choice.isa} ({choice.source}: {choice.reason})."]
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()), ""]
    atomic_write_text(result.root / "report.md", "\n".join(lines))


def _task_lines(result: RunResult) -> list[str]:
    """Under the table: what the task column measures, its gate, and each stage's task notes."""
    if result.task_note is None:
        return []
    lines = ["", result.task_note]
    for s in result.stages:
        task = (s.record or {}).get("task") or {}
        b = task.get("gate") or {}
        if b.get("by", "recipe") != "recipe":
            lines.append(f"- {s.stage}: gate {b['agreement']:.4g}, widened to {b['by']}")
        lines += [f"- {s.stage}: {n}" for n in task.get("notes") or []]
    return lines


def print_table(result: RunResult, console) -> None:
    from rich.table import Table

    table = Table(title=f"torch2ms convert: {result.recipe.name}", title_justify="left")
    for c in COLUMNS:
        table.add_column(c, justify="right" if c in NUMERIC else "left")
    style = {"passed": "green", "up to date": "cyan", "failed": "bold red", "not run": "dim", "disabled": "dim"}
    for r in rows(result):
        table.add_row(*r, style=style.get(r[1]))
    console.print(table)
