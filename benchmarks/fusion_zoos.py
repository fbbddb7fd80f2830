"""Per-zoo fusion table: how often the plain GRAPH and the graph-kernel variant win the compile
stage's timing under ``graph_kernel: auto``, by how much, and what ``auto`` costs in conversion time.

    python benchmarks/fusion_zoos.py runs/zoo/ci [runs/zoo/other ...] [--md out.md] [--json out.json]

Each argument is a zoo's output root (each model's run folder with its ``zoo-result.json``), run
with ``compile.graph_kernel: auto``. Per model it reads ``compile/compile.json``: both variants'
first call (the build) and median, run in the same process in alternating rounds (side by side), the
decision (rounds, p), AKG failures and check failures. What ``auto`` adds over ``off``, which builds
the plain graph alone and times it once after its warm-up:

    extra = gk first call + (warmup + rounds) x gk median + (rounds - 1) x plain median

against the model's whole conversion time (the stage times summed).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def model_row(row: dict) -> dict | None:
    """One model's figures from its compile record; None when the compile stage did not run."""
    path = Path(row["run_dir"]) / "compile" / "compile.json"
    if not path.is_file():
        return None
    c = json.loads(path.read_text())
    v = c.get("variants") or {}
    plain, gk = v.get("graph"), v.get("graph_kernel")
    out = {
        "model": row["name"],
        "status": row["status"],
        "chosen": c.get("chosen"),
        "convert_s": row.get("convert_s"),
        "gk_failures": len(c.get("graph_kernel_failures") or []),
        "check_failures": [f["variant"] for f in c.get("check_failures") or []],
    }
    if plain:
        out.update(plain_ms=plain["median_ms"], plain_build_s=plain["first_call_s"])
    if plain and gk:
        d = c.get("decision") or {}
        rounds, warmup = d.get("rounds", 0), _warmup(row)
        extra = gk["first_call_s"] + (warmup + rounds) * gk["median_ms"] / 1e3 + (rounds - 1) * plain["median_ms"] / 1e3
        out.update(
            gk_ms=gk["median_ms"],
            gk_build_s=gk["first_call_s"],
            ratio=round(gk["median_ms"] / plain["median_ms"], 3),
            margin=row.get("winner_margin"),
            decided=d.get("decided"),
            p=d.get("p_value"),
            rounds=rounds,
            extra_s=round(extra, 2),
        )
    return out


def _warmup(row: dict) -> int:
    job = Path(row["run_dir"]) / "zoo-job.json"
    recipe = json.loads(job.read_text()).get("recipe", {}) if job.is_file() else {}
    return int((recipe.get("compile") or {}).get("warmup", 2))


def zoo_totals(name: str, rows: list[dict]) -> dict:
    """Wins per variant (and how many decided at p <= 0.05), median margin of each, auto's cost."""
    both = [r for r in rows if "ratio" in r]
    out = {"zoo": name, "models": len(rows), "both_built": len(both)}
    for key in ("graph", "graph_kernel"):
        won = [r for r in both if r["chosen"] == key]
        out[f"{key}_wins"] = len(won)
        out[f"{key}_decided"] = sum(bool(r["decided"]) for r in won)
        margins = [r["margin"] for r in won if r["margin"] is not None]
        out[f"{key}_median_margin"] = round(statistics.median(margins), 4) if margins else None
    out["median_ratio"] = round(statistics.median(r["ratio"] for r in both), 3) if both else None
    extra = sum(r["extra_s"] for r in both)
    total = sum(r["convert_s"] or 0.0 for r in both)
    share = round(extra / total, 3) if total else None
    out.update(extra_s=round(extra, 1), convert_s=round(total, 1), extra_share=share)
    out["gk_failures"] = sum(r["gk_failures"] for r in rows)
    out["check_failures"] = sum(len(r["check_failures"]) for r in rows)
    return out


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(zoos: list[tuple[dict, list[dict]]]) -> str:
    lines = [
        "| zoo | models (both built) | plain GRAPH wins (decided) | its median margin | graph kernel wins (decided) "
        "| its median margin | median gk/plain | auto's extra s / convert s |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for t, _ in zoos:
        lines.append(
            f"| {t['zoo']} | {t['models']} ({t['both_built']}) | {t['graph_wins']} ({t['graph_decided']}) "
            f"| {_f(t['graph_median_margin'], '.1%')} | {t['graph_kernel_wins']} ({t['graph_kernel_decided']}) "
            f"| {_f(t['graph_kernel_median_margin'], '.1%')} | {_f(t['median_ratio'], '.2f')} "
            f"| {t['extra_s']:.0f} / {t['convert_s']:.0f} ({_f(t['extra_share'], '.0%')}) |"
        )
    for t, rows in zoos:
        lines += [
            "",
            f"### {t['zoo']}",
            "",
            "| model | chosen | plain ms | gk ms | gk/plain | margin | p (rounds) | plain build s | gk build s "
            "| auto's extra s | convert s | failures |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            fails = [f"AKG x{r['gk_failures']}"] if r["gk_failures"] else []
            fails += [f"{v} out of the bound" for v in r["check_failures"]]
            lines.append(
                f"| {r['model']} | {r['chosen']} | {_f(r.get('plain_ms'), '.2f')} | {_f(r.get('gk_ms'), '.2f')} "
                f"| {_f(r.get('ratio'), '.2f')} | {_f(r.get('margin'), '.1%')} | {_f(r.get('p'), '.3g')} "
                f"({r.get('rounds', '-')}) | {_f(r.get('plain_build_s'), '.1f')} | {_f(r.get('gk_build_s'), '.1f')} "
                f"| {_f(r.get('extra_s'), '.1f')} | {_f(r['convert_s'], '.1f')} | {', '.join(fails) or '-'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    zoos = []
    for root in args.roots:
        results = sorted(root.glob("*/zoo-result.json"), key=lambda p: p.stat().st_mtime)  # in the order run
        rows = [m for m in (model_row(json.loads(p.read_text())) for p in results) if m]
        zoos.append((zoo_totals(root.name, rows), rows))
    text = markdown(zoos)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([{"totals": t, "models": rows} for t, rows in zoos], indent=1) + "\n")


if __name__ == "__main__":
    main()
