"""The probe: network.py's construct made to return (or hand to a hook) every variable
tensor_map.json names, compiled under the file's own path."""

from __future__ import annotations

import ast
import hashlib
import sys
import types
from pathlib import Path

import numpy as np

from torch2ms.codegen.locals import assignments
from torch2ms.divergence.report import REPLAY_HOOK
from torch2ms.errors import Torch2msError


def _construct(source: str | ast.Module) -> ast.FunctionDef:
    tree = ast.parse(source) if isinstance(source, str) else source
    # the network's class is the file's last (the modules layout defines its module classes first)
    construct = next(
        (
            f
            for c in reversed(tree.body)
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, ast.FunctionDef) and f.name == "construct"
        ),
        None,
    )
    if construct is None or not isinstance(construct.body[-1], ast.Return):
        raise Torch2msError(
            "network.py: no `construct` method ending in `return` to probe",
            hint="the file was edited; re-generate it with `torch2ms convert --from rebuild`",
        )
    return construct


def statement_lines(source: str) -> dict[str, int]:
    """Variable -> line of the ``construct`` statement assigning it (each is assigned once)."""
    lines = {}
    for st in _construct(source).body:
        if isinstance(st, ast.Assign):
            for target in st.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        lines.setdefault(name.id, st.lineno)
    return lines


def probe_source(source: str, variables: list[str]) -> str:
    """``source`` with ``construct`` returning ``variables`` (a tuple) instead of the outputs.

    Only the lines of the final ``return`` change (the first becomes the new return, the rest
    blank), so every other statement keeps its line number.
    """
    ret = _construct(source).body[-1]
    lines = source.splitlines()
    indent = lines[ret.lineno - 1][: ret.col_offset]
    lines[ret.lineno - 1 : ret.end_lineno] = [f"{indent}return ({', '.join(variables)},)"] + [""] * (
        ret.end_lineno - ret.lineno
    )
    return "\n".join(lines) + "\n"


def replay_tree(source: str, variables: set[str]) -> ast.Module:
    """``source`` (already a probe) with ``v = torch2ms_replay('v', v)`` after each statement that
    assigns a variable in ``variables`` (and at the top for such an argument): the hook takes the
    computed value (``_Stream``) and hands the next statements its own or onnxruntime's. The
    inserted statements carry their statement's line number."""
    tree = ast.parse(source)
    _hook_assignments(_construct(tree), lambda name: name in variables)
    return ast.fix_missing_locations(tree)


def _hook_assignments(fn: ast.FunctionDef, wanted, owner: str = "", numbered: bool = False) -> None:
    """Insert ``v = torch2ms_replay(<owner>'v', v)`` into ``fn`` for each ``wanted`` name: at the
    top for an argument (a statement left out as ``y = x`` is its argument x), and after each
    assignment to it. ``numbered``: the key says which assignment of the name it follows
    (``'out#2'``, as ``assignments`` counts), for code that rebinds a name down a chain. The
    inserted statements carry their statement's line number."""
    count: dict[str, int] = {}

    def hook(name: str, at: ast.stmt) -> ast.stmt:
        k = count[name] = count.get(name, -1) + 1
        key = f"{name}#{k}" if numbered else name
        return ast.copy_location(ast.parse(f"{name} = {REPLAY_HOOK}({owner}{key!r}, {name})").body[0], at)

    after: dict[int, list[ast.stmt]] = {}
    head = []
    for name, st in assignments(fn):
        if not wanted(name):
            count[name] = count.get(name, -1) + 1
        elif st is None:
            head.append(hook(name, fn.body[0]))
        else:
            after.setdefault(id(st), []).append(hook(name, st))
    fn.body = head + [x for st in fn.body for x in (st, *after.get(id(st), []))]


def load_probe(stage_dir: Path, variables: list[str], tag: str, hook):
    """The stage's network with the probe's ``construct``, weights from its ``network.ckpt``, each
    of ``variables`` going through ``hook`` (``replay_tree``)."""
    source = probe_source((stage_dir / "network.py").read_text(), variables)
    return _build_instrumented(stage_dir, source, replay_tree(source, set(variables)), tag, hook)


def _build_instrumented(stage_dir: Path, source: str, tree: ast.Module, tag: str, hook):
    """The stage's network built from ``tree`` (its ``source``, instrumented) with ``hook`` as the
    replay hook, in a module of its own that leaves ``sys.modules`` again once built."""
    path = stage_dir / "network.py"
    name = f"torch2ms_probe_{tag}_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        module.__dict__[REPLAY_HOOK] = hook
        exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - our own generated code
        return module.build(str(stage_dir / "network.ckpt"))
    finally:
        sys.modules.pop(name, None)


