"""Names for the arguments of the generated classes' ``construct``.

A class's ``construct`` knows its inputs only as values that come from outside (``x``, ``x1``, ...):
the ONNX graph does not say which is which, and ``forward``'s signature does not map onto the
graph's inputs (transformers' ``Qwen2Attention.forward`` takes ``position_embeddings`` as one tuple
and the cache as an object, where the graph passes cos, sin and two tensors). Two sources do name
them, after a first rendering has named every ``construct``'s locals:

- the class's own ``forward``: an argument a child reads that ``forward`` calls with one of its
  own arguments (``self.input_layernorm(hidden_states)``; ``torch2ms.export.roles``'s ``inputs``)
  takes that argument's name;
- else its callers, top down from the network, whose arguments are the graph's input names: an
  argument the caller passes on from its own arguments takes that argument's name, one the caller
  computed the caller's local name where that name says what the value is: a ``forward``'s name, a
  child's result under the name the child returns it (``cos, sin = self.rotary_emb(x1)``) or an
  unstacked part (``keys_0``), not an op's (``unsqueeze_2``) nor the child's own (``blocks_3``).
  Every call of every instance of the class must agree, up to a trailing index (``keys_0`` in
  layer 0, ``keys_1`` in layer 1: the layer's ``keys``).

An argument no source names, named ``x`` or ``x_3`` (the encoder's features, each an ``x`` in
its ``forward``), or that would share a name with another, keeps ``x<k>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torch2ms.codegen.scopes import Scope

# where a call's input comes from: ("arg", k) the caller's k-th argument, ("local", name), or None
Source = tuple[str, int | str] | None


def argument_names(
    sites: dict[Scope, tuple[Scope, list[Source]]],
    args_of: dict[Scope, list[str]],
    readers: dict[Scope, dict[int, set[str]]],
    inputs_of: Callable[[Scope], dict[str, str]],
) -> dict[Scope, list[str | None]]:
    """A name per argument of each class instance's ``construct`` (None: keep ``x<k>``).
    ``sites``: the instances a ``construct`` calls -> the calling scope and the source of each
    input; ``args_of``: every rendered scope -> its arguments as first rendered; ``readers``: scope
    -> argument index -> the children that read it alone of the arguments; ``inputs_of``: scope ->
    its class's ``roles["inputs"]``."""
    by_group: dict[int, list[str | None]] = {}

    def names_of(s: Scope) -> list[str | None]:
        if s.parent is None:
            return list(args_of[s])
        g = s.group
        if id(g) not in by_group:
            n = len(args_of[s])
            by_group[id(g)] = [None] * n  # a call cannot reach its own class
            own = _own(g.instances[0], n)
            callers = _agree([from_caller(t) for t in g.instances], n)
            by_group[id(g)] = _distinct([_plain(o) or _plain(c) for o, c in zip(own, callers)])
        return by_group[id(g)]

    def from_caller(t: Scope) -> list[str | None]:
        if t not in sites:  # run by a SequentialCell, not called by a construct
            return [None] * len(args_of[t])
        caller, sources = sites[t]
        up = names_of(caller) if any(src and src[0] == "arg" for src in sources) else []
        return [None if src is None else up[src[1]] if src[0] == "arg" else src[1] for src in sources]

    def _own(s: Scope, n: int) -> list[str | None]:
        inputs = inputs_of(s)
        out = []
        for k in range(n):
            given = {inputs[a] for a in readers.get(s, {}).get(k, ()) if a in inputs}
            out.append(given.pop() if len(given) == 1 else None)
        return out

    return {s: names_of(s) for s in args_of if s.parent is not None and s.group is not None}


def _agree(calls: list[list[str | None]], n: int) -> list[str | None]:
    """One name per argument that every call gives, up to a trailing index, without the index
    where no two arguments then share one (``hidden_states_1`` -> ``hidden_states``)."""
    names: list[str | None] = []
    for k in range(n):
        given = [c[k] if k < len(c) else None for c in calls]
        if not given or None in given:
            names.append(None)
            continue
        stems = {re.sub(r"_\d+$", "", g) for g in given}
        names.append(stems.pop() if len(stems) == 1 else None)
    out = []
    for k, stem in enumerate(names):
        if stem is None or names.count(stem) == 1:
            out.append(stem)
        else:  # two arguments of one stem (keys_0, keys_1): their full names, where every call agrees
            same = {c[k] for c in calls}
            out.append(same.pop() if len(same) == 1 else None)
    return out


def _plain(name: str | None) -> str | None:
    """``name``, unless it is one the argument would take anyway (``x``, ``x1``, ``x_2``)."""
    return None if name is None or re.fullmatch(r"x(_?\d+)?", name) else name


def _distinct(names: list[str | None]) -> list[str | None]:
    """A name two arguments would share is given to neither."""
    return [None if n is not None and names.count(n) > 1 else n for n in names]
