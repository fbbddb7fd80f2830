"""``construct``'s arguments named from the class's own ``forward`` and from its callers
(``torch2ms.codegen.arguments``), checked on the generated code and against PyTorch."""

from __future__ import annotations

import ast

from torch import nn

from codegen.test_module_layout import check, classes_of
from torch2ms.export.roles import forward_roles


class Fuse(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(8, 8, 1)

    def forward(self, hidden, skip):
        return self.proj(hidden) * skip


class Mix(nn.Module):
    """Two calls of Fuse with different first arguments (``feat``, ``mixed``) and the same second,
    a value only an op names (``tanh``), and the network's own input."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.first = Fuse()
        self.second = Fuse()
        self.scale = nn.Conv2d(3, 8, 1)

    def forward(self, x):
        feat = self.stem(x)
        gate = self.scale(x)
        mixed = self.first(feat, gate)
        return self.second(mixed, gate.tanh())


def test_an_argument_a_child_reads_takes_the_forward_name_and_a_passed_one_the_callers():
    assert forward_roles(Fuse)["inputs"] == {"proj": "hidden"}
    assert forward_roles(Mix)["inputs"] == {"stem": "x", "scale": "x"}
    net, _ = check_mix()
    construct = {c: _args(cls) for c, cls in classes_of(net.source).items()}
    # hidden: Fuse's own forward calls proj with it; the second argument is `gate` at one call and
    # an op's result at the other, so it keeps x1
    assert construct["Fuse"] == ["hidden", "x1"], construct


def test_an_argument_every_call_names_alike_takes_that_name():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.scale = nn.Conv2d(3, 8, 1)
            self.first = Fuse()
            self.second = Fuse()

        def forward(self, x):
            feat = self.stem(x)
            gate = self.scale(x)
            return self.first(feat, gate) + self.second(feat, gate)

    net, _ = check_model(Pair())
    assert _args(classes_of(net.source)["Fuse"]) == ["hidden", "gate"]


class Join(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(8, 8, 1)  # a class of its own, not a weight-free leaf written inline

    def forward(self, a, b):
        return self.proj(a * b)


def test_a_childs_own_name_or_an_x_names_no_argument():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.scale = nn.Conv2d(3, 8, 1)
            self.first = Fuse()
            self.join = Join()
            self.last = Fuse()

        def forward(self, x):
            feat = self.stem(x)
            x = self.scale(x)
            # join's first argument is first's result, named after the child (`first`); the second
            # argument of both Fuse calls is an `x` of the forward: neither says what the value is
            return self.last(self.join(self.first(feat, x), feat), x)

    net, _ = check_model(Net())
    assert _args(classes_of(net.source)["Join"]) == ["x", "feat"]
    assert _args(classes_of(net.source)["Fuse"]) == ["hidden", "x1"]


def check_mix():
    return check_model(Mix())


def check_model(model):
    import tempfile
    from pathlib import Path

    model.__class__ = type("Net", (type(model),), {})  # the root's class as check() names it: its roles apply
    with tempfile.TemporaryDirectory() as tmp:
        return check(Path(tmp), model, (1, 3, 8, 8), roles=True)


def _args(cls: ast.ClassDef) -> list[str]:
    fn = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "construct")
    return [a.arg for a in fn.args.args[1:]]
