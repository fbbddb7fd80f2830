"""``torch2ms zoo --profile``: each passed model's op-level profile, written by its worker into
``<run>/profile/`` as ``torch2ms profile`` writes it (profile.json, profile.md, modules.png), so the
zoo row's fusion columns (kernels, small-op share) and summary.html's per-module pictures come from it.

The variants are PyTorch eager and the compile stage's two, the folded network in GRAPH_MODE
without and with graph-kernel fusion (the latter only when the recipe's ``compile.graph_kernel`` is
not ``off``): the small-op share before and after fusion, at the cost of one more graph-kernel
build. A profile that fails is logged and leaves the model's verdict alone: the conversion passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

VARIANTS = ("torch", "ms_graph_folded", "ms_graph_folded_gk")
# which profiled variant is the network a compile stage's choice (compile.json ``chosen``) runs
CHOSEN_VARIANT = {"graph": "ms_graph_folded", "graph_kernel": "ms_graph_folded_gk"}


def variants(recipe) -> tuple[str, ...]:
    """The variants profiled for ``recipe``: no graph-kernel build where the recipe switched it off."""
    return VARIANTS if recipe.compile.graph_kernel != "off" else VARIANTS[:2]


def profile_model(recipe, job: dict, run_root: Path, log: Callable[[str], None]) -> Path | None:
    """Profile a converted model (``job["profile_calls"]`` calls per variant, ``job["threads"]``
    threads) into ``run_root/profile``; returns the picture's path, None when the profile failed."""
    from torch2ms.profile import ProfileOptions, run_profile, write_all

    options = ProfileOptions(
        calls=job["profile_calls"],
        threads=job.get("threads") or 1,
        depth=1,
        variants=variants(recipe),
        out_root=run_root.parent,
        timeout_s=job["timeout"],
    )
    try:
        data, root = run_profile(recipe, options, log=log)
    except Exception as err:  # noqa: BLE001 - the conversion passed; its profile is extra, never its crash
        log(f"{recipe.name}: profile failed: {type(err).__name__}: {err}")
        return None
    failed = {k: v["error"] for k, v in data["variants"].items() if "error" in v}
    for key, err in failed.items():
        log(f"{recipe.name}: profile of {key} failed: {' '.join(str(err).split())[:200]}")
    return write_all(data, root)["png"]
