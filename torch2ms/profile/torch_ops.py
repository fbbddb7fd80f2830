"""PyTorch's side of ``torch2ms profile``: eager ops under ``torch.profiler``, each with its module path.

Every submodule gets a forward pre-hook that opens a ``record_function`` range named after its
path in ``named_modules()`` and a forward hook that closes it, so each op's innermost enclosing
range names its module: the PyTorch module path the MindSpore scopes reproduce. (``with_modules``
records module hierarchy for TorchScript models only; ``with_stack`` gives source lines, not
paths.) A "kernel" is a top-level ATen op, one whose parent is not an ATen op: ``aten::conv2d``
counts once, not again for the ``aten::convolution`` it calls; its time is its CPU time including
those children.
"""

from __future__ import annotations

import time

RANGE = "module::"


def _hooks(model):
    """Attach the range hooks; returns the handles (removed after profiling)."""
    import torch

    handles, open_ranges = [], []
    for name, module in model.named_modules():
        if not name:
            continue

        def pre(_m, _a, name=name):
            rf = torch.profiler.record_function(RANGE + name)
            rf.__enter__()
            open_ranges.append(rf)

        def post(_m, _a, _o):
            open_ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def _module_of(event) -> str:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(RANGE):
            return parent.name[len(RANGE) :]
        parent = parent.cpu_parent
    return ""


def profile_torch(model, args: list, calls: int, threads: int) -> dict:
    """``calls`` eager calls of ``model`` under ``torch.profiler``: per kernel (type, module) its
    kernels per call and ms per call, and the wall time per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    with torch.inference_mode():
        model(*args)  # warm-up outside the profile
        handles = _hooks(model)
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                for _ in range(calls):
                    model(*args)
                wall = (time.perf_counter() - t0) * 1e3 / calls
        finally:
            for h in handles:
                h.remove()
    groups: dict[tuple[str, str], dict] = {}
    for e in prof.events():
        if not e.name.startswith("aten::") or (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")):
            continue
        key = (e.name, _module_of(e))
        g = groups.setdefault(key, {"name": f"{key[1]}/{e.name}", "type": e.name, "module": key[1], "n": 0, "us": 0.0})
        g["n"] += 1
        g["us"] += e.cpu_time_total
    kernels = [
        {
            "name": g["name"],
            "type": g["type"],
            "module": g["module"],
            "per_call": g["n"] / calls,
            "ms_per_call": g["us"] / 1e3 / calls,
        }
        for g in groups.values()
    ]
    names = [name for name, _ in model.named_modules() if name]
    return {"wall_ms_per_call": wall, "calls": calls, "kernels": kernels, "module_names": names}
