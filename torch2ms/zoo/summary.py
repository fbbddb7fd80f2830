"""``summary.json``, ``summary.md`` and ``summary.html`` of a zoo run: one table per model, the
failure categories, "what blocks the most models" (``torch2ms.zoo.failures``) and the disk used,
three formats; and ``compare``, which models started or stopped passing between two runs.

The markdown and HTML tables are rendered from the same data as the JSON, so they always agree.
Every file is written to a temp name and renamed into place.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

from torch2ms.pipeline.fingerprint import framework_versions
from torch2ms.pipeline.markdown import cell, table
from torch2ms.pipeline.workspace import atomic_write_text, write_json
from torch2ms.stages import stage_names
from torch2ms.zoo.failures import blocker_table, category_counts
from torch2ms.zoo.row import COLUMNS as METRIC_COLUMNS
from torch2ms.zoo.row import ModelRow, layout_totals

COLUMNS = ("model", "status", *stage_names(), *(c[0] for c in METRIC_COLUMNS), "reason")
STATUS_COLOR = {
    "passed": "#1a7f37",
    "up to date": "#0969da",
    "failed": "#cf222e",
    "timeout": "#bc4c00",
    "oom": "#bc4c00",
    "crashed": "#cf222e",
    "not run": "#6e7781",
    "disabled": "#6e7781",
}


def headline(rows: list[ModelRow]) -> str:
    n = len(rows)
    ok = sum(r.passed for r in rows)
    pct = 100.0 * ok / n if n else 0.0
    return f"{ok}/{n} models passed ({pct:.1f}%)"


def _num(v, spec: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def _reason(text: str, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _limits(data: dict) -> str:
    """The limits the models ran under (each model's own, when the zoo file sets them)."""
    rows = [ModelRow.from_dict(r) for r in data["models"]]
    timeouts = sorted({r.timeout_s for r in rows if r.timeout_s})
    mems = sorted({r.max_memory_mb or 0 for r in rows if r.timeout_s is not None})
    t = "timeout " + ("/".join(f"{v:g}" for v in timeouts) + " s" if timeouts else f"{data['timeout']:g} s")
    m = (
        "no memory limit"
        if mems in ([], [0])
        else "memory limit " + "/".join(f"{v:g} MB" if v else "none" for v in mems)
    )
    return f"per model: {t}, {m}"


def cells(row: ModelRow | dict) -> list[str]:
    if isinstance(row, dict):
        row = ModelRow.from_dict(row)
    return [
        row.name,
        row.status + (" (cached)" if row.cached else ""),
        *(row.stages.get(s, "not run") for s in stage_names()),
        *(_num(getattr(row, attr), spec) for _, attr, spec in METRIC_COLUMNS),
        _reason(row.reason),
    ]


def build(rows: list[ModelRow], meta: dict) -> dict:
    ok = sum(r.passed for r in rows)
    return {
        "headline": headline(rows),
        "passed": ok,
        "total": len(rows),
        "pass_rate": round(ok / len(rows), 4) if rows else 0.0,
        **meta,
        "disk_mb": round(sum(r.disk_mb or 0.0 for r in rows), 1),
        "peak_rss_mb": max((r.peak_rss_mb for r in rows if r.peak_rss_mb), default=None),
        "layout": layout_totals(rows),
        "categories": category_counts(rows),
        "blockers": blocker_table(rows),
        "versions": framework_versions(),
        "models": [r.to_dict() for r in rows],
    }


def _md(data: dict) -> str:
    lines = [
        f"# torch2ms zoo: {data['zoo']}",
        "",
        f"**{data['headline']}** in {data['seconds']:.0f} s ({data['executor']} executor, {data['jobs']} at a time, "
        f"{_limits(data)}); {_resources(data)}.",
        "",
        _layout(data) + ".",
        "",
        *table(COLUMNS, ([cell(c) for c in cells(r)] for r in data["models"])),
    ]
    if data.get("blockers"):
        lines += ["", "## What blocks the most models", "", f"Failures by category: {_categories(data)}.", ""]
        header = ("models", "category", "blocker", "blocked models")
        blockers = [
            (b["count"], b["category"], cell(b["blocker"]), cell(", ".join(b["models"]))) for b in data["blockers"]
        ]
        lines += table(header, blockers)
    pictures = _profile_pictures(data)
    if pictures:
        lines += ["", "## Where the time goes: kernel ms per call per module (zoo --profile)", ""]
        lines += [f"![{name}]({src})" for name, src in pictures]
    lines += [
        "",
        "Errors are the worst over all stages against PyTorch; convert s is the sum of the stage times "
        "(for a cached model, from when it was converted); latency is the compiled network's median; "
        "peak RSS is the worker process's.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        "",
    ]
    return "\n".join(lines)


def _html(data: dict) -> str:
    def td(text: str) -> str:
        color = STATUS_COLOR.get(text.replace(" (cached)", ""))
        style = f' style="color:{color};font-weight:600"' if color else ""
        return f"<td{style}>{html.escape(text)}</td>"

    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "\n".join("<tr>" + "".join(td(c) for c in cells(r)) + "</tr>" for r in data["models"])
    title = html.escape(f"torch2ms zoo: {data['zoo']}")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}}
