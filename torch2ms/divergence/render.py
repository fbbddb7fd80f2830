"""A DiffReport as text (the terminal), Markdown (diff.md) and JSON (diff.json)."""

from __future__ import annotations

from pathlib import Path

from torch2ms.compare import OutputMetrics
from torch2ms.divergence.report import DiffReport
from torch2ms.pipeline.markdown import cell, table


def _attrs_text(attrs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in attrs.items()) or "no attributes"


def _fmt(m: OutputMetrics | None) -> str:
    if m is None:
        return "-"
    if m.nonfinite:
        return m.nonfinite
    return f"max abs {m.max_abs:.3g}, rel error {m.rel_error:.3g}, cosine {m.cosine:.7f}"


def render_text(report: DiffReport) -> str:
    tol = report.tolerance
    lines = [
        f"{report.stage}: {len(report.tensors)} tensors of the generated code compared with onnxruntime on "
        f"{report.samples} sample(s) "
        f"(rel error <= {tol.rel_error:g}, cosine >= {tol.cosine})"
    ]
    t = report.first
    if t is None:
        lines.append("no diverging node: every tensor is within tolerance")
        return "\n".join(lines)
    by_tensor = {x.tensor: x for x in report.tensors}
    lines += [
        f"first diverging node: {t.op} {t.node} (computes {t.tensor!r})",
        f"  code:   {report.location()}",
        f"          {report.code.strip()}",
        f"  error:  {_fmt(t.metrics)}" + (f" ({t.problem})" if t.metrics is None or not t.metrics.nonfinite else ""),
    ]
    for i in t.inputs:
        src = by_tensor.get(i)
        what = (
            f"({src.var}): {_fmt(src.metrics)}"
            if src
            else "(a graph input)"
            if i in report.graph_inputs
            else "(not compared)"
        )
        lines.append(f"  input:  {i!r} {what}")
    for k, n in enumerate(report.onnx_nodes):
        lines.append(f"  {'onnx:' if k == 0 else '':<7} {n['node']} ({n['op']}: {_attrs_text(n['attributes'])})")
    rest = report.inherited
    if rest:
        lines.append(
            f"  after it: {len(rest)} more tensor(s) out of tolerance, inherited (last: {rest[-1].var}, "
            f"{_fmt(rest[-1].metrics)})"
        )
    if t.local is not None:
        lines.append(f"  local:  on onnxruntime's own inputs: {_fmt(t.local)}")
    if report.replayed:
        lines.append(f"replay: {report.local_summary()}")
    return "\n".join(lines)


def render_markdown(report: DiffReport) -> str:
    lines = [
        f"# Divergence localization: stage {report.stage}",
        "",
        "```",
        render_text(report),
        "```",
        "",
    ]
    header = ("line", "variable", "op", "node", "tensor", "result", "on onnxruntime's inputs")
    rows = []
    for t in report.tensors:
        mark = "**first divergence**: " if t is report.first else ""
        local = "-" if t.local is None else ("**wrong**: " if t.local_problem else "") + _fmt(t.local)
        local += f" ({t.reference_off})" if t.reference_off else ""
        rows.append(
            (t.line, f"`{t.var}`", t.op, t.node, t.tensor, cell(mark + (t.problem or _fmt(t.metrics))), cell(local))
        )
    lines += table(header, rows, right=(0,))
    if report.not_compared:
        lines += ["", f"Not compared (not an ONNX node output): {', '.join(report.not_compared)}"]
    return "\n".join(lines) + "\n"


def write_diff(report: DiffReport, folder: Path) -> list[Path]:
    from torch2ms.pipeline.workspace import atomic_write_text, write_json

    paths = [folder / "diff.json", folder / "diff.md"]
    write_json(paths[0], report.to_dict())
    atomic_write_text(paths[1], render_markdown(report))
    return paths
