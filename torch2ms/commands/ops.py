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
) -> None:
    """List the supported ONNX operators: opsets, signature, accepted attributes."""
    from rich.table import Table

    from torch2ms.ops_table import operator_rows, render_markdown
    from torch2ms.pipeline.workspace import atomic_write_text

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
