"""The supported-operator table (``torch2ms ops``) and docs/operators.md, generated from the
converter registry: the file must be current, and the table must say what the registry does."""

from __future__ import annotations

import pytest
from conftest import REPO, run_cli

from torch2ms.converters import api, registry
from torch2ms.graph.ir import Node
from torch2ms.tools.ops_table import MARKDOWN_FILE, operator_rows, render_markdown


def test_docs_operators_md_is_current():
    path = REPO / MARKDOWN_FILE
    assert path.is_file(), f"{MARKDOWN_FILE} is missing: run `torch2ms ops --write {MARKDOWN_FILE}`"
    assert path.read_text() == render_markdown(), (
        f"{MARKDOWN_FILE} is out of date with the converter registry: run `torch2ms ops --write {MARKDOWN_FILE}` and "
        "commit it"
    )


def fake_v1(em, *, alpha=0.5, mode="a|b"):
    """Fake(X) -> Y   attrs: alpha, mode

    More text that must not reach the table.
    """


def fake_v13(em, *, alpha=0.5, **extra):
    """Fake(X) -> Y   (from opset 13)"""


def test_rows_come_from_the_registrations(monkeypatch):
    registry.registrations()
    monkeypatch.setitem(
        api.REGISTRY, ("", "Fake"), [api.Registration("Fake", 1, fake_v1), api.Registration("Fake", 13, fake_v13)]
    )
    monkeypatch.setitem(api.REGISTRY, ("vendor", "Odd"), [api.Registration("Odd", 11, lambda em: None, "vendor")])
    rows = [r for r in operator_rows() if r.op_type in ("Fake", "Odd")]
    assert [(r.op_type, r.domain, r.opsets) for r in rows] == [
        ("Fake", "ai.onnx", "1-12"),
        ("Fake", "ai.onnx", "13+"),
        ("Odd", "vendor", "11+"),
    ]
    assert rows[0].signature == "Fake(X) -> Y   attrs: alpha, mode" and rows[0].attributes == (
        "alpha=0.5",
        "mode='a|b'",
    )
    assert rows[1].attributes == ("alpha=0.5", "**extra") and rows[2].attributes == () and rows[2].signature == "Odd"
    md = render_markdown()
    assert "| Fake | ai.onnx | 1-12 | Fake(X) -> Y   attrs: alpha, mode | `alpha=0.5`, `mode='a\\|b'` |" in md
    assert "| Odd | vendor | 11+ | Odd | - |" in md
    assert md.index("| Odd | vendor") > md.index("| Fake | ai.onnx | 13+")  # default domain first
    assert len(operator_rows()) == len(registry.registrations())


def test_an_attribute_outside_the_table_is_refused():
    """The attributes column is exactly what the converter accepts: anything else is reported."""
    rows = {(r.domain, r.op_type, r.since): r for r in operator_rows()}
    checked = 0
    for reg in registry.registrations():
        row = rows[(reg.domain or "ai.onnx", reg.op_type, reg.since)]
        if any(a.startswith("**") for a in row.attributes):
            continue  # takes any attribute and checks them itself (torch2ms.ConvBnAct)
        node = Node("n", reg.op_type, ["x"], ["y"], {"not_an_onnx_attribute": 1})
        with pytest.raises(api.Unsupported, match="attribute 'not_an_onnx_attribute' not supported"):
            registry.call_converter(reg, None, node)
        checked += 1
    assert checked >= 50


def test_cli_ops_table_markdown_and_write(tmp_path, capsys):
    assert run_cli("ops") == 0
    out = capsys.readouterr().out
    assert f"torch2ms: {len(operator_rows())} converters" in out
    for op in ("Conv", "BatchNormalization", "Resize", "ConvBnAct"):
        assert f"│ {op} " in out, op
    assert run_cli("ops", "--markdown") == 0
    assert capsys.readouterr().out == render_markdown()
    target = tmp_path / "docs" / "operators.md"
    assert run_cli("ops", "--write", str(target)) == 0
    assert target.read_text() == render_markdown()
    assert not [p.name for p in target.parent.iterdir() if p.name != "operators.md"]  # no temp file left
