"""``torch2ms bench`` on a generation recipe: prefill milliseconds and decode tokens per second of the
converted graphs against PyTorch eager with its own cache, with each runner's peak memory.

Runners (``RUNNERS``), on the recipe's first batch of prompts, ``max_new_tokens`` each:

* ``pytorch``: transformers' ``generate`` (greedy, its default dynamic cache), eager. Its prefill is
  ``generate(max_new_tokens=1)``; its decode rate the extra tokens of ``max_new_tokens`` over the extra
  time (a ``generate`` call has no per-step hook);
* ``onnxruntime``: the export stage's two ``model.onnx``;
* ``graph``: the fold stage's cells in GRAPH_MODE under the compile stage's chosen variant;
* ``mindir``: the mindir stage's reloaded ``network.mindir``.

For the graphs, the prefill is one prefill call and the decode rate the batch over the median decode
step. Each runner runs in a process of its own (``python -m torch2ms.generation.bench``, a worker
that times one round each time it is asked), as it would on the board: in one process, PyTorch's
generate slows the MindSpore decode that runs after it (the measurement is in
benchmarks/results/generation_bench.md). The timed rounds still interleave the runners (each round
asks every worker once, one after the other), after ``warmup`` rounds; the figures are medians over
rounds, wall time and the worker's CPU time. Peak memory: each worker's VmHWM after its rounds
(``runtime.memory``), one runner's allocations never counted for another.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from torch2ms.generation.loop import Runner, greedy
from torch2ms.generation.plan import read_plan

RUNNERS = ("pytorch", "onnxruntime", "graph", "mindir")
LABELS = {
    "pytorch": "PyTorch eager, transformers generate (dynamic cache)",
    "onnxruntime": "onnxruntime, export's graphs",
    "graph": "MindSpore GRAPH_MODE, compile's variant",
    "mindir": "MindIR, reloaded",
}


def _clock() -> np.ndarray:
    return np.array([time.perf_counter(), time.process_time()])


def _timed(runner: Runner):
    seconds: dict[str, list] = {"prefill": [], "decode": []}

    def timer(fn, key):
        def call(*args):
            start = _clock()
            out = fn(*args)
            seconds[key].append(_clock() - start)
            return out

        return call

    return Runner(timer(runner.prefill, "prefill"), timer(runner.decode, "decode")), seconds


def graph_runner(key: str, root: Path, recipe) -> Runner:
    """The converted graphs of ``key`` (see the module docstring), from the run folder ``root``."""
    from torch2ms.generation.check import stage_runner
    from torch2ms.pipeline.workspace import RunDir

    runs = {g: RunDir(root / g) for g in ("prefill", "decode")}
    stage = {"onnxruntime": "export", "graph": "compile", "mindir": "mindir"}[key]
    folder = "fold" if stage == "compile" else stage
    extra = (runs["decode"].read_record("compile") or {}).get("extra") or {}
    return stage_runner(stage, {g: r.stage_dir(folder) for g, r in runs.items()}, extra, recipe.compile.jit_level)


class _Round:
    """One timed round of every runner: per runner, [prefill, decode step] seconds (wall, CPU)."""

    def __init__(self, recipe, root: Path, keys):
        self.plan = read_plan(root)  # not from the model: a graph runner's process builds none
        self.prompts = self.plan.prompts[: self.plan.batch]
        if "pytorch" in keys:
            from torch2ms.model_loader import build_model

            self.model = build_model(recipe)
        self.runners = {k: graph_runner(k, root, recipe) for k in keys if k != "pytorch"}
        self.keys = keys

    def __call__(self) -> dict[str, np.ndarray]:
        out = {}
        for key in self.keys:
            out[key] = self._pytorch() if key == "pytorch" else self._graphs(self.runners[key])
        return out

    def _graphs(self, runner: Runner) -> np.ndarray:
        timed, seconds = _timed(runner)
        greedy(timed, self.prompts, self.plan.max_new_tokens, self.plan.cache_length, None, self.plan.prompt_length)
        return np.stack([seconds["prefill"][0], np.median(seconds["decode"], axis=0)])

    def _pytorch(self) -> np.ndarray:
        import torch

        from torch2ms.generation.loop import left_pad
        from torch2ms.generation.reference import generation_config

        ids, mask = (torch.from_numpy(a).long() for a in left_pad(self.prompts, self.plan.prompt_length))
        took = {}
        for n in (1, self.plan.max_new_tokens):
            config = generation_config(n, self.plan.cache_length)
            config.cache_implementation, config.max_cache_len = None, None
            config.output_logits, config.return_dict_in_generate = False, False
            start = _clock()
            with torch.no_grad():
                self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            took[n] = _clock() - start
        steps = max(self.plan.max_new_tokens - 1, 1)
        return np.stack([took[1], (took[self.plan.max_new_tokens] - took[1]) / steps])


MARK = "torch2ms-bench "  # a worker's answer line; anything else on its stdout is a library's output


class _Worker:
    """One runner in a process of its own (``_serve``): ``round()`` times one round in it."""

    def __init__(self, recipe_path: Path, out_root: Path | None, key: str):
        from torch2ms.bench.core import _child_env

        cmd = [sys.executable, "-m", "torch2ms.generation.bench", str(recipe_path), str(out_root or ""), key]
        self.key = key
        self.stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=_child_env()
        )

    def ask(self, what: str):
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.proc.wait()
        self.stderr.seek(0)
        tail = [ln for ln in self.stderr.read().splitlines() if ln.strip()][-3:]
        raise RuntimeError(
            f"the bench worker of {self.key} exited ({self.proc.returncode}) before answering {what!r}: "
            + " | ".join(tail)
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self.stderr.close()


def measure(recipe, recipe_path: Path, out_root: Path | None, keys=RUNNERS, runs: int = 10, warmup: int = 2) -> dict:
    """Per runner: prefill ms and decode tokens/s (wall and CPU), medians of ``runs`` interleaved
    rounds, and its process's peak RSS (see the module docstring)."""
    workers = [_Worker(recipe_path, out_root, k) for k in keys]
    try:
        for _ in range(warmup):
            for w in workers:
                w.ask("round")
        rounds = [{w.key: np.array(w.ask("round")) for w in workers} for _ in range(runs)]
        peaks = {w.key: w.ask("peak") for w in workers}
    finally:
        for w in workers:
            w.close()
    plan = read_plan(Path(out_root or recipe.output) / recipe.name)
    batch = len(plan.prompts[: plan.batch])  # the first batch, as _Round runs it
    out = {}
    for key in keys:
        med = np.median(np.stack([r[key] for r in rounds]), axis=0)  # [prefill, step] x [wall, cpu]
        out[key] = {
            "prefill_ms": [round(1e3 * float(v), 3) for v in med[0]],
            "decode_tokens_per_s": [round(batch / float(v), 1) for v in med[1]],
            "peak_rss_mb": peaks[key],
        }
    return out


