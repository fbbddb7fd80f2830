"""Converter registry: ONNX op type -> the function that emits MindSpore code for one node.

Converters register themselves with ``torch2ms.converters.api.converter``. Lookup takes the
newest registration whose ``since`` is not above the model's opset, so an op unchanged in a
newer opset keeps working. ONNX attributes arrive as keyword arguments with the spec's defaults:
an attribute the converter does not know is refused by name, and a value it cannot handle raises
``Unsupported(reason)``. ``analyse()`` runs every converter over a whole graph without writing
anything, so all problems are reported at once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch2ms.converters.api import REFUSED, REGISTRY, Emitter, Registration, Unsupported
from torch2ms.errors import PluginError
from torch2ms.graph.ir import Graph, Node

DEFAULT_DOMAINS = ("", "ai.onnx")


def _domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


def lookup(op_type: str, opset: int, domain: str = "", builtin: bool = False) -> Registration | None:
    """The newest registration not above ``opset``; a plugin's that ``replaces`` the built-in one
    first (``builtin=True``: the built-in one, what a plugin's converter declines to)."""
    _load_all()
    best = first = None
    for reg in REGISTRY.get((_domain(domain), op_type), []):
        if reg.since <= opset:
            if reg.replaces and not builtin:
                first = reg
            elif not reg.replaces:
                best = reg
    return first or best


def registrations(plugins: bool = False) -> list[Registration]:
    """torch2ms's own registrations (what its operator table and tests cover); with ``plugins``, the
    converter plugins' too."""
    _load_all()
    return [r for regs in REGISTRY.values() for r in regs if plugins or r.plugin is None]


def refusals() -> dict[str, str]:
    """Default-domain op types refused on purpose, with the reason."""
    _load_all()
    return dict(sorted(REFUSED.items()))


def call_converter(reg: Registration, emitter: Emitter, node: Node):
    """Call ``reg.fn(emitter, **attrs)``; unknown attributes become ``Unsupported``. A plugin's
    converter that raises anything else is a ``PluginError`` naming the plugin and the op; one that
    ``replaces`` a built-in converter and returns None hands the node to it."""
    params = inspect.signature(reg.fn).parameters
    unknown = [a for a in node.attrs if a not in params]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise Unsupported(f"attribute {', '.join(repr(a) for a in unknown)} not supported")
    if reg.plugin is None:
        return reg.fn(emitter, **node.attrs)
    try:
        expr = reg.fn(emitter, **node.attrs)
    except (Unsupported, PluginError):
        raise
    except Exception as err:
        op = f"{reg.domain}.{reg.op_type}" if reg.domain else reg.op_type
        raise PluginError(
            f"converter plugin {reg.plugin!r}: its converter {reg.fn.__name__} for {op} (node {node.name!r}) "
            f"raised {type(err).__name__}: {err}",
            hint="a converter raises Unsupported(reason) for a node it cannot express",
        ) from err
    if expr is None and reg.replaces:
        builtin = lookup(node.op_type, emitter.graph.opset, node.domain, builtin=True)
        if builtin is None:
            raise Unsupported(f"declined by converter plugin {reg.plugin!r}, and torch2ms has no converter")
        return call_converter(builtin, emitter, node)
    return expr


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
    plural = "s" if len(op_types) != 1 else ""
    lines = [f"{len(op_types)} op type{plural} in {source} (opset {opset}) cannot be converted:"]
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
        if mod not in ("registry", "api"):
            importlib.import_module(f"torch2ms.converters.{mod}")


def problem_of(graph: Graph, node: Node) -> str | None:
    """Why ``node`` cannot be converted (no converter, opset, attribute, value), or None."""
    reg = lookup(node.op_type, graph.opset, node.domain)
    if reg is None:
        known = [r.since for r in REGISTRY.get((_domain(node.domain), node.op_type), [])]
        if known:
            return f"needs opset >= {min(known)}"
        if _domain(node.domain) == "" and node.op_type in REFUSED:
            return f"refused: {REFUSED[node.op_type]}"
        if _domain(node.domain) not in ("", "torch2ms"):  # torch2ms: the nodes its own passes make
            return "no converter (a converter plugin can give one: recipe field converters, docs/custom_ops.md)"
        return "no converter"
    try:
        call_converter(reg, Emitter(graph, node), node)
    except Unsupported as err:
        return str(err)
    return None


def analyse(graph: Graph) -> list[Problem]:
    """Try every node; return every problem (no converter, bad attribute, bad value)."""
    problems = []
    for node in graph.nodes:
        reason = problem_of(graph, node)
        if reason:
            op = node.op_type if _domain(node.domain) == "" else f"{node.domain}.{node.op_type}"
            problems.append(Problem(op, node.name, reason))
    return problems
