"""``torch2ms ops``: the supported-operator table, from the converter registry."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from torch2ms.cli_app import app, console, out_console


@app.command()
def ops(
    markdown: bool = typer.Option(False, "--markdown", help="print the Markdown table (the text of docs/operators.md)"),
    write: Path | None = typer.Option(
        None, "--write", help="write the Markdown table to this file, e.g. docs/operators.md"
    ),
    conformance: bool = typer.Option(
        False,
        "--conformance",
        help="run ONNX's backend node test cases through torch2ms (a few minutes) and report pass/refused/wrong/crash;"
        " with --write/--markdown, the table of docs/conformance.md",
    ),
    workers: int = typer.Option(2, "--workers", min=1, help="worker processes for --conformance"),
) -> None:
    """List the supported ONNX operators: opsets, signature, accepted attributes."""
    if conformance:
        _conformance(markdown, write, workers)
        return
    from rich.table import Table

    from torch2ms.pipeline.workspace import atomic_write_text
    from torch2ms.tools.ops_table import operator_rows, render_markdown

    rows = operator_rows()
    if write is not None:
        atomic_write_text(write, render_markdown(rows))
        console.print(f"wrote {write} ({len(rows)} converters)", highlight=False)
        return
    if markdown:
        sys.stdout.write(render_markdown(rows))  # raw: a rich console would wrap the table rows
        return
    table = Table(title=f"torch2ms: {len(rows)} converters", title_justify="left")
    for c in ("op", "domain", "opsets", "signature", "attributes"):
        table.add_column(c, overflow="fold", no_wrap=c in ("op", "domain", "opsets"))
    for r in rows:
        table.add_row(r.op_type, r.domain, r.opsets, r.signature, ", ".join(r.attributes) or "-")
    out_console.print(table)


def _conformance(markdown: bool, write: Path | None, workers: int) -> None:
    from torch2ms.pipeline.workspace import atomic_write_text
    from torch2ms.tools import conformance as conf

    cases = conf.cached_cases()
    done = [0]

    def progress(o) -> None:
        done[0] += 1
        if o.status in ("wrong", "crash"):
            console.print(f"{o.status}: {o.name} ({o.op_type}): {o.reason}", highlight=False, markup=False)
        if done[0] % 200 == 0:
            console.print(f"[dim]{done[0]}/{len(cases)} cases[/dim]")

    outcomes = conf.run_cases(cases, workers=workers, progress=progress)
    text = conf.render_markdown(cases, outcomes)
    tally = conf.Tally.of(outcomes.values())
    if write is not None:
        atomic_write_text(write, text)
        console.print(f"wrote {write}: {tally.line()}", highlight=False)
    elif markdown:
        sys.stdout.write(text)
    else:
        out_console.print(tally.line(), highlight=False)
        for cause, n in tally.causes.items():
            out_console.print(f"  refused, {cause}: {n}", highlight=False)