table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}}
th{{background:#f6f8fa}}</style></head>
<body><h1>{title}</h1>
<p><b>{html.escape(data["headline"])}</b> in {data["seconds"]:.0f} s
({html.escape(data["executor"])} executor, {data["jobs"]} at a time, {html.escape(_limits(data))});
{html.escape(_resources(data))}.</p>
<p>{html.escape(_layout(data))}.</p>
<table>
<thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table>
{_html_blockers(data)}
{_html_profiles(data)}
<p>Versions: {html.escape(", ".join(f"{k} {v}" for k, v in data["versions"].items()))}</p>
</body></html>
"""


def _categories(data: dict) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(data.get("categories", {}).items(), key=lambda kv: -kv[1]))


def _resources(data: dict) -> str:
    peak = data.get("peak_rss_mb")
    rss = f"largest peak RSS {peak:.0f} MB" if peak else "peak RSS not measured"
    keep = "everything kept" if data.get("keep") == "all" else "passed models keep what their user needs"
    return f"{rss}; {data.get('disk_mb', 0):.0f} MB on disk ({keep})"


def _layout(data: dict) -> str:
    """The zoo-wide module share and the models whose rebuild fell back to the flat layout."""
    lay = data.get("layout") or {}
    if lay.get("module_share") is None:
        text = "Module layout: no model has one"
    else:
        text = (
            f"Module layout: {100.0 * lay['module_share']:.1f}% of {lay['layout_nodes']} ONNX nodes inside a "
            "module class"
        )
    flat = lay.get("flat_fallbacks") or {}
    text += f"; {len(flat)} model(s) fell back to the flat layout"
    return text + (": " + "; ".join(f"{n} ({_reason(r, 120)})" for n, r in flat.items()) if flat else "")


def _profile_pictures(data: dict) -> list[tuple[str, str]]:
    """(model, its modules.png relative to the summary's folder) for each model with a profile
    (``zoo --profile``): the summaries link the pictures where the run folders keep them."""
    out = Path(data.get("out") or ".").resolve()
    pictures = []
    for r in data["models"]:
        png = r.get("profile_png")
        if png and Path(png).is_file():
            pictures.append((r["name"], os.path.relpath(Path(png).resolve(), out)))
    return pictures


def _html_profiles(data: dict) -> str:
    pictures = _profile_pictures(data)
    if not pictures:
        return ""
    figures = "\n".join(
        f'<h3>{html.escape(name)}</h3>\n<a href="{html.escape(src)}"><img src="{html.escape(src)}" '
        f'alt="{html.escape(name)}: kernel ms per call per module" style="max-width:100%"></a>'
        for name, src in pictures
    )
    return f"""<h2>Where the time goes: kernel ms per call per module (zoo --profile)</h2>
{figures}"""


def _html_blockers(data: dict) -> str:
    if not data.get("blockers"):
        return ""
    rows = "\n".join(
        f"<tr><td>{b['count']}</td><td>{html.escape(b['category'])}</td><td>{html.escape(b['blocker'])}</td>"
        f"<td>{html.escape(', '.join(b['models']))}</td></tr>"
        for b in data["blockers"]
    )
    return f"""<h2>What blocks the most models</h2>
<p>Failures by category: {html.escape(_categories(data))}.</p>
<table>
<thead><tr><th>models</th><th>category</th><th>blocker</th><th>blocked models</th></tr></thead>
<tbody>
{rows}
</tbody></table>"""


def compare(old: dict, new: dict) -> dict[str, list[str]]:
    """Models that started or stopped passing from summary ``old`` to ``new``, and those only one of them ran."""
    before = {r["name"]: r["status"] == "passed" for r in old.get("models", [])}
    after = {r["name"]: r["status"] == "passed" for r in new.get("models", [])}
    both = [n for n in after if n in before]
    return {
        "started passing": [n for n in both if after[n] and not before[n]],
        "stopped passing": [n for n in both if before[n] and not after[n]],
        "new": [n for n in after if n not in before],
        "gone": [n for n in before if n not in after],
    }


def write_summaries(out_root: Path, data: dict) -> dict[str, Path]:
    paths = {"json": out_root / "summary.json", "md": out_root / "summary.md", "html": out_root / "summary.html"}
    write_json(paths["json"], data)
    atomic_write_text(paths["md"], _md(data))
    atomic_write_text(paths["html"], _html(data))
    return paths
