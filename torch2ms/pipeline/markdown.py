"""Markdown tables for every report torch2ms writes (report.md, diff.md, the zoo summary, the
bench report, the Ascend placement, docs/operators.md, docs/conformance.md): one renderer and one
cell escaper."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(text, limit: int | None = None) -> str:
    """``text`` as one table cell: ``|`` escaped; with ``limit``, on one line (whitespace runs
    collapsed) and cut to ``limit`` characters ending in an ellipsis."""
    text = str(text)
    if limit is not None:
        text = " ".join(text.split())
    text = text.replace("|", "\\|")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(header: Sequence[str], rows: Iterable[Sequence], right: Sequence[int] = ()) -> list[str]:
    """The lines of a table: ``header``, the separator, one line per row (cells as given: escape
    text that may hold ``|`` with ``cell``). Columns whose index is in ``right`` align right."""
    rule = "".join("---:|" if i in right else "---|" for i in range(len(header)))
    return [row(header), "|" + rule, *(row(r) for r in rows)]


def row(cells: Sequence) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
