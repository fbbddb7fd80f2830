"""``torch2ms profile``: kernels, op types and module paths of PyTorch and each MindSpore variant."""

from __future__ import annotations

from pathlib import Path

import typer

from torch2ms.cli_app import CpuIsa, app, console, out_console, setup_cpu
from torch2ms.errors import Torch2msError


@app.command()
def profile(
    recipe: Path = typer.Option(..., "--recipe", "-r", help="recipe YAML"),
    calls: int = typer.Option(10, "--calls", min=1, help="profiled calls per variant (after one unprofiled call)"),
    threads: int = typer.Option(2, "--threads", min=1, help="threads for every framework"),
    depth: int = typer.Option(2, "--depth", min=1, help="module path components per row (backbone.layer1: 2)"),
    small_ms: float = typer.Option(
        0.1, "--small-ms", min=0.0, help="a kernel under this mean time (ms) counts to the small-op share"
    ),
    variants: str | None = typer.Option(
        None,
        "--variants",
        help="comma-separated: torch and any MindSpore key of `torch2ms bench` (default: torch, ms_pynative_plain, "
        "ms_graph_folded, ms_graph_folded_gk)",
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="output root (default: the recipe's `output`, runs/)"),
    cpu_isa: str | None = CpuIsa,
) -> None:
    """Profile PyTorch and MindSpore kernel by kernel; write profile/ into the run folder."""
    from torch2ms.bench.variants import BY_KEY
    from torch2ms.profile import ProfileOptions, run_profile, write_all
    from torch2ms.profile.core import DEFAULT_VARIANTS
    from torch2ms.recipe import load_recipe

    r = load_recipe(recipe)
    setup_cpu(cpu_isa)
    keys = DEFAULT_VARIANTS
    if variants:
        keys = tuple(k.strip() for k in variants.split(",") if k.strip())
        allowed = ["torch", *(k for k, v in BY_KEY.items() if v.kind in ("mindspore", "mindir"))]
        unknown = [k for k in keys if k not in allowed]
        if unknown:
            raise Torch2msError(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    options = ProfileOptions(calls=calls, threads=threads, depth=depth, small_ms=small_ms, variants=keys, out_root=out)
    data, root = run_profile(r, options, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    paths = write_all(data, root)
    out_console.print(paths["md"].read_text(), markup=False, highlight=False)
    console.print(f"profile: {paths['md']}  {paths['png']}  ({data['seconds']:.0f} s)")
