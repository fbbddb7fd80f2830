"""One function call in a fresh process: what it imports and allocates leaves with the process.

MindSpore keeps what a network allocated (its memory pool, compiled graphs, the allocator's arenas)
after the cell is dropped, so two memory-heavy steps in one process peak at their sum. A step that
needs its own peak runs here: ``call_fresh(fn, *args)`` runs ``fn(*args)`` in a spawned child (no
inherited MindSpore state) that takes over this process's CPU choice (``runtime.cpu``) and dies with
it, and returns its picklable result. An exception in the child is raised here; a child that ends
without a result (killed, out of memory) is a ``StageFailed`` naming the step.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from torch2ms.errors import StageFailed


def call_fresh(what: str, fn: Callable, *args) -> Any:
    """``fn(*args)`` in a fresh process (module docstring); ``what`` names the step in an error.
    ``fn`` must be a module-level function and ``args`` picklable."""
    from torch2ms.runtime.cpu import cpu_choice

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        try:
            return pool.submit(_child, os.getpid(), cpu_choice(), fn, args).result()
        except BrokenProcessPool as err:
            raise StageFailed(
                f"{what}: its process ended before it gave a result",
                hint="a process killed by SIGKILL was most often out of memory (see `dmesg`)",
            ) from err


def _child(parent: int, choice, fn: Callable, args: tuple) -> Any:
    from torch2ms.runtime import cpu
    from torch2ms.runtime.lifetime import die_with_parent

    die_with_parent(parent)
    if choice is not None:
        cpu.adopt(choice)  # the parent's; its environment (ONEDNN_MAX_CPU_ISA) came with ours
    return fn(*args)
