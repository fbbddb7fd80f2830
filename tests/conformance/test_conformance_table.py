"""docs/conformance.md, the per-op table of ONNX's conformance cases, must be current.

Writing it runs all 1884 cases (a few minutes), too slow for ``make test``. So the default run
checks what decides the table's shape: the fingerprint in the file (the cases, the registered
converters and declared refusals, the opset range) must equal the current one, so adding,
removing or re-versioning a converter without regenerating the table fails here. A change
inside a converter that turns a case from refused to pass, or breaks one, is caught by the slow
test, which compares the whole file with a fresh run."""

from __future__ import annotations

import pytest
from conftest import REPO

from conformance import harness, table
from conformance.conftest import all_cases
from conformance.harness import Outcome
from conformance.table import MARKDOWN_FILE

REGENERATE = "run `make conformance` and commit docs/conformance.md"


def test_docs_conformance_md_is_current():
    path = REPO / MARKDOWN_FILE
    assert path.is_file(), f"{MARKDOWN_FILE} is missing: {REGENERATE}"
    recorded = table.read_fingerprint(path.read_text())
    current = table.fingerprint(all_cases())
    assert recorded is not None, f"{MARKDOWN_FILE} has no fingerprint line: {REGENERATE}"
    changed = sorted(k for k in current if recorded.get(k) != current[k])
    detail = ""
    if "converters" in changed:
        added = sorted(set(current["converters"]) - set(recorded.get("converters", [])))
        gone = sorted(set(recorded.get("converters", [])) - set(current["converters"]))
        detail = f" (converters added {added}, removed {gone})"
    assert not changed, f"{MARKDOWN_FILE} is out of date: {', '.join(changed)} changed{detail}; {REGENERATE}"


@pytest.mark.slow
@pytest.mark.needs_cases("all")
def test_docs_conformance_md_matches_a_full_run(outcomes):
    text = table.render_markdown(all_cases(), outcomes)
    assert (REPO / MARKDOWN_FILE).read_text() == text, f"{MARKDOWN_FILE} differs from a fresh run: {REGENERATE}"


def test_table_counts_every_case_once_by_op_and_cause():
    cases = [c for c in all_cases() if c.op_type in ("Relu", "BitCast")]
    outcomes = {}
    for k, c in enumerate(cases):
        if c.op_type == "Relu":
            outcomes[c.name] = Outcome(c.name, c.op_type, "pass", how="converted")
        elif k % 2:
            outcomes[c.name] = Outcome(c.name, c.op_type, "refused", "BitCast: no converter")
        else:
            outcomes[c.name] = Outcome(c.name, c.op_type, "crash", "ValueError: boom")
    text = table.render_markdown(cases, outcomes)
    n_relu = sum(c.op_type == "Relu" for c in cases)
    bitcast = [outcomes[c.name] for c in cases if c.op_type == "BitCast"]
    n_ref, n_crash = sum(o.status == "refused" for o in bitcast), sum(o.status == "crash" for o in bitcast)
    assert f"| Relu | yes | {n_relu} | {n_relu} | 0 | 0 | 0 | 0 |  |" in text
    row = f"| BitCast | no | {len(bitcast)} | 0 | 0 | {n_ref} | 0 | {n_crash} | BitCast: no converter ({n_ref}) |"
    assert row in text
    assert f"| no converter | {n_ref} |" in text
    assert "| ValueError: boom |" in text  # every crash is listed
    assert table.read_fingerprint(text) == table.fingerprint(cases)
    with pytest.raises(ValueError, match="have no outcome"):
        table.render_markdown(cases, {})


def test_harness_writes_the_table_from_a_run(tmp_path, monkeypatch):
    """`make conformance`'s command on three cases (monkeypatched in), through the worker processes."""
    few = [
        c
        for c in all_cases()
        if c.name in ("test_relu", "test_bitcast_float32_to_int32", "test_sequence_insert_at_back")
    ]
    monkeypatch.setattr(harness, "cached_cases", lambda: few)
    target = tmp_path / "conformance.md"
    assert harness.main(["--write", str(target), "--workers", "1"]) == 0
    text = target.read_text()
    assert "| 3 | 1 | 1 | 0 | 0 | 0 | 2 | 0 | 0 |" in text  # totals: relu passes, bitcast and the sequence refused
    assert "| sequence or optional value | 1 |" in text and "| no converter | 1 |" in text


def test_ops_conformance_prints_the_published_totals(capsys):
    from conftest import run_cli

    published = (REPO / MARKDOWN_FILE).read_text()
    totals = published.split("## Totals", 1)[1].split("\n## ", 1)[0].strip().splitlines()[-1]
    assert run_cli("ops", "--conformance") == 0
    out = capsys.readouterr().out
    assert totals in out and "## Why cases are refused" in out
    assert "Where ONNX's reference" not in out  # the totals and causes only


def test_pass_vs_onnxruntime_is_counted_apart_and_listed():
    cases = [c for c in all_cases() if c.op_type == "Relu"]
    outcomes = {c.name: Outcome(c.name, c.op_type, "pass", how="converted") for c in cases}
    first = cases[0].name
    outcomes[first] = Outcome(first, "Relu", "pass-vs-onnxruntime", "matches onnxruntime; ONNX's reference differs")
    text = table.render_markdown(cases, outcomes)
    n = len(cases)
    assert f"| {n} | {n - 1} | {n - 1} | 0 | 0 | 1 | 0 | 0 | 0 |" in text  # totals
    assert f"| Relu | yes | {n} | {n - 1} | 1 | 0 | 0 | 0 |  |" in text
    assert f"| {first} | Relu | matches onnxruntime; ONNX's reference differs |" in text
    assert "1 pass-vs-onnxruntime" in table.Tally.of(outcomes.values()).line()
