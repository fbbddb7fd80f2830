"""Issue 39's groundwork measured: generation with the prefill/decode graphs against transformers.

    TORCH2MS_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/generation_groundwork.py \
        [--md benchmarks/results/generation_groundwork.md] [--repeats 7] [--out /tmp/generation_groundwork]

For the tiny Llama (grouped-query attention, rotary positions), Qwen2 and GPT-2 (learned positions)
of ``tests/generation/tiny.py`` (2 layers, hidden 64, vocabulary 1000), seeded random weights:

1. token agreement of greedy decoding with the PyTorch graphs and with onnxruntime on the exported
   ONNX files, against ``generate(do_sample=False, cache_implementation="static")``: the first
   differing (step, row) with both tokens and the top-2 gap, per-step logits errors free-running
   and teacher-forced;
2. the top-2 logit gaps of the reference over three weight seeds, against the float noise measured
   in (1): how rare near-ties are;
3. a cache written one position off, caught or not by the tokens;
4. the cache writes (``generation.cache.UPDATES``): their ONNX ops, ``torch2ms check`` and its Ascend
   310 placement, onnxruntime's decode step;
5. timing side by side, interleaved: prefill ms and decode tokens/s of transformers' generate
   (its dynamic cache, and its static cache), the PyTorch graphs, onnxruntime on the graphs;
6. the tiny Llama's two ONNX files through ``torch2ms convert`` as ONNX-source recipes (seeded
   inputs, onnxruntime the reference), graph-kernel fusion ``auto`` and ``off``.
"""

from __future__ import annotations

import argparse
import collections
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.generation.tiny import build  # noqa: E402
from torch2ms.generation.cache import UPDATES, update_blend  # noqa: E402
from torch2ms.generation.compare import first_divergence, gap_summary, step_errors  # noqa: E402
from torch2ms.generation.export import export_graphs, onnx_runner  # noqa: E402
from torch2ms.generation.graphs import Decode, Prefill  # noqa: E402
from torch2ms.generation.loop import greedy_batches, left_pad, torch_runner  # noqa: E402
from torch2ms.generation.plan import cache_geometry  # noqa: E402
from torch2ms.generation.reference import generation_config, transformers_generate  # noqa: E402

MODELS = ("llama", "qwen2", "gpt2")
BATCH, NEW, CACHE = 2, 16, 32
LENGTHS = (5, 12, 3, 9, 7, 12, 4, 10)  # 8 prompts, left-padded to 12; 12 + 16 <= 32


def prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 1000, n)] for n in LENGTHS]


def graphs(model, write=update_blend):
    layers = cache_geometry(model).layers
    return Prefill(model, layers, CACHE), Decode(model, layers, CACHE, write)


def agreement(name: str, out: Path) -> dict:
    """Section 1 and 3 for one model."""
    model = build(name)
    ps = prompts()
    ref = transformers_generate(model, ps, NEW, CACHE, BATCH)
    exported = export_graphs(*graphs(model), cache_geometry(model), BATCH, max(LENGTHS), out / name)
    rows = {}
    for label, runner in (("PyTorch graphs", torch_runner(*graphs(model))), ("onnxruntime", onnx_runner(exported))):
        free = greedy_batches(runner, ps, BATCH, NEW, CACHE)
        forced = greedy_batches(runner, ps, BATCH, NEW, CACHE, teacher=ref.tokens)
        div = first_divergence(ref, free)
        until = div.step + 1 if div else NEW
        rows[label] = {
            "same": int((free.tokens == ref.tokens).sum()),
            "divergence": div.describe() if div else "none",
            "free_rel": max(e.rel_error for e in step_errors(ref, free)[:until]),
            "forced_rel": max(e.rel_error for e in step_errors(ref, forced)),
            "forced_top1": min(e.top1_agreement for e in step_errors(ref, forced)),
            "noise": float(np.abs(forced.logits - ref.logits).max()),
        }

    def one_off(cache, new, slot):
        return update_blend(cache, new, slot + 1)

    wrong = greedy_batches(torch_runner(*graphs(model, one_off)), ps, BATCH, NEW, CACHE)
    div = first_divergence(ref, wrong)
    rows["one position off"] = {
        "same": int((wrong.tokens == ref.tokens).sum()),
        "divergence": div.describe() if div else "none (not caught by the tokens)",
        "free_rel": max(e.rel_error for e in step_errors(ref, wrong)[: (div.step + 1 if div else NEW)]),
    }
    return {"rows": rows, "total": ref.tokens.size, "attempts": exported.attempts}


