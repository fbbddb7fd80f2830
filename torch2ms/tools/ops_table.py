"""The supported-operator table, generated from the converter registry.

One row per registration: op type, domain, the opsets it covers (from its ``since`` to the
next registration's), the first line of the converter's docstring (the ONNX signature), and
the attributes it accepts, which are the converter function's keyword parameters with their
spec defaults. ``torch2ms ops`` prints it; ``torch2ms ops --write docs/operators.md`` writes
the Markdown version, which a test keeps in step with the registry.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch2ms.converters.registry import Registration, refusals, registrations
from torch2ms.graph.validate import SUPPORTED_OPSETS
from torch2ms.pipeline.markdown import cell, table

MARKDOWN_FILE = "docs/operators.md"


@dataclass(frozen=True)
class OpRow:
    op_type: str
    domain: str
    since: int
    until: int | None  # last opset this converter is used for; None: every newer one
    signature: str
    attributes: tuple[str, ...]

    @property
    def opsets(self) -> str:
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"


def attributes_of(reg: Registration) -> tuple[str, ...]:
    """The converter's keyword parameters (``name=default``): the attributes it accepts."""
    out = []
    for p in list(inspect.signature(reg.fn).parameters.values())[1:]:  # the first is the emitter
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        elif p.kind is not p.VAR_POSITIONAL:
            out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return tuple(out)


def operator_rows() -> list[OpRow]:
    regs = sorted(registrations(), key=lambda r: (r.domain != "", r.domain, r.op_type, r.since))
    rows = []
    for i, reg in enumerate(regs):
        nxt = regs[i + 1] if i + 1 < len(regs) else None
        same = nxt is not None and (nxt.domain, nxt.op_type) == (reg.domain, reg.op_type)
        rows.append(
            OpRow(
                reg.op_type,
                reg.domain or "ai.onnx",
                reg.since,
                nxt.since - 1 if same else None,
                reg.signature,
                attributes_of(reg),
            )
        )
    return rows


def render_markdown(rows: list[OpRow] | None = None) -> str:
    rows = operator_rows() if rows is None else rows
    onnx_ops = {r.op_type for r in rows if r.domain == "ai.onnx"}
    lines = [
        "# Supported operators",
        "",
        "Generated from the converter registry by `torch2ms ops --write docs/operators.md`; do not edit by hand",
        "(`tests/tools/test_ops_table.py` fails when this file is out of date).",
        "",
        f"{len(onnx_ops)} ONNX op types, for models of opset {SUPPORTED_OPSETS.start} to {SUPPORTED_OPSETS.stop - 1}.",
        "A converter serves every opset from its first one until the next converter of the same op takes over.",
        "Attributes are the converter's keyword parameters with the ONNX defaults; `torch2ms check` reports",
        "any other attribute as unsupported. Ops of the `torch2ms` domain are made by torch2ms's own graph",
        "passes and never occur in an exported model.",
        "",
    ]
    ops = [
        (r.op_type, r.domain, r.opsets, cell(r.signature), cell(", ".join(f"`{a}`" for a in r.attributes) or "-"))
        for r in rows
    ]
    lines += table(("op", "domain", "opsets", "signature", "attributes"), ops)
    refused = refusals()
    if refused:
        lines += [
            "",
            "## Refused",
            "",
            "These ONNX ops are refused on purpose: `torch2ms check` and the rebuild stage name the reason.",
            "",
            *table(("op", "reason"), ((op, cell(reason)) for op, reason in refused.items())),
        ]
    return "\n".join(lines) + "\n"