def entry_key(entry: dict) -> str:
    """A tensor_map entry's variable: ``module:var#k`` in the modules layout (a class's locals are
    per instance; ``k``: which assignment of the name, 0 for a map written before names were
    rebound), the variable itself in the flat one."""
    if "module" not in entry:
        return entry["var"]
    return f"{entry['module']}:{entry['var']}#{entry.get('assign', 0)}"


class _CellHook:
    """The modules layout's probe hook, called as ``hook(self, 'var', var)`` after every statement
    of every class: keys the value by the calling cell's path (``backbone.layer1.0:conv1``) and
    hands it to ``take``, whose return value the next statements see."""

    def __init__(self, take):
        self.take = take
        self.paths: dict[int, str] = {}

    def __call__(self, cell, var: str, value):
        return self.take(f"{self.paths.get(id(cell), '?')}:{var}", value)


def instrument_classes(source: str) -> ast.Module:
    """``source`` with ``v = torch2ms_replay(self, 'v', v)`` after each assignment of every class's
    ``construct``; the inserted statements carry their statement's line number."""
    tree = ast.parse(source)
    for c in tree.body:
        if not isinstance(c, ast.ClassDef):
            continue
        for f in c.body:
            if isinstance(f, ast.FunctionDef) and f.name == "construct":
                _hook_assignments(f, lambda name: name != "_", owner="self, ", numbered=True)
    return ast.fix_missing_locations(tree)


def load_class_probe(stage_dir: Path, tag: str, hook: _CellHook):
    """The stage's modules-layout network with every class instrumented (``instrument_classes``)."""
    source = (stage_dir / "network.py").read_text()
    net = _build_instrumented(stage_dir, source, instrument_classes(source), tag, hook)
    hook.paths = {id(c): n for n, c in net.cells_and_names()}
    return net


class _Stream:
    """The probe's hook for one pass over a sample: each compared statement's value is added to its
    tensor's metrics as it is computed and then let go, so a sample holds onnxruntime's values and
    the network's live tensors only (keeping every computed value for the end multiplied a large
    model's replay peak). A statement that runs more than once (a module called twice) takes its
    entries in order. With ``replay``, it hands the next statements onnxruntime's value of the
    same tensor, in the computed value's dtype (the computed one where the shapes differ)."""

    def __init__(self, ms, compared: list[dict], acc: dict, replay: bool):
        self.ms, self.acc, self.replay = ms, acc, replay
        self.tensors: dict[str, list[str]] = {}
        self.keep: set[str] = set()  # tensors whose computed value is kept (``divergence.arbitration``)
        self.kept: dict[str, np.ndarray] = {}
        for e in compared:
            self.tensors.setdefault(entry_key(e), []).append(e["tensor"])
        self.start({})

    def start(self, reference: dict[str, np.ndarray]) -> None:
        self.reference, self.calls, self.last = reference, {}, {}

    def __call__(self, key: str, value):
        tensors = self.tensors.get(key)
        is_tensor = hasattr(value, "asnumpy")
        if tensors is None or (self.replay and not is_tensor):
            return value
        n = self.calls[key] = self.calls.get(key, 0) + 1
        tensor = tensors[min(n, len(tensors)) - 1]
        got = value.asnumpy() if is_tensor else np.asarray(value)
        ref = self.reference[tensor]
        if n <= len(tensors):
            self.acc[tensor].add(got, ref)
            if tensor in self.keep:
                self.kept[tensor] = got
        if len(tensors) > 1 and not self.replay:
            self.last[key] = got
        if self.replay and ref.shape == got.shape:
            return self.ms.Tensor(np.ascontiguousarray(ref, dtype=got.dtype))
        return value

    def finish(self) -> None:
        """The pass is over. The run pass: entries whose statement ran fewer times than there are
        entries take its last value; a statement that never ran leaves its tensor a problem
        (nothing to compare). Then the sample's values are let go."""
        if not self.replay:
            for key, tensors in self.tensors.items():
                n = self.calls.get(key, 0)
                for tensor in tensors[n:]:
                    self.acc[tensor].add(self.last[key] if n else np.asarray(None), self.reference[tensor])
        self.start({})
