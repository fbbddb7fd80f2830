"""``torch2ms bench`` on the tiny model: the outputs exist and every variant carries its check.

No timing assertions: the numbers depend on the machine; the test checks the plumbing (the
pipeline ran, every variant was checked and timed or reported, the files are written, the run's
report links them), plus the pure parts (IR parsing, report section replacement).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from torch2ms.bench.fusion import parse_graph_build
from torch2ms.bench.report import link_report
from torch2ms.bench.variants import VARIANTS
from torch2ms.cli import _load_commands
from torch2ms.cli_app import app

IR = """# IR entry: @kernel_graph0
subgraph attr:
graph_kernel: BiasAdd_ReLU_fusion
subgraph @_anonymous__1(%para1, %para2) {
  %0(CNode_1) = PrimFunc_Add(%para1, %para2) cnode_attrs: {}
  %1(CNode_2) = PrimFunc_ReLU(%0)
  Return(%1)
}

subgraph @kernel_graph0() {
  %0(CNode_3) = Load(%para9, UMonad[U])
  %1(output) = Conv2D(%para8, %0) {instance name: conv2d}
  %2(CNode_4) = call @_anonymous__1(%1, %0)
  %3(CNode_5) = PrimFunc_MatMul(%2, %0)
  %4(CNode_6) = UpdateState(U, %3)
  Return(%3)
}
"""


def test_parse_graph_build_counts_kernels_and_fused_groups():
    parsed = parse_graph_build(IR)
    assert parsed["ops"] == {"Conv2D": 1, "MatMul": 1}  # Load / UpdateState / Return are not kernels
    assert parsed["fused_kernels"] == 1
    assert parsed["fused_groups"] == {"BiasAdd_ReLU_fusion": 1}
    assert parsed["kernels"] == 3


def test_link_report_replaces_its_own_section(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# report\n\ntable\n")
    link_report(report, "first")
    link_report(report, "second")
    text = report.read_text()
    assert text.count("## Benchmark") == 1 and "second" in text and "first" not in text
    assert text.startswith("# report\n\ntable")


def test_bench_tiny_writes_table_json_and_png(tiny_recipe):
    """Every variant timed and checked; then two of them alone in a subprocess each for their peak
    RSS (one subprocess per variant costs its imports: the memory runs are not repeated for all)."""
    _load_commands()
    args = ["bench", "--recipe", str(tiny_recipe), "--runs", "2", "--warmup", "1", "--no-fusion"]
    result = CliRunner().invoke(app, [*args, "--no-memory"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    bench_dir = tiny_recipe.parent / "runs" / "tiny" / "bench"
    data = json.loads((bench_dir / "bench.json").read_text())
    results = data["batches"]["1"]
    assert set(results) == {v.key for v in VARIANTS}
    for key, r in results.items():
        assert r["status"] in ("ok", "wrong", "error"), key
        if r["status"] != "error":
            assert "passed" in r["check"] and "rel_error" in r["check"], key
        if r["status"] == "ok":
            assert r["median_ms"] is not None and len(r["samples_ms"]) == 2, key
    assert results["torch"]["status"] == "ok" and results["ms_graph_folded"]["status"] == "ok"
    assert (bench_dir / "latency.png").stat().st_size > 1000
    assert "ms_graph_folded" in (bench_dir / "bench.md").read_text()
    assert "## Benchmark" in (bench_dir.parent / "report.md").read_text()
    assert "ms_pynative_plain" in result.output  # the terminal table

    result = CliRunner().invoke(app, [*args, "--variants", "torch,ms_mindir"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads((bench_dir / "bench.json").read_text())["batches"]["1"]
    assert set(results) == {"torch", "ms_mindir"}
    for key, r in results.items():
        assert r["status"] == "ok" and r["peak_rss_mb"] and r["peak_rss_mb"] > 0, key
        assert r["import_rss_mb"] and r["import_rss_mb"] <= r["peak_rss_mb"], key


def test_targets_pick_the_fastest_correct_mindspore_variant():
    from torch2ms.bench.report import target_lines, targets

    def r(ms, status="ok", rss=None):
        return {"status": status, "median_ms": ms, "peak_rss_mb": rss}

    data = {
        "batches": {
            "1": {
                "torch": r(40.0),
                "onnxruntime": r(30.0),
                "ms_pynative_plain": r(100.0, rss=900),
                "ms_graph_folded": r(45.0),
                "ms_graph_folded_gk": r(20.0, status="wrong"),  # fast but wrong: never "best"
                "ms_mindir": r(48.0, rss=800),
            }
        }
    }
    got = {t.split(": ", 1)[1]: (v, met) for t, v, met in targets(data)}
    assert all("best = ms_graph_folded 45.0 ms" in t for t, _, _ in targets(data)[:3])
    assert got["speed-up vs PyNative plain >= 2x"] == ("2.22x", True)
    assert got["time vs PyTorch eager <= 1x"] == ("1.12x", False)
    assert got["time vs onnxruntime <= 1.25x"] == ("1.50x", False)
    assert got["peak RSS of ms_mindir <= ms_pynative_plain"] == ("800 vs 900 MB", True)
    assert "**not met**" in "\n".join(target_lines(data))


def test_bench_checks_each_variant_under_the_bound_its_stage_recorded(tiny_recipe):
    """The compile stage's record is edited to a bound tighter than what GRAPH_MODE reached: the
    folded variant must then be wrong under that bound, named by its ``by``; the rebuild's record
    is left alone, so the Conv2dBnAct variant passes under the rebuild's own bound. A bench that
    took the recipe's bound (or any other) would pass the first and name the recipe."""
    _load_commands()
    args = ["bench", "--recipe", str(tiny_recipe), "--runs", "1", "--warmup", "0", "--no-fusion", "--no-memory"]
    variants = ["--variants", "ms_graph_conv_bn_act,ms_graph_folded"]
    result = CliRunner().invoke(app, [*args, *variants], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = tiny_recipe.parent / "runs" / "tiny"
    record_path = run / "compile" / "stage.json"
    record = json.loads(record_path.read_text())
    worst = max(record["metrics"], key=lambda m: m["rel_error"])
    assert worst["rel_error"] > 0, "GRAPH_MODE matched PyTorch bit for bit: the test cannot tighten below it"
    record["bounds"] = {
        m["name"]: {"rel_error": worst["rel_error"] / 4, "cosine": 0.99999, "by": "tightened by the test"}
        for m in record["metrics"]
    }
    record_path.write_text(json.dumps(record))
    result = CliRunner().invoke(app, [*args, *variants], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads((run / "bench" / "bench.json").read_text())["batches"]["1"]
    folded = results["ms_graph_folded"]
    assert folded["status"] == "wrong" and "tightened by the test" in folded["reason"]
    assert folded["check"]["bound_by"] == "tightened by the test" and folded["check"]["bound_stage"] == "compile"
    assert folded["check"]["bound_rel_error"] == worst["rel_error"] / 4
    rebuild = json.loads((run / "rebuild" / "stage.json").read_text())
    conv = results["ms_graph_conv_bn_act"]["check"]
    assert conv["bound_stage"] == "rebuild" and conv["passed"]
    assert conv["bound_by"] == next(iter(rebuild["bounds"].values()))["by"]
