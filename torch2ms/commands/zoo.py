"""``torch2ms zoo``: convert every model of a zoo file, each in its own worker process."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, Torch2msError

MARK = {
    "passed": "[green]passed [/green]",
    "failed": "[red]failed [/red]",
    "timeout": "[red]timeout[/red]",
    "crashed": "[red]crashed[/red]",
    "oom": "[red]oom    [/red]",
}
PROFILE_HELP = (
    "profile each passed model with N calls per variant (PyTorch, the plain graph, graph kernels) into its run's "
    "profile/: fills the kernels and small-op share columns; summary.html shows the pictures (0: off)"
)


def _progress(state, total: int):
    from rich.console import Group
    from rich.text import Text

    ok, bad = state.counts()
    running = state.running()
    done = ok + bad
    width = 30
    filled = int(width * done / total) if total else width
    lines = [
        Text.from_markup(
            f"[bold]{done}/{total}[/bold] done  [green]{ok} passed[/green]  [red]{bad} failed[/red]  {len(running)} "
            "running  "
            f"[cyan]{'━' * filled}[/cyan][dim]{'━' * (width - filled)}[/dim]"
        )
    ]
    lines += [Text(f"  {name}: {stage} ({secs:.0f} s)", style="yellow") for name, stage, secs in running]
    return Group(*lines)


@app.command()
def zoo(
    zoo_file: Path = typer.Argument(
        ...,
        help="zoo YAML: `defaults:` + `models:` (see recipes/zoo/); or a finished run's summary.json, to --compare "
        "it without running anything",
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=1, help="models converted at once (default: 1 locally; with Ray, the cluster's CPUs)"
    ),
    only: str | None = typer.Option(
        None, "--only", help="comma-separated model names to run, e.g. resnet50,fcn_resnet50"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="output root (default: runs/zoo/<zoo file name>)"),
    timeout: float = typer.Option(
        1800, "--timeout", min=1, help="seconds per model before its worker is killed (a model's own `timeout:` wins)"
    ),
    max_memory: float | None = typer.Option(
        None,
        "--max-memory",
        min=1,
        help="MB of RSS per worker before it is killed as out of memory (a model's own `max_memory_mb:` wins)",
    ),
    executor: str = typer.Option(
        "local", "--executor", help="local (worker processes here) or ray (one Ray task per model)"
    ),
    address: str | None = typer.Option(
        None, "--address", help="Ray cluster address (with --executor ray); default: start a local Ray"
    ),
    keep: str = typer.Option(
        "needed",
        "--keep",
        help="needed: a passed model keeps records, reports, network.py + weights, the MindIR, the ONNX and "
        "references (what diff and re-runs need); intermediate weight copies go. all: keep everything",
    ),
    compare: Path | None = typer.Option(
        None, "--compare", help="an earlier run's summary.json: print the models that started or stopped passing"
    ),
    profile: int = typer.Option(0, "--profile", min=0, help=PROFILE_HELP),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Convert every model of a zoo file in its own process; write summary.json/.md/.html.

    Exit 0 only if every selected model passed."""
    from torch2ms.zoo import ZooOptions, load_zoo, select

    old = _read_summary(compare, "--compare") if compare else None
    if zoo_file.suffix == ".json":
        _compare_only(zoo_file, old, compare)
        return
    _check_options(keep, executor, address)
    models = select(load_zoo(zoo_file), only, str(zoo_file))
    setup_cpu(cpu_isa)  # the workers inherit it; the driver itself never imports MindSpore
    out_root = out or Path("runs") / "zoo" / zoo_file.stem
    opts = ZooOptions(
        out_root=out_root,
        jobs=jobs,
        timeout=timeout,
        max_memory_mb=max_memory,
        executor=executor,
        address=address,
        cpu_isa=cpu_isa,
        keep=keep,
        profile_calls=profile,
    )
    console.print(f"zoo: {len(models)} model(s) from {zoo_file} -> {out_root} ({executor} executor)")
    data = _run_with_progress(models, opts, zoo_file)
    _print_table(data)
    paths = data["paths"]
    console.print(
        f"[bold]{data['headline']}[/bold] in {data['seconds']:.0f} s, {data['disk_mb']:.0f} MB on disk; summary: "
        f"{paths['md']}  {paths['html']}  {paths['json']}"
    )
    if old is not None:
        _print_compare(old, data, compare, paths["json"])
    if data["passed"] != data["total"]:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _check_options(keep: str, executor: str, address: str | None) -> None:
    from torch2ms.zoo.disk import KEEP

    if keep not in KEEP:
        raise Torch2msError(f"--keep {keep!r}: choose {' or '.join(KEEP)}")
    if executor not in ("local", "ray"):
        raise Torch2msError(f"--executor {executor!r}: choose local or ray")
    if address and executor != "ray":
        raise Torch2msError("--address is for the Ray executor", hint="add --executor ray")


