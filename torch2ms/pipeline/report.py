"""``report.json`` / ``report.md`` in the run folder and the summary table on the terminal."""

from __future__ import annotations

import math

from torch2ms.pipeline.runner import RunResult, framework_versions
from torch2ms.pipeline.workspace import atomic_write_text, write_json
from torch2ms.runtime import cpu_choice

COLUMNS = ("stage", "status", "seconds", "max abs err", "max rel err", "cosine", "notes")


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
    return stage.notes(rec) if stage is not None else ""


def rows(result: RunResult) -> list[tuple[str, ...]]:
    out = []
    for s in result.stages:
        rec = s.record
        w = (rec or {}).get("worst") or {}
        seconds = (
            "-"
            if s.status in ("disabled", "not run")
            else ("0 (cached)" if s.status == "up to date" else f"{rec.get('seconds', 0):.1f}")
        )
        out.append(
            (
                s.stage,
                s.status,
                seconds,
                _fmt(w.get("max_abs"), ".3g"),
                _fmt(w.get("rel_error"), ".3g"),
                _fmt(w.get("cosine"), ".7f"),
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
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(result)]
    if choice:
        lines += ["", f"CPU setting: ONEDNN_MAX_CPU_ISA={choice.isa} ({choice.source}: {choice.reason})."]
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()), ""]
    atomic_write_text(result.root / "report.md", "\n".join(lines))


def print_table(result: RunResult, console) -> None:
    from rich.table import Table

    table = Table(title=f"torch2ms convert: {result.recipe.name}", title_justify="left")
    for c in COLUMNS:
        table.add_column(c, justify="right" if c in ("seconds", "max abs err", "max rel err", "cosine") else "left")
    style = {"passed": "green", "up to date": "cyan", "failed": "bold red", "not run": "dim", "disabled": "dim"}
    for r in rows(result):
        table.add_row(*r, style=style.get(r[1]))
    console.print(table)
