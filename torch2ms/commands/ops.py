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
        help="the published results of ONNX's backend node test cases through torch2ms (docs/conformance.md:"
        " pass/refused/wrong/crash); `make conformance` runs them again",
    ),
) -> None:
    """List the supported ONNX operators: opsets, signature, accepted attributes."""
    if conformance:
        _conformance()
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


def _conformance() -> None:
    """Print the totals and refusal causes of the published table, where the package sits in a checkout."""
    path = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    if not path.is_file():
        console.print(
            f"{path} not found: the published conformance table is docs/conformance.md of torch2ms's repository"
            " (an installed wheel does not carry it); `make conformance` there runs the cases again",
            highlight=False,
        )
        raise typer.Exit(2)
    text = path.read_text()
    sections = text.split("\n## ")
    wanted = [s for s in sections if s.startswith(("Totals", "Why cases are refused"))]
    out_console.print(f"{path}:\n", highlight=False)
    for section in wanted:
        out_console.print("## " + section.strip() + "\n", highlight=False, markup=False)
