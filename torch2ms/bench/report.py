"""Bench outputs in ``<run>/bench/``: ``bench.json`` (everything, including every timed sample),
``bench.md`` (the tables), ``latency.png`` (median latency per variant and batch, p90 as a
whisker), the rich table on the terminal, and a "Benchmark" section in the run's ``report.md``.

``report.md`` is rewritten by ``torch2ms convert``, so the section is (re)appended by every
``bench``: any previous "## Benchmark" section is replaced, and the file is written atomically.
"""

from __future__ import annotations

from pathlib import Path

from torch2ms.pipeline.markdown import table
from torch2ms.pipeline.workspace import atomic_write_text, write_json

SECTION = "## Benchmark"
COLUMNS = (
    "variant",
    "batch",
    "check",
    "bound (stage: why)",
    "median ms",
    "p90 ms",
    "img/s",
    "vs torch",
    "vs ORT",
    "first call s",
    "alone ms",
    "peak RSS MB",
)


def _f(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def bound_cell(check: dict) -> str:
    """The relative-error bound a variant was checked under and where it came from, e.g.
    "1.6e-03 (rebuild: 10x onnxruntime's distance from PyTorch)"."""
    if "bound_rel_error" not in check:
        return "-"
    where = f"{check['bound_stage']}: " if check.get("bound_stage") else ""
    return f"{check['bound_rel_error']:.1e} ({where}{check['bound_by']})"


def rows(data: dict) -> list[tuple[str, ...]]:
    out = []
    for batch, results in data["batches"].items():
        torch_ms = (results.get("torch") or {}).get("median_ms")
        ort_ms = (results.get("onnxruntime") or {}).get("median_ms")
        for key, r in results.items():
            if r["status"] == "ok":
                check = f"ok ({r['check']['rel_error']:.1e})"
            elif r["status"] == "wrong":
                check = f"WRONG: {r['reason'][:60]}"
            else:
                check = f"error: {r['reason'][:60]}"
            m = r.get("median_ms")
            out.append(
                (
                    key,
                    batch,
                    check,
                    bound_cell(r.get("check") or {}),
                    _f(m),
                    _f(r.get("p90_ms")),
                    _f(r.get("throughput_ips")),
                    f"{m / torch_ms:.2f}x" if m and torch_ms else "-",
                    f"{m / ort_ms:.2f}x" if m and ort_ms else "-",
                    _f(r.get("first_call_s"), ".2f"),
                    _f(r.get("isolated_median_ms")),
                    _f(r.get("peak_rss_mb"), ".0f"),
                )
            )
    return out


def fusion_lines(data: dict) -> list[str]:
    fusion = data.get("fusion") or {}
    if not fusion:
        return []
    lines = [
        "",
        "Kernels launched by the compiled graph (from MindSpore's `graph_build` IR dump):",
        "",
    ]
    rows_ = []
    for key, f in fusion.items():
        if "error" in f:
            rows_.append((key, "-", f["error"][:100], "-"))
            continue
        ops = ", ".join(f"{k} {v}" for k, v in f["ops"].items())
        groups = ", ".join(f"{k} x{v}" for k, v in f["fused_groups"].items()) or "-"
        rows_.append((key, f["kernels"], ops, groups))
    lines += table(("variant", "kernels", "by op", "fused groups"), rows_)
    return lines


# The deployment targets (issue 6): best MindSpore variant vs PyNative, PyTorch eager, onnxruntime;
# peak memory of the deployed variant (the MindIR) vs the PyNative rebuild.
MS_PREFIX = "ms_"


def targets(data: dict) -> list[tuple[str, str, bool | None]]:
    """Per batch: (target, measured, met) for the fastest correct MindSpore variant."""
    out = []
    for batch, results in data["batches"].items():
        ok = {k: r for k, r in results.items() if r.get("status") == "ok" and r.get("median_ms")}
        ms_variants = {k: r for k, r in ok.items() if k.startswith(MS_PREFIX) and k != "ms_pynative_plain"}
        if not ms_variants:
            continue
        best_key = min(ms_variants, key=lambda k: ms_variants[k]["median_ms"])
        best = ms_variants[best_key]["median_ms"]
        tag = f"batch {batch}, best = {best_key} {best:.1f} ms"

        for key, label, limit, faster in (
            ("ms_pynative_plain", "speed-up vs PyNative plain", 2.0, True),
            ("torch", "time vs PyTorch eager", 1.0, False),
            ("onnxruntime", "time vs onnxruntime", 1.25, False),
        ):
            ref = (ok.get(key) or {}).get("median_ms")
            if ref is None:
                out.append((f"{tag}: {label}", "not measured", None))
                continue
            value = ref / best if faster else best / ref
            want = f">= {limit:g}x" if faster else f"<= {limit:g}x"
            out.append((f"{tag}: {label} {want}", f"{value:.2f}x", value >= limit if faster else value <= limit))
        dep, pyn = (
            (results.get("ms_mindir") or {}).get("peak_rss_mb"),
            (results.get("ms_pynative_plain") or {}).get("peak_rss_mb"),
        )
        if dep and pyn:
            out.append(
                (f"batch {batch}: peak RSS of ms_mindir <= ms_pynative_plain", f"{dep:.0f} vs {pyn:.0f} MB", dep <= pyn)
            )
    return out


def target_lines(data: dict) -> list[str]:
    rows_ = targets(data)
    if not rows_:
        return []
    mark = {True: "met", False: "**not met**", None: "-"}
    return ["", "Targets:", "", *table(("target", "measured", ""), [(t, v, mark[m]) for t, v, m in rows_])]


def markdown(data: dict, png_name: str = "latency.png") -> str:
    m, opts = data["machine"], data["options"]
    cpu = data.get("cpu_setting") or {}
    lines = [
        f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs ({', '.join(m['isa_flags'])}); load average "
        f"{m.get('load_avg_1min_at_start') or 0:.2f} at start, {m.get('load_avg_1min_at_end') or 0:.2f} at the "
        "end (other jobs share the machine). "
        f"{opts['threads']} threads per framework; {opts['warmup']} warm-up + {opts['runs']} timed rounds, "
        "round-robin over variants. "
        f"MindSpore CPU setting: ONEDNN_MAX_CPU_ISA={cpu.get('isa', '?')} ({cpu.get('source', '?')}).",
        "",
        "median/p90: interleaved, outputs materialised; vs torch / vs ORT: median ratio (lower is faster); "
        "alone ms: median when the variant runs alone in its own process; peak RSS: that process's maximum "
        "resident set.",
        "",
        *table(COLUMNS, rows(data)),
    ]
    lines += target_lines(data)
    lines += fusion_lines(data)
    lines += ["", f"![median latency]({png_name})", ""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(data["batches"])
    fig, axes = plt.subplots(
        len(batches),
        1,
        figsize=(9, 0.5 + 0.45 * len(data["variants"]) * len(batches) + 0.6 * len(batches)),
        squeeze=False,
    )
    for ax, batch in zip(axes[:, 0], batches):
        results = data["batches"][batch]
        keys = list(results)[::-1]
        med = [results[k].get("median_ms") or 0 for k in keys]
        p90 = [max(0.0, (results[k].get("p90_ms") or 0) - (results[k].get("median_ms") or 0)) for k in keys]
        colors = ["#c44e52" if k.startswith("torch") else "#8172b2" if k == "onnxruntime" else "#4c72b0" for k in keys]
        ax.barh(keys, med, xerr=[[0] * len(keys), p90], color=colors, capsize=3)
        for i, k in enumerate(keys):
            r = results[k]
            text = f" {r['median_ms']:.1f} ms" if r.get("median_ms") else f" {r['status'].upper()}"
            ax.text(med[i] + p90[i], i, text, va="center", fontsize=8)
        ax.set_xlabel("median latency, ms (whisker: p90)")
        ax.set_title(
            f"{data['recipe']}, batch {batch}, {data['options']['threads']} threads, {data['machine']['cpu']}",
            fontsize=9,
        )
        ax.set_xlim(0, max([m + q for m, q in zip(med, p90)] + [1]) * 1.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(data: dict, bench_dir: Path, run_root: Path) -> dict[str, Path]:
    bench_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": bench_dir / "bench.json", "md": bench_dir / "bench.md", "png": bench_dir / "latency.png"}
    write_json(paths["json"], data)
    plot(data, paths["png"])
    body = markdown(data, paths["png"].name)
    atomic_write_text(paths["md"], f"# torch2ms bench: {data['recipe']}\n\n{body}")
    link_report(run_root / "report.md", body.replace("](latency.png)", "](bench/latency.png)"))
    return paths


def link_report(report: Path, body: str) -> None:
    """Replace (or add) the "## Benchmark" section at the end of ``report.md``."""
    text = report.read_text() if report.exists() else ""
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ", 1)
        text = head.rstrip("\n") + ("\n\n" + rest[nxt + 1 :] if nxt >= 0 else "")
    text = (
        text.rstrip("\n") + f"\n\n{SECTION}\n\nFrom `torch2ms bench` ([bench/bench.md](bench/bench.md), raw data in "
        f"bench/bench.json).\n\n{body}"
    )
    atomic_write_text(report, text)


def print_table(data: dict, console) -> None:
    from rich.table import Table

    table = Table(
        title=f"torch2ms bench: {data['recipe']} ({data['machine']['cpu']}, {data['options']['threads']} threads)",
        title_justify="left",
    )
    for c in COLUMNS:
        table.add_column(c, justify="left" if c in ("variant", "check") else "right")
    for r in rows(data):
        style = "red" if r[2].startswith(("WRONG", "error")) else None
        table.add_row(*r, style=style)
    console.print(table)
    for t, v, met in targets(data):
        console.print(f"  {'[green]met[/green]' if met else '[red]not met[/red]' if met is False else '-'}  {t}: {v}")