def _serve(recipe_path: str, out_root: str, key: str) -> None:
    """``python -m torch2ms.generation.bench RECIPE OUT_ROOT KEY``: the runner ``key`` built once, then
    per line of stdin, "round": one timed round (``[[prefill wall, cpu], [step wall, cpu]]``), "peak":
    this process's peak RSS in MB; answers on stdout after ``MARK``."""
    from torch2ms.runtime.cpu import configure_cpu

    configure_cpu()  # the parent's ISA cap and thread budget came with its environment
    from torch2ms.recipe import load_recipe
    from torch2ms.runtime.memory import process_peak_rss_mb

    recipe = load_recipe(recipe_path)
    one_round = _Round(recipe, Path(out_root or recipe.output) / recipe.name, (key,))
    for line in sys.stdin:
        if line.strip() == "round":
            answer = one_round()[key].tolist()
        else:
            answer = round(process_peak_rss_mb(), 1)
        print(MARK + json.dumps(answer), flush=True)


def markdown(recipe, result: dict) -> str:
    rows = [
        f"| {LABELS[k]} | {v['prefill_ms'][0]:.2f} / {v['prefill_ms'][1]:.2f} | "
        f"{v['decode_tokens_per_s'][0]:.0f} / {v['decode_tokens_per_s'][1]:.0f} | "
        f"{_ratio(v, result.get('pytorch'))} | {v.get('peak_rss_mb', float('nan')):.0f} |"
        for k, v in result.items()
    ]
    return "\n".join(
        [
            f"`torch2ms bench` on {recipe.name} (prompts of the first batch, {recipe.generate.max_new_tokens} new "
            "tokens each): medians of interleaved rounds, wall / CPU.",
            "",
            "| runner | prefill ms (wall / CPU) | decode tokens/s (wall / CPU) | decode vs PyTorch eager (wall / CPU) "
            "| peak RSS MB (alone) |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )


def _ratio(v: dict, base: dict | None) -> str:
    if not base:
        return "-"
    return " / ".join(f"{a / b:.2f}x" for a, b in zip(v["decode_tokens_per_s"], base["decode_tokens_per_s"]))


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
