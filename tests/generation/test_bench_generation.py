"""``torch2ms bench`` on a converted generation recipe: every runner, in a process of its own, times
its prefill and decode and reports its peak memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from torch2ms.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_times_every_runner_of_a_converted_generation_recipe(tmp_path):
    from torch2ms.generation.bench import RUNNERS, measure
    from torch2ms.generation.convert import generation_runners, run_generation

    data = yaml.safe_load((REPO / "recipes" / "llama_tiny_generate.yaml").read_text())
    data["output"] = str(tmp_path / "runs")
    data["compile"]["graph_kernel"] = "off"
    data["generate"].update(prompt_lengths=[7, 3], max_new_tokens=4, cache_length=12)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    results = run_generation(generation_runners(recipe, None, lambda m: None, own_processes=False))
    assert all(s.status == "passed" for s in results["decode"].stages)
    measured = measure(recipe, path, None, RUNNERS, runs=1, warmup=0)
    for key in RUNNERS:
        assert all(v > 0 for v in measured[key]["prefill_ms"] + measured[key]["decode_tokens_per_s"]), key
    # each runner alone in a process of its own: PyTorch's process holds the model, the MindIR's does not
    peaks = {key: measured[key]["peak_rss_mb"] for key in RUNNERS}
    assert all(v > 0 for v in peaks.values()) and peaks["pytorch"] != peaks["mindir"], peaks
