"""``torch2ms bench``: time every variant of a converted model, interleaved, checked first."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import Torch2msError


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise Torch2msError(f"--batch {text!r}: expected positive integers separated by commas, e.g. 1,4")
    return values


@app.command()
def bench(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML"),
    runs: int = typer.Option(30, "--runs", min=1, help="timed rounds (each calls every variant once)"),
    warmup: int = typer.Option(5, "--warmup", min=0, help="untimed rounds first"),
    threads: int = typer.Option(2, "--threads", min=1, help="threads for every framework"),
    batch: str | None = typer.Option(
        None,
        "--batch",
        help="batch sizes, e.g. 1,4 (other than the recipe's: re-exported at that batch); default: the recipe's "
        "inputs[].batch, else 1",
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="output root (default: the recipe's `output`, runs/)"),
    variants: str | None = typer.Option(
        None, "--variants", help="comma-separated subset of variant keys (default: all)"
    ),
    no_memory: bool = typer.Option(False, "--no-memory", help="skip the one-subprocess-per-variant peak-RSS runs"),
    no_fusion: bool = typer.Option(False, "--no-fusion", help="skip the IR-dump fusion report"),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Benchmark PyTorch, onnxruntime and every MindSpore variant; write bench/ into the run folder."""
    from torch2ms.bench import BenchOptions, print_table, run_bench, write_all
    from torch2ms.bench.variants import BY_KEY, VARIANTS
    from torch2ms.recipe import load_recipe

    r = load_recipe(recipe)
    setup_cpu(cpu_isa)
    if r.task == "text_generation":  # prefill ms and decode tokens/s of the two graphs (generation.bench)
        _bench_generation(r, recipe, out, runs, warmup, not no_memory)
        return
    keys = tuple(v.key for v in VARIANTS)
    if variants:
        keys = tuple(k.strip() for k in variants.split(",") if k.strip())
        unknown = [k for k in keys if k not in BY_KEY]
        if unknown:
            raise Torch2msError(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(BY_KEY)}")
    options = BenchOptions(
        runs=runs,
        warmup=warmup,
        threads=threads,
        batches=_batches(batch) if batch is not None else (r.batch_sizes() or (1,)),
        out_root=out,
        variants=keys,
        memory=not no_memory,
        fusion=not no_fusion,
    )
    data, bench_dir = run_bench(r, options, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    paths = write_all(data, bench_dir, bench_dir.parent)
    print_table(data, out_console)
    console.print(f"bench: {paths['md']}  {paths['png']}  ({data['seconds']:.0f} s)")


def _bench_generation(r, recipe_path: Path, out: Path | None, runs: int, warmup: int, memory: bool) -> None:
    """``generation.bench`` on a converted generation recipe: bench.json and bench.md in its generation folder."""
    import json

    from torch2ms.generation.bench import RUNNERS, markdown, measure

    root = Path(out or r.output) / r.name
    result = measure(r, recipe_path, out, RUNNERS, runs, warmup)
    if not memory:
        for key in RUNNERS:
            result[key].pop("peak_rss_mb")
    folder = root / "generation"
    (folder / "bench.json").write_text(json.dumps(result, indent=2))
    text = markdown(r, result)
    (folder / "bench.md").write_text(text + "\n")
    out_console.print(text)
    console.print(f"bench: {folder / 'bench.md'}")
