"""Converter registry: ONNX op type -> function that emits MindSpore code for one node.

A converter is registered with ``@converter("Conv", since=11)``. Lookup takes the newest
registration whose ``since`` is not above the model's opset, so an op unchanged in a newer
opset keeps working. ONNX attributes arrive as keyword arguments with the spec's defaults:
an attribute the converter does not know fails loudly (``TypeError``), and a value it cannot
handle raises ``Unsupported(reason)``. Converters only build code strings and numpy weights
through the ``Emitter`` they are given; they never import MindSpore, so ``analyse()`` can run
every converter over a whole model before anything is written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from torch2ms.graph.ir import Graph, Node


class Unsupported(Exception):
    """A node this converter cannot express; the message says which attribute/value."""


@dataclass(frozen=True)
class Registration:
    op_type: str
    since: int
    fn: Callable
    domain: str = ""

    @property
    def signature(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else self.op_type


_REGISTRY: dict[tuple[str, str], list[Registration]] = {}


def converter(*op_types: str, since: int = 1, domain: str = ""):
    def deco(fn: Callable) -> Callable:
        for op in op_types:
            regs = _REGISTRY.setdefault((domain, op), [])
            regs.append(Registration(op, since, fn, domain))
            regs.sort(key=lambda r: r.since)
        return fn

    return deco


def lookup(op_type: str, opset: int, domain: str = "") -> Registration | None:
    _load_all()
    domain = "" if domain == "ai.onnx" else domain
    best = None
    for reg in _REGISTRY.get((domain, op_type), []):
        if reg.since <= opset:
            best = reg
    return best


def registrations() -> list[Registration]:
    _load_all()
    return [r for regs in _REGISTRY.values() for r in regs]


def call_converter(reg: Registration, emitter, node: Node):
    """Call ``reg.fn(emitter, **attrs)``; unknown attributes become ``Unsupported``."""
    params = inspect.signature(reg.fn).parameters
    unknown = [a for a in node.attrs if a not in params]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise Unsupported(f"attribute {', '.join(repr(a) for a in unknown)} not supported")
    return reg.fn(emitter, **node.attrs)


@dataclass(frozen=True)
class Problem:
    op_type: str
    node: str
    reason: str


def format_problems(problems: list[Problem], source: str, opset: int) -> str:
    groups: dict[tuple[str, str], list[Problem]] = {}
    for p in problems:
        groups.setdefault((p.op_type, p.reason), []).append(p)
    op_types = {p.op_type for p in problems}
    lines = [f"{len(op_types)} op type{'s' if len(op_types) != 1 else ''} in {source} (opset {opset}) cannot be converted:"]
    w_op = max(len(k[0]) for k in groups)
    w_reason = max(len(k[1]) for k in groups)
    for (op, reason), ps in sorted(groups.items()):
        lines.append(f"  {op:<{w_op}}  x{len(ps):<3} {reason:<{w_reason}}  first node: {ps[0].node}")
    return "\n".join(lines)


_LOADED = False


def _load_all() -> None:
    """Import every converter family module so that its registrations exist."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import importlib
    import pkgutil

    import torch2ms.converters as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod not in ("registry", "emitter"):
            importlib.import_module(f"torch2ms.converters.{mod}")


def analyse(graph: Graph, make_emitter: Callable[[Node], object]) -> list[Problem]:
    """Try every node; return every problem (no converter, bad attribute, bad value)."""
    problems = []
    for node in graph.nodes:
        reg = lookup(node.op_type, graph.opset, node.domain)
        if reg is None:
            known = [r.since for r in _REGISTRY.get((node.domain, node.op_type), [])]
            reason = f"needs opset >= {min(known)}" if known else "no converter"
            problems.append(Problem(node.op_type, node.name, reason))
            continue
        try:
            call_converter(reg, make_emitter(node), node)
        except Unsupported as err:
            problems.append(Problem(node.op_type, node.name, str(err)))
    return problems