def gaps(name: str, noise: float) -> dict:
    """Section 2: the reference's top-2 gaps over three weight seeds and their prompts."""
    from torch2ms.generation.loop import Generated

    parts = [transformers_generate(build(name, seed), prompts(seed), NEW, CACHE, BATCH) for seed in (0, 1, 2)]
    joined = Generated(np.concatenate([p.tokens for p in parts]), np.concatenate([p.logits for p in parts]))
    tie = 10 * noise
    s = gap_summary(joined, thresholds=(tie, 1e-4, 1e-3, 1e-2))
    return {"summary": s, "tie": tie}


def writes(out: Path) -> list[dict]:
    """Section 4: each cache write exported, checked and timed in onnxruntime (the decode step)."""
    model = build("llama")
    rows = []
    for name, write in UPDATES.items():
        exported = export_graphs(*graphs(model, write), cache_geometry(model), BATCH, max(LENGTHS), out / name)
        runner = onnx_runner(exported)
        step = runner.decode
        ms = _median_ms(step, _decode_args(runner), 50)
        rows.append({"write": name, "check": _check(exported.decode), "ms": ms})
    return rows


def _check(path: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch2ms", "check", "--target", "ascend310", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={"COLUMNS": "300", "PATH": ""}, cwd=ROOT)
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    keep = [
        line.replace(str(path), path.name)
        for line in lines
        if line.startswith(("OK", "AI Core", "No op", "AI CPU", "unsupported"))
    ]
    return [f"exit {done.returncode}", *keep]


def _decode_args(runner):
    ids, mask = left_pad(prompts()[:BATCH], max(LENGTHS))
    _, keys, values = runner.prefill(ids, mask)
    cache_mask = np.zeros((BATCH, CACHE), dtype=np.int32)
    cache_mask[:, : ids.shape[1] + 1] = 1
    step = np.array([ids.shape[1]], dtype=np.int32)
    return ids[:, -1:], mask.sum(1).astype(np.int32), step, cache_mask, keys, values


def _median_ms(fn, args, runs: int) -> float:
    fn(*args)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


GRAPH_INPUTS = {
    "prefill": [
        {"name": "input_ids", "shape": [BATCH, max(LENGTHS)], "dtype": "int32", "range": [0, 1000]},
        {"name": "attention_mask", "shape": [BATCH, max(LENGTHS)], "dtype": "int32", "lengths": [12, 7]},
    ],
    "decode": [
        {"name": "input_ids", "shape": [BATCH, 1], "dtype": "int32", "range": [0, 1000]},
        {"name": "position", "shape": [BATCH], "dtype": "int32", "range": [0, 20]},
        {"name": "cache_position", "shape": [1], "dtype": "int32", "range": [12, 13]},
        {"name": "attention_mask", "shape": [BATCH, CACHE], "dtype": "int32", "lengths": [13, 9]},
        {"name": "keys", "shape": [2, BATCH, 2, CACHE, 16]},
        {"name": "values", "shape": [2, BATCH, 2, CACHE, 16]},
    ],
}


def convert_graphs(out: Path) -> list[dict]:
    """Section 6: ``torch2ms convert`` on the tiny Llama's prefill.onnx, and decode.onnx with two cache writes."""
    import json

    import yaml

    rows = []
    runs = [("prefill", "blend", "auto"), *(("decode", w, k) for w in ("blend", "where") for k in ("auto", "off"))]
    for graph, write, kernel in runs:
        inputs = GRAPH_INPUTS[graph]
        folder = out / "convert" / f"{graph}_{write}_{kernel}"
        folder.mkdir(parents=True, exist_ok=True)
        recipe = {
            "name": graph,
            "model": {"onnx": str(out / "writes" / write / f"{graph}.onnx")},
            "inputs": inputs,
            "compile": {"graph_kernel": kernel},
            "output": str(folder / "runs"),
        }
        (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
        cmd = [sys.executable, "-m", "torch2ms", "convert", "--recipe", str(folder / "recipe.yaml")]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        stages = []
        for stage in ("export", "rebuild", "fold", "compile", "mindir"):
            record = folder / "runs" / graph / stage / "stage.json"
            r = json.loads(record.read_text()) if record.exists() else {"status": "not run"}
            worst = max((m.get("rel_error") or 0 for m in r.get("metrics", [])), default=None)
            stages.append((stage, r["status"], worst))
        rows.append({"graph": graph, "write": write, "graph_kernel": kernel, "exit": done.returncode, "stages": stages})
    return rows


def _timed(runner):
    """``runner`` whose calls record their seconds, wall and CPU: (runner, {"prefill": [...], "decode": [...]})."""
    from torch2ms.generation.loop import Runner

    seconds = {"prefill": [], "decode": []}

    def timer(fn, key):
        def call(*args):
            t, c = time.perf_counter(), time.process_time()
            out = fn(*args)
            seconds[key].append(np.array([time.perf_counter() - t, time.process_time() - c]))
            return out

        return call

    return Runner(timer(runner.prefill, "prefill"), timer(runner.decode, "decode")), seconds


def _generate_seconds(model, config, ids, mask) -> np.ndarray:
    """Wall and CPU seconds of one ``generate``."""
    t, c = time.perf_counter(), time.process_time()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return np.array([time.perf_counter() - t, time.process_time() - c])


def timing(out: Path, repeats: int) -> dict:
    """Section 5: the tiny Llama, one batch of BATCH prompts, NEW tokens each, interleaved runs."""
    model = build("llama")
    ps = prompts()[:BATCH]
    exported = export_graphs(*graphs(model), cache_geometry(model), BATCH, max(LENGTHS), out / "timing")
    runners = {"PyTorch graphs": torch_runner(*graphs(model)), "onnxruntime graphs": onnx_runner(exported)}
    ids, mask = (torch.from_numpy(a).long() for a in left_pad(ps, max(LENGTHS)))
    configs = {}
    for label, static in (
        ("transformers generate, dynamic cache", False),
        ("transformers generate, static cache", True),
    ):
        configs[label] = {}
        for n in (1, NEW):
            c = generation_config(n, CACHE)
            c.output_logits, c.return_dict_in_generate = False, False
            if not static:
                c.cache_implementation, c.max_cache_len = None, None
            configs[label][n] = c
    samples = collections.defaultdict(lambda: collections.defaultdict(list))
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        for label, by_n in configs.items():
            for n, c in by_n.items():
                samples[label][n].append(_generate_seconds(model, c, ids, mask))
        for label, runner in runners.items():
            timed, seconds = _timed(runner)
            greedy_batches(timed, ps, BATCH, NEW, CACHE)
            samples[label]["prefill"].append(seconds["prefill"][0])
            samples[label]["step"].append(np.median(seconds["decode"], axis=0))
    result = {}
    for label, s in samples.items():
        med = {k: np.median(v[1:], axis=0) for k, v in s.items()}
        if label in configs:
            result[label] = (1e3 * med[1], BATCH * (NEW - 1) / (med[NEW] - med[1]))
        else:
            result[label] = (1e3 * med["prefill"], BATCH / med["step"])
    return result


def markdown(agree: dict, gap: dict, write_rows: list, times: dict, repeats: int, converted=None) -> str:
    lines = [
        "# Generation groundwork (issue 39): prefill/decode graphs against transformers' generate",
        "",
        f"`benchmarks/generation_groundwork.py`, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}, onnxruntime {__import__('onnxruntime').__version__}, "
        "one thread (`TORCH2MS_THREADS=1`), AVX2-only AMD EPYC, 2 cores shared with other jobs.",
        "",
        f"Models: `tests/generation/tiny.py` (2 layers, hidden 64, vocabulary 1000, 64 positions), seeded random "
        f"weights (transformers' own init, seed 0). {len(LENGTHS)} prompts of lengths {list(LENGTHS)} (seeded ids), "
        f"left-padded to {max(LENGTHS)}, batch {BATCH}, {NEW} new tokens, cache length {CACHE}. Reference: "
        "`generate(do_sample=False, cache_implementation='static', max_cache_len=32)`, no end-of-sequence token.",
        "",
        "## 1. Token agreement",
        "",
        "| model | run | tokens equal | first difference | max rel err (free-running, to the first difference) "
        "| max rel err (teacher-forced) | min top-1 (teacher-forced) | max abs logit diff (teacher-forced) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in agree.items():
        for label, r in a["rows"].items():
            lines.append(
                f"| {name} | {label} | {r['same']}/{a['total']} | {r['divergence']} | {r['free_rel']:.2e} | "
                + (
                    f"{r['forced_rel']:.2e} | {r['forced_top1']:.3f} | {r['noise']:.2e} |"
                    if "forced_rel" in r
                    else "- | - | - |"
                )
            )
    lines += ["", "Exported with: " + "; ".join(f"{n}: {a['attempts']}" for n, a in agree.items()), ""]
    lines += [
        "## 2. How rare near-ties are",
        "",
        "Top-1 minus top-2 logit of the reference at every step and row, over weight seeds 0, 1, 2 (and prompt "
        "seeds 0, 1, 2). A near-tie is a gap within 10x the largest teacher-forced logit difference of section 1 "
        "(onnxruntime against transformers).",
        "",
        "| model | gaps | near-tie bound | near-ties | < 1e-4 | < 1e-3 | < 1e-2 | smallest | p1 | p10 | p50 "
        "| max abs logit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, g in gap.items():
        s, below = g["summary"], list(g["summary"].below.values())
        q = s.quantiles
        lines.append(
            f"| {name} | {s.count} | {g['tie']:.1e} | {below[0]} | {below[1]} | {below[2]} | {below[3]} | "
            f"{s.smallest:.2e} | {q['p1']:.2e} | {q['p10']:.2e} | {q['p50']:.2e} | {s.scale:.2f} |"
        )
    lines += [
        "",
        "## 3. Cache writes (tiny Llama decode graph)",
        "",
        "The graphs use `blend` (`generation.cache.update_blend`: `cache * (1 - hit) + new * hit`, `hit` a one-hot "
        "row compared in float32); `where` selects with it (Where); `index_copy` (transformers' StaticLayer op, out "
        "of place) and `scatter` export to ScatterElements.",
        "",
    ]
    lines += ["| write | `torch2ms check --target ascend310 decode.onnx` | onnxruntime decode step ms (wall) |"]
    lines += ["|---|---|---|"]
    for w in write_rows:
        lines.append(f"| {w['write']} | {'<br>'.join(w['check'])} | {w['ms']:.3f} |")
    base = times["transformers generate, dynamic cache"]
    lines += [
        "",
        f"## 4. Timing, tiny Llama (batch {BATCH}, prompt {max(LENGTHS)}, {NEW} tokens; median of {repeats} "
        "interleaved rounds)",
        "",
        "transformers' prefill is `generate(max_new_tokens=1)`; its decode rate is the extra tokens of "
        f"`max_new_tokens={NEW}` over the extra time. The graphs' prefill is one prefill call, their decode rate "
        "the batch over the median decode step.",
        "",
        "Wall time, and the process's CPU time: every runner is single-threaded, so CPU time is the figure other "
        "jobs on the shared cores disturb least.",
        "",
        "| runner | prefill ms (wall / CPU) | decode tokens/s (wall / CPU) | decode vs transformers, dynamic cache "
        "(wall / CPU) |",
        "|---|---|---|---|",
    ]
    for label, (pre, rate) in times.items():
        lines.append(
            f"| {label} | {pre[0]:.2f} / {pre[1]:.2f} | {rate[0]:.0f} / {rate[1]:.0f} | "
            f"{rate[0] / base[1][0]:.2f}x / {rate[1] / base[1][1]:.2f}x |"
        )
    if converted:
        lines += [
            "",
            "## 5. The tiny Llama's graphs through `torch2ms convert` (ONNX-source recipes)",
            "",
            "Seeded inputs (token ids, positions, cache slot 12, masks, a standard-normal cache), onnxruntime the "
            "reference; status and max rel err of every output per stage.",
            "",
            "| graph | cache write | compile.graph_kernel | exit | export | rebuild | fold | compile | mindir |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in converted:
            cells = [f"{status} {'' if err is None else f'{err:.1e}'}".strip() for _, status, err in c["stages"]]
            lines.append(
                f"| {c['graph']} | {c['write']} | {c['graph_kernel']} | {c['exit']} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--md", type=Path, default=ROOT / "benchmarks/results/generation_groundwork.md")
    parser.add_argument("--out", type=Path, default=Path("/tmp/generation_groundwork"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--render", action="store_true", help="write the table from OUT/results.pickle, no runs")
    parser.add_argument("--convert-only", action="store_true", help="run section 6 alone on OUT's earlier results")
    args = parser.parse_args()
    if args.render or args.convert_only:
        with open(args.out / "results.pickle", "rb") as f:
            results = list(pickle.load(f))[:4]
        if args.convert_only:
            results.append(convert_graphs(args.out))
            with open(args.out / "results.pickle", "wb") as f:
                pickle.dump(tuple(results), f)
        args.md.write_text(markdown(*results[:4], args.repeats, *results[4:]))
        return
    torch.set_num_threads(1)
    agree = {name: agreement(name, args.out) for name in MODELS}
    noise = {n: a["rows"]["onnxruntime"]["noise"] for n, a in agree.items()}
    gap = {name: gaps(name, noise[name]) for name in MODELS}
    write_rows = writes(args.out / "writes")
    times = timing(args.out, args.repeats)
    converted = convert_graphs(args.out)
    with open(args.out / "results.pickle", "wb") as f:  # to render again without measuring
        pickle.dump((agree, gap, write_rows, times, converted), f)
    args.md.write_text(markdown(agree, gap, write_rows, times, args.repeats, converted))
    print(args.md.read_text())


if __name__ == "__main__":
    main()
