"""The names a PyTorch class's ``forward`` gives its values, for the generated code's locals.

torchvision's ``Bottleneck.forward`` writes ``identity = x``, ``out = self.conv1(x)``, ...,
``out += identity``: the generated ``construct`` names the same values ``identity`` and ``out``
where it can tell which statement computes them (``torch2ms.codegen.bodies``). Two facts per class,
read from the source with ``ast`` (never run):

- ``children``: child attribute -> the name its call's result is assigned to (``conv1`` -> ``out``),
  for a child whose every call is assigned to that one name;
- ``ops``: the ``forward``'s other assignments in source order, each as the ONNX op type its
  expression exports to and the name (``["Add", "out"]`` for ``out += identity``);
- ``inputs``: child attribute -> the one ``forward`` argument its call takes positionally, while the
  argument still holds what the caller passed (``Qwen2DecoderLayer``: ``input_layernorm`` ->
  ``hidden_states``), which names the generated ``construct``'s argument that child reads
  (``torch2ms.codegen.arguments``).

A class without Python source (a builtin, a C++ or a scripted module) has no facts: its code keeps
the names of its ops and children.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import textwrap

# an expression's ONNX op type: binary operators, and calls by their function or method name
BINARY = {ast.Add: "Add", ast.Sub: "Sub", ast.Mult: "Mul", ast.Div: "Div", ast.MatMult: "MatMul", ast.Pow: "Pow"}
CALLS = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "matmul": "MatMul",
    "bmm": "MatMul",
    "cat": "Concat",
    "concat": "Concat",
    "relu": "Relu",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "softmax": "Softmax",
    "flatten": "Flatten",
    "view": "Reshape",
    "reshape": "Reshape",
    "permute": "Transpose",
    "transpose": "Transpose",
    "interpolate": "Resize",
    "mean": "ReduceMean",
}
# names a generated local must not take: the generated module's imports and ``self``
NOT_LOCALS = {"self", "ms", "nn", "ops", "np", "os", "batch"}


def forward_roles(cls: type) -> dict | None:
    """``{"children": {...}, "ops": [...]}`` for ``cls.forward`` and the methods of ``cls`` it calls
    (torchvision's ``ResNet.forward`` is ``return self._forward_impl(x)``); None without readable
    source."""
    fn = _method(cls, "forward")
    if fn is None:
        return None
    body = fn.body
    calls: dict[str, set[str]] = {}
    ops: list[list[str]] = []
    for name, value in _assignments(_inline_methods(cls, body, {"forward"})):
        attr = _child(value)
        if attr is not None:
            calls.setdefault(attr, set()).add(name)
        elif (op := _op(value)) is not None:
            ops.append([op, name])
    children = {a: next(iter(names)) for a, names in calls.items() if len(names) == 1}
    inputs = _inputs(fn)
    facts = {"children": children, "ops": ops, "inputs": inputs}
    return {k: v for k, v in facts.items() if v} or None


def _inputs(fn: ast.FunctionDef) -> dict[str, str]:
    """Child attribute -> the one argument of ``fn`` its first call passes positionally while that
    argument still holds what the caller passed (statements in source order, a statement's value
    before its targets): ``self.rotary_emb(hidden_states, position_ids)``, ``hidden_states`` a local
    by then, gives ``position_ids``."""
    params = {a.arg for a in fn.args.args[1:] + fn.args.kwonlyargs}
    out: dict[str, str] = {}
    for st in fn.body:
        for node in ast.walk(st):
            attr = _child(node)
            if attr and attr not in out:
                given = [a.id for a in node.args if isinstance(a, ast.Name) and a.id in params]
                if len(given) == 1:
                    out[attr] = given[0]
        for node in ast.walk(st):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                params.discard(node.id)
    return out


def _method(cls: type, name: str) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, name))))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0] if tree.body else None
    return fn if isinstance(fn, ast.FunctionDef) else None


def _method_body(cls: type, name: str) -> list[ast.stmt] | None:
    fn = _method(cls, name)
    return fn.body if fn is not None else None


def _inline_methods(cls: type, body: list[ast.stmt], seen: set[str]) -> list[ast.stmt]:
    """``body`` with each statement that calls a method of ``cls`` (``self.m(...)``, ``m`` a
    function of the class, not a child module) followed by that method's own statements."""
    out = []
    for st in body:
        out.append(st)
        for node in ast.walk(st):
            attr = _child(node)
            if attr and attr not in seen and inspect.isfunction(getattr(cls, attr, None)):
                seen.add(attr)
                inner = _method_body(cls, attr)
                out += _inline_methods(cls, inner, seen) if inner else []
    return out


def _assignments(body: list[ast.stmt]):
    """(name, value) of each ``name = value`` and ``name op= value`` in source order, into the
    bodies of ``if``/``for``/``with``/``try``."""
    for st in body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            name, value = st.targets[0].id, st.value
        elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
            name, value = st.target.id, ast.BinOp(st.target, st.op, st.value)
        else:
            for field in ("body", "orelse", "finalbody"):
                yield from _assignments(getattr(st, field, None) or [])
            for handler in getattr(st, "handlers", None) or []:
                yield from _assignments(handler.body)
            continue
        if name.isidentifier() and not keyword.iskeyword(name) and name not in NOT_LOCALS:
            yield name, value


def _child(value: ast.expr) -> str | None:
    """``attr`` when ``value`` is ``self.attr(...)``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        owner = value.func.value
        if isinstance(owner, ast.Name) and owner.id == "self":
            return value.func.attr
    return None


def _op(value: ast.expr) -> str | None:
    if isinstance(value, ast.BinOp):
        return BINARY.get(type(value.op))
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        return CALLS.get(name)
    return None


def module_roles(model) -> dict[str, dict]:
    """PyTorch class name -> its ``forward_roles``, for every class in ``model``'s tree that has them
    (two classes of one name: the first's)."""
    out: dict[str, dict] = {}
    for m in model.modules():
        name = type(m).__name__
        if name not in out and (roles := forward_roles(type(m))) is not None:
            out[name] = roles
    return out
