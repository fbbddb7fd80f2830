"""What a stage costs and how it is decided cheaply: per-stage seconds and resident memory in
stage.json and the report, the memory measurement itself, the calibration's image count, and the
compile stage's interleaved timing with its Mann-Whitney confidence."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conftest import write_recipe
from scipy.stats import mannwhitneyu

from torch2ms.model_loader import calibration_passes
from torch2ms.pipeline.report import write_reports
from torch2ms.recipe import load_recipe
from torch2ms.runtime import latency
from torch2ms.runtime.memory import StageMemory, process_peak_rss_mb
from torch2ms.stages import pipeline_runner, stage_names


def test_every_stage_records_its_seconds_and_peak_rss(tmp_path):
    path = write_recipe(tmp_path / "tiny.yaml")
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    write_reports(result)
    assert result.passed
    for stage in stage_names():
        rec = json.loads((result.root / stage / "stage.json").read_text())
        assert rec["seconds_total"] >= rec["seconds"] > 0 and rec["cpu_seconds"] > 0, stage
        mem = rec["memory"]
        assert mem["peak_of"] == "stage", stage
        # torch is imported, so every stage's process holds more than 100 MB
        # each figure is rounded to 0.1 MB on its own
        assert mem["peak_rss_mb"] >= max(mem["rss_start_mb"], mem["rss_end_mb"]) - 0.1 > 100, (stage, mem)
        assert mem["increment_mb"] == pytest.approx(mem["peak_rss_mb"] - mem["rss_start_mb"], abs=0.2)
    table = (result.root / "report.md").read_text()
    assert "| stage | status | seconds | peak RSS MB |" in table
    export = json.loads((result.root / "export" / "stage.json").read_text())
    assert f"| export | passed | {export['seconds_total']:.1f} | {export['memory']['peak_rss_mb']:.0f} |" in table
    # onnxruntime met the recipe's bound on this well-conditioned net: float64 had nothing to decide
    assert export["extra"]["float32_floor_needed"] is False and "float32_floor" not in export["extra"]
    # compile states its speedup against the PyNative calls rebuild's check made (one per sample),
    # not against more calls of its own
    calls = json.loads((result.root / "rebuild" / "stage.json").read_text())["extra"]["pynative_call_s"]
    assert len(calls) == result.recipe.check.samples and min(calls) > 0
    pynative = json.loads((result.root / "compile" / "compile.json").read_text())["variants"]["pynative_plain"]
    assert pynative == {**latency.summary(calls[0], calls), "timed_in": "the rebuild stage's check"}


def test_stage_memory_sees_a_peak_that_was_freed_before_the_block_ended():
    before = process_peak_rss_mb()
    with StageMemory() as mem:
        block = np.ones(300 * 2**20 // 8)  # 300 MB, touched
        del block
    rec = mem.to_dict()
    assert rec["peak_of"] == "stage"
    assert rec["increment_mb"] > 280, rec  # the block's peak, though it was freed before the block ended
    # the process's peak survives the reset (the record rounds to 0.1 MB)
    assert process_peak_rss_mb() >= max(before, rec["peak_rss_mb"] - 0.05)


@pytest.mark.parametrize(
    "shapes, passes",
    [
        ([(1, 3, 224, 224)], 4),  # 16 images of 4, as before, at 224x224 and below
        ([(1, 3, 32, 32)], 4),
        ([(1, 16)], 4),  # no spatial dimensions
        ([(1, 3, 320, 320)], 2),  # 8 images
        ([(1, 3, 512, 512)], 1),  # 4 images keep ~16 x 224 x 224 pixels per channel
        ([(1, 3, 1024, 1024)], 1),
    ],
)
def test_calibration_images_keep_the_pixels_per_channel(shapes, passes):
    assert calibration_passes(shapes) == passes


@pytest.mark.parametrize(
    "a, b",
    [
        ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
        ([1.0, 5.0, 3.0], [4.0, 2.0, 6.0]),
        ([1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 6.0, 8.0, 9.0]),
        ([9.0, 8.0], [1.0, 2.0, 3.0]),
        ([0.1, 0.5, 0.3, 0.9, 0.2, 0.4], [0.6, 0.7, 0.35, 1.0, 0.8, 0.45]),
    ],
)
def test_mann_whitney_p_is_scipys_exact_one(a, b):
    want = mannwhitneyu(a, b, alternative="less", method="exact").pvalue
    assert latency.mann_whitney_p(a, b) == pytest.approx(want, rel=1e-12)


def test_faster_variant_stops_once_decided_and_says_when_it_is_not():
    calls = {"slow": lambda: time.sleep(0.03), "fast": lambda: None}
    chosen, times, decision = latency.faster_variant(calls, max_rounds=10)
    assert chosen == "fast" and decision == {"rounds": 3, "p_value": 0.05, "alpha": 0.05, "decided": True}
    assert len(times["slow"]) == len(times["fast"]) == 3

    same = {"a": lambda: time.sleep(0.002), "b": lambda: time.sleep(0.002)}
    _, times, decision = latency.faster_variant(same, max_rounds=4, alpha=1e-6)  # no 4 rounds reach 1e-6
    # stopped after min_rounds: 4 calls each all ranking one way give p = 1/70 at best
    assert decision["rounds"] == 3 and not decision["decided"] and len(times["a"]) == 3
    assert decision["stopped"] == "no 4 rounds reach p <= 1e-06"


@pytest.mark.parametrize(
    "a, b, k",
    [([1.0, 5.0, 3.0], [4.0, 2.0, 6.0], 2), ([1.0, 2.0], [3.0, 4.0], 3), ([9.0, 8.0, 7.0], [1.0, 2.0, 3.0], 4)],
)
def test_best_reachable_p_is_the_p_of_the_most_one_sided_continuation(a, b, k):
    # the continuation: k more calls of a, each faster than every call, and k of b, each slower
    low, high = min(a + b) - 1.0, max(a + b) + 1.0
    want = mannwhitneyu(a + [low] * k, b + [high] * k, alternative="less", method="exact").pvalue
    assert latency.best_reachable_p(a, b, k) == pytest.approx(want, rel=1e-12)


def test_faster_variant_stops_once_no_remaining_round_can_decide(monkeypatch):
    # two equally fast variants whose calls alternate in rank: the scripted seconds of each call
    script = iter([1.0, 2.0] * 20)  # a wins the even rounds, b (timed first there) the odd ones
    monkeypatch.setattr(latency, "time_call", lambda call: next(script))
    chosen, times, decision = latency.faster_variant({"a": None, "b": None}, max_rounds=10)
    rounds = decision["rounds"]
    assert 3 <= rounds < 10 and not decision["decided"] and decision["stopped"]
    # at the stop, even the most one-sided rest of the 10 rounds leaves p above 0.05, either way
    for x, y in (("a", "b"), ("b", "a")):
        low, high = min(times["a"] + times["b"]) - 1, max(times["a"] + times["b"]) + 1
        rest = 10 - rounds
        p = mannwhitneyu(times[x] + [low] * rest, times[y] + [high] * rest, alternative="less", method="exact")
        assert p.pvalue > 0.05
    # one round earlier it could still have been decided (it stops at the first such round)
    earlier = {k: v[:-1] for k, v in times.items()}
    assert min(latency.best_reachable_p(earlier[x], earlier[y], rest + 1) for x, y in (("a", "b"), ("b", "a"))) <= 0.05


@pytest.mark.parametrize("samples, warmup, after", [(3, 1, 1), (3, 2, 0), (2, 2, 0), (1, 1, 0)])
def test_compile_checks_the_samples_its_warm_up_calls_ran_without_running_them_again(
    tmp_path, monkeypatch, samples, warmup, after
):
    """Each warm-up call runs the next sample; the check takes the chosen cell's outputs of those
    samples (and of the first, from its timed calls), so only the samples no call ran run again. The
    check against PyTorch passing says each output is its own sample's."""
    from torch2ms.runtime import msutil

    path = write_recipe(
        tmp_path / "tiny.yaml", check={"samples": samples}, compile={"graph_kernel": "off", "warmup": warmup, "runs": 3}
    )
    stage, ran = {"now": None}, []
    real = msutil.run_cell

    def run_cell(cell, inputs, *a, **k):
        if stage["now"] == "compile":
            ran.append(len(inputs))
        return real(cell, inputs, *a, **k)

    def on_stage(name, state):
        stage["now"] = name if state == "running" else None

    monkeypatch.setattr(msutil, "run_cell", run_cell)
    result = pipeline_runner(load_recipe(path), log=lambda m: None, on_stage=on_stage).run()
    assert result.passed, [(s.stage, s.reason) for s in result.stages]
    assert ran == [after]
