"""The run's ONNX graph, loaded and shape-inferred once per run and size, its weights held once.

Every stage that generates code asks ``onnx_graph(ctx, path)`` and gets its own copy of the graph
the run context caches (``pipeline.context.RunContext.cache``): the nodes, values and attributes are
the copy's, the constants are shared and read-only (``freeze_constants``, ``shared_copy``), and a
graph at another batch size or sequence length shares every constant equal to the first one's. The
runner drops them (``RunContext.drop_graphs``) once no later stage reads ``model.onnx``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from torch2ms.errors import OnnxError
from torch2ms.graph.load import load_onnx
from torch2ms.pipeline.context import GRAPHS, RunContext
from torch2ms.pipeline.workspace import sha256_file


def onnx_graph(ctx: RunContext, path: Path, batch: dict[str, int] | None = None, seq: dict[str, int] | None = None):
    """A fresh copy of the loaded, shape-inferred ONNX graph (loaded once per run); ``batch``
    overrides dimension 0 of the inputs it names, ``seq`` dimension 1. A load that failed
    (``OnnxError``: the same file at the same sizes fails the same way) is not tried again: a
    later stage gets the same error at once. A ViT traced with its batch as a constant fails at
    batch 2 in the rebuild stage, and loading it again in fold would cost the memory and time
    of a second load."""
    batch, seq = batch or {}, seq or {}
    key = (GRAPHS, str(path), sha256_file(path), tuple(sorted(batch.items())), tuple(sorted(seq.items())))
    if key not in ctx.cache:
        shapes = {
            i.name: (batch.get(i.name, i.shape[0]), *((seq.get(i.name, i.shape[1]),) if len(i.shape) > 1 else ()))
            + tuple(i.shape[2:])
            if i.shape
            else ()  # a scalar
            for i in ctx.recipe.inputs
        }
        try:
            graph = load_onnx(path, shapes)
        except OnnxError as err:
            ctx.cache[key] = copy.copy(err)  # without its traceback, whose frames hold the model
            raise
        shared = [g for k, g in ctx.cache.items() if isinstance(k, tuple) and k[:3] == key[:3] and not _failed(g)]
        ctx.cache[key] = freeze_constants(graph, shared[0] if shared else None)
    if _failed(ctx.cache[key]):
        raise copy.copy(ctx.cache[key]) from None
    return shared_copy(ctx.cache[key])


def _failed(cached) -> bool:
    return isinstance(cached, BaseException)


def freeze_constants(graph, like=None):
    """``graph`` with its constants read-only, so that copies can share them (``shared_copy``): a
    pass that wrote into a weight in place would now raise instead of changing every copy. With
    ``like`` (the same ONNX loaded at another batch size), each constant equal to ``like``'s of the
    same name is replaced by that one: the weights are held once, not once per batch size."""
    for name, v in graph.values.items():
        if v.const is None:
            continue
        other = like.values.get(name) if like is not None else None
        if other is not None and other.const is not None and _same(other.const, v.const):
            v.const = other.const
        else:
            v.const.flags.writeable = False
    return graph


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def shared_copy(graph):
    """A deep copy of ``graph`` that shares its (read-only) constant arrays: nodes, values and
    attributes are the copy's own, the weights are not copied again."""
    memo = {id(v.const): v.const for v in graph.values.values() if v.const is not None and not v.const.flags.writeable}
    return copy.deepcopy(graph, memo)
