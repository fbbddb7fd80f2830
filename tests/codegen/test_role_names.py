"""Locals named as the PyTorch ``forward`` names them (``torch2ms.export.roles``,
``torch2ms.codegen.locals``): read from the source, rebound only where nothing reads the old value,
and each assignment of a rebound name told apart in ``tensor_map.json``."""

from __future__ import annotations

import ast

import torchvision
from tiny_models import TinyNet
from torch import nn

from codegen.generate import generate
from torch2ms.export.roles import forward_roles, module_roles


def test_roles_come_from_torchvision_source():
    roles = forward_roles(torchvision.models.resnet.Bottleneck)
    assert roles["children"]["conv1"] == roles["children"]["bn3"] == "out"
    assert roles["children"]["downsample"] == "identity"
    assert roles["ops"] == [["Add", "out"]]  # out += identity
    # ResNet.forward is `return self._forward_impl(x)`: the method's names count
    resnet = forward_roles(torchvision.models.ResNet)
    assert resnet["children"]["layer4"] == "x" and ["Flatten", "x"] in resnet["ops"]


def test_a_class_without_source_has_no_roles():
    namespace: dict = {"nn": nn}
    exec("class Made(nn.Module):\n    def forward(self, x):\n        out = x + 1\n        return out\n", namespace)  # noqa: S102
    assert forward_roles(namespace["Made"]) is None
    assert "Made" not in module_roles(nn.Sequential(namespace["Made"]()))


def test_a_child_assigned_to_two_names_keeps_its_own():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            a = self.act(x)
            b = self.act(a)
            return b

    assert "children" not in forward_roles(Two)  # `act` feeds two names: neither is its role
    assert forward_roles(Two)["inputs"] == {"act": "x"}  # its first call reads the argument x


def test_rebound_names_are_counted_per_assignment():
    """TinyNet's forward rebinds ``y`` four times; the generated code does too, and each tensor map
    entry's ``assign`` is the assignment of its name at its ``line``."""
    net = generate(TinyNet().eval(), (1, 3, 32, 32), fold=True)
    fn = next(
        f
        for c in ast.parse(net.source).body
        if isinstance(c, ast.ClassDef) and c.name == "TinyNet"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "construct"
    )
    assigned: dict[str, list[int]] = {}
    for st in fn.body:
        if isinstance(st, ast.Assign):
            for t in st.targets:
                assigned.setdefault(t.id, []).append(st.lineno)
    assert len(assigned["y"]) >= 3, net.source
    for e in net.tensor_map:
        if e["class"] == "TinyNet":
            assert e["line"] == assigned[e["var"]][e["assign"]], e
    ys = [e for e in net.tensor_map if e["var"] == "y"]
    assert [e["assign"] for e in ys] == list(range(len(ys)))
