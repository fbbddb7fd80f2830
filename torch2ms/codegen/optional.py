"""Optional children: instances of one PyTorch class that differ only by one child cell
(ResNet's ``Bottleneck`` with and without ``downsample``) are one class, as mindcv writes them.
The child is a constructor argument (``downsample=None``) built at the call site, so attribute
paths and checkpoint keys stay PyTorch's, and ``construct`` calls it when it is there::

    downsample = x
    if self.downsample is not None:
        downsample = self.downsample(x)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch2ms.codegen.bodies import Body, signature


@dataclass
class Without:
    """An instance's code with its child ``attr`` taken out."""

    attr: str
    init_line: int  # the index of ``self.<attr> = <ctor>`` in ``__init__``
    call_line: int  # the index of ``<out> = self.<attr>(<x>)`` in ``construct``
    out: str
    x: str
    signature: list[str]


def children(body: Body) -> list[str]:
    """The attributes ``__init__`` creates a cell for (``self.<attr> = ...``), in order."""
    return [m[1] for line in body.init if isinstance(line[0], str) and (m := re.fullmatch(r"self\.(\w+) = ", line[0]))]


def without(body: Body, attr: str) -> Without | None:
    """``body`` without child ``attr``: its output read as its input from the call on; None when
    the child is not called once on one value."""
    init = [k for k, line in enumerate(body.init) if line[0] == f"self.{attr} = "]
    calls = [
        (k, m)
        for k, line in enumerate(body.construct)
        if len(line) == 1
        and isinstance(line[0], str)
        and (m := re.fullmatch(rf"(\w+) = self\.{attr}\((\w+)\)", line[0]))
    ]
    mentions = [line for line in body.construct if any(isinstance(p, str) and f"self.{attr}" in p for p in line)]
    if len(init) != 1 or len(calls) != 1 or len(mentions) != 1:
        return None
    (k, m), word = calls[0], re.compile(rf"(?<![.\w]){re.escape(calls[0][1][1])}\b")
    assigns = re.compile(rf"(\w+, )*{m[1]}(, \w+)* = ")  # its output's name bound again later (rebound):
    if any(isinstance(line[0], str) and assigns.match(line[0]) for line in body.construct[k + 1 :]):
        return None  # reading the child's input there would be wrong
    construct = [
        [word.sub(m[2], p) if isinstance(p, str) else p for p in line] if j > k else line
        for j, line in enumerate(body.construct)
        if j != k
    ]
    inits = [line for j, line in enumerate(body.init) if j != init[0]]
    return Without(attr, init[0], k, m[1], m[2], signature(inits + construct))


def match(rep, s, optional: str | None) -> tuple[str, bool] | None:
    """(the optional child, whether ``s`` has it) when ``s`` is ``rep``'s code with or without one
    child; ``optional``: the child already known optional for ``rep``'s class (some instance lacks
    it). Instances that all have the child, built differently, stay classes of their own."""
    for attr in [optional] if optional else children(rep.body):
        w = without(rep.body, attr)
        if w is not None and w.signature == s.body.signature:
            return attr, False
        ws = without(s.body, attr)  # with the child, built otherwise: only once some instance lacks it
        if optional and ws is not None and w is not None and ws.signature == w.signature:
            return attr, True
    if optional is None:
        for attr in children(s.body):
            ws = without(s.body, attr)
            if ws is not None and ws.signature == rep.body.signature:
                return attr, True
    return None


def ctor(s, attr: str) -> list:
    """The pieces creating child ``attr`` of ``s``."""
    return next(line[1:] for line in s.body.init if line[0] == f"self.{attr} = ")