def _compare_only(summary: Path, old: dict | None, compare: Path | None) -> None:
    """``torch2ms zoo NEW/summary.json --compare OLD/summary.json``: exit 1 when a model stopped passing."""
    if old is None:
        raise Torch2msError(
            f"{summary}: a summary.json is for --compare",
            hint="torch2ms zoo NEW/summary.json --compare OLD/summary.json",
        )
    if _print_compare(old, _read_summary(summary, "the zoo argument"), compare, summary):
        raise typer.Exit(EXIT_CHECK_FAILED)


def _run_with_progress(models: list, opts, zoo_file: Path) -> dict:
    """``run_batch`` with a live progress view and a line per finished model; Ctrl-C kills the workers
    and exits 130 with how to resume."""
    from rich.live import Live

    from torch2ms.zoo import run_batch
    from torch2ms.zoo.launch import kill_all

    live = {}

    def on_start(state) -> None:
        live["view"] = Live(
            get_renderable=lambda: _progress(state, len(models)), console=console, refresh_per_second=2, transient=True
        )
        live["view"].start()

    def on_row(row) -> None:
        extra = f"  {row.wall_s or 0:.0f} s" + ("  (cached)" if row.cached else "")
        reason = f"  {' '.join(row.reason.split())[:160]}" if not row.passed else ""
        console.print(f"  {MARK.get(row.status, row.status)} {row.name}{extra}{reason}", highlight=False)

    try:
        return run_batch(
            models,
            opts,
            str(zoo_file),
            on_row=on_row,
            on_start=on_start,
            log=lambda m: console.print(f"[dim]{m}[/dim]"),
        )
    except KeyboardInterrupt:
        kill_all()
        console.print(
            f"[red]interrupted[/red]; finished stages are kept. Resume with the same command: torch2ms zoo {zoo_file}"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        if "view" in live:
            live["view"].stop()


def _read_summary(path: Path, what: str) -> dict:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise Torch2msError(f"{what}: cannot read {path} as a zoo summary.json ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise Torch2msError(f"{what}: {path} is not a zoo summary.json (no `models` list)")
    return data


def _print_compare(old: dict, new: dict, old_path, new_path) -> list[str]:
    """Print which models started or stopped passing between two summaries (on stdout); return those
    that stopped."""
    from torch2ms.zoo.summary import compare

    diff = compare(old, new)
    for path, data in ((old_path, old), (new_path, new)):
        out_console.print(f"{path}: {data.get('headline', '?')}", highlight=False, markup=False)
    reasons = {r["name"]: r for r in new["models"]}
    for label, names in diff.items():
        if not names:
            continue
        out_console.print(f"{label} ({len(names)}):", highlight=False, markup=False)
        for n in names:
            r = reasons.get(n) if label == "stopped passing" else None
            why = (
                f"  [{r.get('category') or r['status']}] {' '.join((r.get('reason') or '').split())[:140]}" if r else ""
            )
            out_console.print(f"  {n}{why}", highlight=False, markup=False)
    if not diff["started passing"] and not diff["stopped passing"]:
        out_console.print("no model started or stopped passing", highlight=False)
    return diff["stopped passing"]


STAGE_MARK = {
    "passed": "✓",
    "up to date": "=",
    "disabled": "-",
    "not run": "·",
    "failed": "✗",
    "timeout": "T",
    "oom": "M",
    "crashed": "!",
}


def _print_table(data: dict) -> None:
    """The summary on the terminal: stages as one column of marks (✓ passed, = up to date,
    ✗ failed, T timeout, M out of memory, ! crashed, · not run); the files have the full table."""
    from rich.table import Table

    from torch2ms.stages import stage_names
    from torch2ms.zoo.row import COLUMNS
    from torch2ms.zoo.summary import cells

    table = Table(title=f"torch2ms zoo: {data['headline']}", title_justify="left")
    for c in ("model", "status", "stages", *(short for short, _, _ in COLUMNS), "reason"):
        table.add_column(c, overflow="fold", no_wrap=c not in ("reason",))
    style = {"passed": "green", "failed": "red", "timeout": "red", "oom": "red", "crashed": "red"}
    for r in data["models"]:
        c = cells(r)
        marks = "".join(STAGE_MARK.get(r["stages"].get(s, "not run"), "?") for s in stage_names())
        table.add_row(c[0], c[1], marks, *c[2 + len(stage_names()) : -1], c[-1][:100], style=style.get(r["status"]))
    out_console.print(table)
