"""The modules layout of ``network.py`` (``torch2ms.codegen.modules``): tiny nested PyTorch models
exported as the export stage does, converted with ``layout="modules"``; each test asserts the
structure (classes, attribute paths, PyTorch's parameter names) and that the outputs equal
PyTorch's within float32 rounding and the flat layout's bit for bit."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from torch2ms.codegen.convert import convert_graph
from torch2ms.export.roles import module_roles
from torch2ms.graph.load import graph_from_model
from torch2ms.passes import fold_passes, rebuild_passes, run_passes
from torch2ms.runtime import msutil


def export(model: nn.Module, shape: tuple, dynamo: bool = False) -> tuple[onnx.ModelProto, dict[str, str]]:
    """TorchScript (module paths in the node names), or dynamo (module paths in the node metadata)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(
                model.eval(), (torch.zeros(*shape),), dynamo=True, opset_version=18, input_names=["x"], verbose=False
            )
            proto = program.model_proto
        else:
            torch.onnx.export(
                model.eval(),
                (torch.zeros(*shape),),
                buf,
                dynamo=False,
                opset_version=17,
                training=torch.onnx.TrainingMode.PRESERVE,
                input_names=["x"],
            )
            proto = onnx.load_from_string(buf.getvalue())
    classes = {n: type(m).__name__ for n, m in model.named_modules() if n}
    return proto, classes


def convert(
    tmp: Path,
    model: nn.Module,
    shape: tuple,
    layout: str,
    fold: bool = False,
    rename=None,
    dynamo: bool = False,
    roles: bool = False,
):
    """(generated network, its outputs on a seeded input, PyTorch's outputs on it); ``rename``:
    node name -> name, to give nodes the scopes another exporter would."""
    torch.manual_seed(0)
    proto, classes = export(model, shape, dynamo)
    if rename:
        for n in proto.graph.node:
            n.name = rename.get(n.name, n.name)
        classes = {**classes, **rename.get("classes", {})}
    onnx.save(proto, str(tmp / "model.onnx"))
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    graph = graph_from_model(proto, opset, {"x": shape})
    run_passes(graph, fold_passes(True) if fold else rebuild_passes(True))
    sha = hashlib.sha256((tmp / "model.onnx").read_bytes()).hexdigest()
    names = module_roles(model) if roles else None  # as the export stage records them (locals, arguments)
    net = convert_graph(graph, "Net", "model.onnx", sha, "test", layout=layout, modules=classes, roles=names)
    out = tmp / f"{layout}{'_fold' if fold else ''}"
    out.mkdir()
    (out / "network.py").write_text(net.source)
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()], str(out / "network.ckpt"))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    cell = msutil.build_network(out, f"{tmp.name}_{layout}_{fold}")
    got = cell(ms.Tensor(x))
    got = [g.asnumpy() for g in (got if isinstance(got, tuple) else (got,))]
    with torch.no_grad():
        ref = model.eval()(torch.from_numpy(x))
    ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    return net, got, ref, cell


def check(
    tmp: Path,
    model: nn.Module,
    shape: tuple,
    fold: bool = False,
    rename=None,
    dynamo: bool = False,
    roles: bool = False,
):
    """The modules network: its outputs against PyTorch, and bitwise against the flat layout's
    (``roles``: with the names the classes' ``forward`` gives, as the pipeline passes them)."""
    net, got, ref, cell = convert(tmp, model, shape, "modules", fold, rename, dynamo, roles)
    _, flat, _, _ = convert(tmp, model, shape, "flat", fold, rename, dynamo)
    for g, r, f in zip(got, ref, flat):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()))
        assert np.array_equal(g, f), "the modules layout computes other bits than the flat one"
    ruff = [sys.executable, "-m", "ruff"]
    src = tmp / f"modules{'_fold' if fold else ''}" / "network.py"
    lint = ["check", "--isolated", "--line-length", "100", "--extend-select", "E501", str(src)]
    assert subprocess.run([*ruff, *lint]).returncode == 0
    fmt = [*ruff, "format", "--isolated", "--line-length", "100", "--check", str(src)]
    assert subprocess.run(fmt).returncode == 0
    assert net.layout["layout"] == "modules", net.layout
    return net, cell


def classes_of(source: str) -> dict[str, ast.ClassDef]:
    return {c.name: c for c in ast.parse(source).body if isinstance(c, ast.ClassDef)}


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + out)  # relu called twice: one attribute


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stages = nn.Sequential(Block(8, 8), Block(8, 16, 2), Block(16, 16))
        self.heads = nn.ModuleList([nn.Conv2d(16, 4, 1), nn.Conv2d(16, 2, 1)])

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.heads[0](x), self.heads[1](x)


def _randomize(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model


def test_repeated_blocks_sequential_and_modulelist(tmp_path):
    net, cell = check(tmp_path, _randomize(Net()), (1, 3, 16, 16))
    classes = classes_of(net.source)
    # one class for the three Blocks (sizes and the stride are constructor arguments), no Sequential class
    assert set(classes) == {"Block", "Net"}
    init = ast.unparse(classes["Block"].body[1])
    assert "def __init__(self, in_channels, out_channels, stride=1)" in init
    # by keyword, a value most instances take (stride 1) the argument's default
    blocks = "Block(in_channels=8, out_channels=8), Block(in_channels=8, out_channels=16, stride=2)"
    assert f"nn.SequentialCell([{blocks}, Block(in_channels=16, out_channels=16)])" in ast.unparse(
        classes_of(net.source)["Net"]
    )
    assert "self.heads = nn.CellList(" in net.source and "self.heads[1](" in net.source
    # PyTorch's paths: the parameters are named by the state_dict keys (Conv2dBnAct's inner names)
    names = {p.name for p in cell.get_parameters()}
    assert {"stages.1.conv1.conv.weight", "stages.1.conv1.batchnorm.gamma", "stem.0.conv.bias"} <= names
    assert "heads.1.weight" in names
    # short local names, unique per method
    construct = ast.unparse(next(f for f in classes["Block"].body if getattr(f, "name", "") == "construct"))
    assert "conv1 = self.conv1(x)" in construct and "relu = ops.relu(add)" in construct
    assert max(len(n.id) for n in ast.walk(ast.parse(net.source)) if isinstance(n, ast.Name)) <= 20
    # every statement of the block maps to the class's line, per instance
    entry = next(e for e in net.tensor_map if e["module"] == "stages.2")
    assert entry["class"] == "Block" and entry["where"].endswith("in Block.construct")
    assert net.layout["nodes_in_modules"] == net.layout["nodes"]  # the network's forward has no op of its own


def test_dynamo_export_gets_the_module_classes_from_its_metadata(tmp_path):
    """The dynamo exporter names nodes ``node_Conv_14``; the module paths are in each node's
    ``pkg.torch.onnx.name_scopes``: the same classes and PyTorch paths as from TorchScript. Its
    optimizer folds each BatchNorm into the conv before it (recorded under the BatchNorm's module):
    that conv belongs to their parent, not to an attribute named after the BatchNorm."""
    net, cell = check(tmp_path, _randomize(Net()), (1, 3, 16, 16), dynamo=True)
    assert set(classes_of(net.source)) == {"Block", "Net"}
    # by keyword, a value most instances take (stride 1) the argument's default
    blocks = "Block(in_channels=8, out_channels=8), Block(in_channels=8, out_channels=16, stride=2)"
    assert f"nn.SequentialCell([{blocks}, Block(in_channels=16, out_channels=16)])" in ast.unparse(
        classes_of(net.source)["Net"]
    )
    names = {p.name for p in cell.get_parameters()}
    assert {"heads.0.weight", "heads.1.bias"} <= names, sorted(names)
    assert not [n for n in names if ".bn" in n], sorted(names)
    assert len([n for n in names if n.startswith("stages.1.") and n.endswith("weight")]) == 2, sorted(names)
    assert net.layout["nodes_in_modules"] == net.layout["nodes"]


class SplitAttention(nn.Module):
    """``torch.split`` inside a module: the dynamo exporter writes its Split without module metadata."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Conv2d(8, 24, 1)

    def forward(self, x):
        q, k, v = torch.split(self.qkv(x), [8, 8, 8], dim=1)
        return q * k + v


class SplitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.attn = SplitAttention()

    def forward(self, x):
        return self.attn(self.stem(x))


def test_a_dynamo_node_without_module_metadata_goes_to_its_consumers_module(tmp_path):
    """The Split belongs to ``attn``, where all its consumers are: ``attn`` is one class, not inlined
    into the network (timm's halo nets kept 9-13 modules inline for this)."""
    proto, _ = export(SplitNet(), (1, 3, 8, 8), dynamo=True)
    assert [n for n in proto.graph.node if n.op_type == "Split" and not n.metadata_props], "the exporter changed"
    net, _ = check(tmp_path, SplitNet(), (1, 3, 8, 8), dynamo=True)
    assert set(classes_of(net.source)) == {"SplitAttention", "Net"}  # Net: the network, as convert() names it
    assert not net.layout.get("inlined") and net.layout["nodes_in_modules"] == net.layout["nodes"], net.layout


def randomized_net() -> nn.Module:
    return _randomize(Net())


def test_a_dynamo_export_through_the_export_stage_has_no_wrapper_module(tmp_path):
    """The export stage wraps the model (``inner``) to flatten its outputs; the dynamo exporter
    records that wrapper in every node's module path (``inner.stages.0``), so the classes nested
    under a module the model does not have, and timm's halo nets kept 10-14 modules inline at
    73-77% of their nodes in a class. The export drops it, as it drops ``/inner/`` from TorchScript
    names."""
    from conftest import write_recipe

    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    path = write_recipe(
        tmp_path / "net.yaml",
        name="net",
        task="other",
        model={"factory": "codegen.test_module_layout:randomized_net", "seed": 0},
        inputs=[{"name": "x", "shape": [1, 3, 16, 16]}],
        export={"exporter": "dynamo"},
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run(until="rebuild")
    assert [s.status for s in result.stages[:2]] == ["passed", "passed"], [s.reason for s in result.stages[:2]]
    export = json.loads((result.root / "export" / "stage.json").read_text())
    assert export["extra"]["export_path"]["exporter"] == "dynamo"
    model = onnx.load(str(result.root / "export" / "model.onnx"))
    scopes = [p.value for n in model.graph.node for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
    assert scopes and not [s for s in scopes if "inner" in s], scopes[:3]
    layout = json.loads((result.root / "rebuild" / "stage.json").read_text())["counts"]["layout"]
    assert not layout.get("inlined") and layout["nodes_in_modules"] == layout["nodes"], layout
    source = (result.root / "rebuild" / "network.py").read_text()
    assert set(classes_of(source)) == {"Block", "Net"}


def test_fold_layout_keeps_the_structure(tmp_path):
    net, cell = check(tmp_path, _randomize(Net()), (1, 3, 16, 16), fold=True)
    assert "stages.2.conv2.conv.weight" in {p.name for p in cell.get_parameters()}
    assert "has_bn" not in net.source  # folded: no BatchNorm left


class Shared(nn.Module):
    """One Conv2d called twice: one attribute, one set of weights."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.inner = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())

    def forward(self, x):
        return self.inner(self.conv(self.conv(x)))


def test_shared_module_is_one_attribute(tmp_path):
    net, cell = check(tmp_path, Shared(), (1, 4, 8, 8))
    root = ast.unparse(classes_of(net.source)["Net"])
    assert root.count("self.conv = ") == 1 and root.count("self.conv(") == 2
    assert [p.name for p in cell.get_parameters()].count("conv.weight") == 1


class Interleaved(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.b(self.a(x) + x)


def test_interleaved_module_stays_inline_and_is_named(tmp_path):
    """An exporter that put both convs in module ``inner`` and the Add between them in the parent:
    ``inner`` cannot be one call (it would need the parent's Add halfway), so it stays inline."""
    rename = {"/a/Conv": "/inner/a/Conv", "/b/Conv": "/inner/b/Conv", "classes": {"inner": "Inner"}}
    net, cell = check(tmp_path, Interleaved(), (1, 4, 8, 8), rename=rename)
    assert [i["module"] for i in net.layout["inlined"]] == ["inner"]
    assert "interleave" in net.layout["inlined"][0]["why"]
    # its layers stay in the parent, named after the path
    assert {"inner_a.weight", "inner_b.weight"} <= {p.name for p in cell.get_parameters()}
    assert "class Inner" not in net.source


def test_flat_layout_is_unchanged(tmp_path):
    net, _, _, _ = convert(tmp_path, Net(), (1, 3, 16, 16), "flat")
    assert net.layout == {"layout": "flat"}
    assert list(classes_of(net.source)) == ["Net"]


def test_diff_names_the_instance_and_class_line(tmp_path, monkeypatch):
    """A wrong Add converter: ``localize`` instruments every class and finds the first wrong
    statement inside ``Block.construct`` of the first block (``stages.0``), at the class's line."""
    from torch2ms.compare import Tolerance
    from torch2ms.converters import api, registry
    from torch2ms.divergence import localize

    registry.registrations()
    wrong = api.Registration("Add", 1, lambda em: f"{em.operand(0)} - {em.operand(1)}")
    monkeypatch.setitem(api.REGISTRY, ("", "Add"), [wrong])
    model = _randomize(Net())
    net, _, _, _ = convert(tmp_path, model, (1, 3, 16, 16), "modules")
    (tmp_path / "modules" / "tensor_map.json").write_text(json.dumps(net.tensor_map))
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    report = localize(tmp_path / "model.onnx", tmp_path / "modules", [{"x": x}], Tolerance(1e-4, 0.9999), "rebuild")
    first = report.first
    line = net.source.splitlines().index("        add = conv2 - conv1") + 1
    assert (first.op, first.module, first.cls, first.line) == ("Add", "stages.0", "Block", line)
    assert report.wrong is first  # on onnxruntime's own inputs this statement alone is wrong
    assert f"network.py:{line} in Block.construct (stages.0)" in report.summary()


class Named(nn.Module):
    """A Sequential with named children (``add_module``), as torchvision's ViT encoder has."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential()
        for k in range(2):
            self.layers.add_module(f"block_{k}", Block(4, 4))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.layers(x).mean((2, 3)))


def test_named_sequential_is_an_ordered_sequentialcell_in_graph_mode(tmp_path):
    net, cell = check(tmp_path, _randomize(Named()), (2, 4, 8, 8))
    assert 'nn.SequentialCell(OrderedDict([("block_0", Block()), ("block_1", Block())]))' in net.source
    assert "layers.block_1.conv2.conv.weight" in {p.name for p in cell.get_parameters()}
    ms = msutil.mindspore()
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    eager = cell(ms.Tensor(x)).asnumpy()
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        graph = cell(ms.Tensor(x)).asnumpy()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-5)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, cache):
        return self.proj(x) + cache


class _Stacked(nn.Module):
    """A decode step's shape: a stacked cache read layer by layer, the layers' outputs stacked again."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Layer() for _ in range(3)])

    def forward(self, x):
        outs = [layer(x[i], x[i] * 0.5) for i, layer in enumerate(self.layers)]
        return torch.stack(outs, 0)


def test_a_stacked_tensor_read_position_by_position_is_one_unstack_and_one_stack(tmp_path):
    net, _ = check(tmp_path, _randomize(_Stacked()), (3, 2, 4))
    root = ast.unparse(classes_of(net.source)["Net"])
    assert "x_0, x_1, x_2 = ops.unstack(x, axis=0)" in root, root
    assert "ops.stack((" in root and "ops.concat" not in root and "x[" not in root


class _Norm(nn.Module):
    """Qwen2RMSNorm's shape: the input upcast (a no-op on float32), then scaled."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x):
        x = x.to(torch.float32)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.fc1, self.norm2, self.fc2 = _Norm(), nn.Linear(4, 4), _Norm(), nn.Linear(4, 4)

    def forward(self, x):
        x = x + self.fc1(self.norm1(x))
        return x + self.fc2(self.norm2(x))


def test_a_module_does_not_return_its_input_under_another_name(tmp_path):
    net, _ = check(tmp_path, _randomize(_Residual()), (2, 4))
    classes = classes_of(net.source)
    assert "Norm2" not in classes, "one class for both norms"
    returns = [n for n in ast.walk(classes["Norm"]) if isinstance(n, ast.Return)]
    assert all(not isinstance(r.value, ast.Tuple) for r in returns), net.source


class _Rotary(nn.Module):
    """Its result is an Unsqueeze that every layer reads: the module's result, not a shared step."""

    def forward(self, x):
        return torch.cos(x).unsqueeze(-1)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, cos):
        c = cos.squeeze(-1)  # the same in every layer: the exporter computes it once, in layer 0
        return x + self.proj(x) * c


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = _Rotary()
        self.layers = nn.ModuleList([_Layer() for _ in range(3)])

    def forward(self, x):
        cos = self.rotary(x)
        for layer in self.layers:
            x = layer(x, cos)
        return x


def test_a_reshape_the_exporter_shares_between_layers_is_each_layers_own(tmp_path):
    """Without CopyReshapesIntoModules layer 0 returns its ``cos.squeeze(-1)`` and layers 1 and 2 read
    it: two classes for one PyTorch class. The rotary module's own result is not copied."""
    from torch2ms.passes import CopyReshapesIntoModules

    proto, _ = export(_Decoder(), (2, 4))
    shared = {o for n in proto.graph.node if n.op_type == "Squeeze" and "layers.0" in n.name for o in n.output}
    readers = [n.name for n in proto.graph.node if set(n.input) & shared]
    assert any("layers.1" in r for r in readers), f"the exporter no longer shares it: {readers}"
    graph = graph_from_model(proto, 17)
    pass_ = CopyReshapesIntoModules()
    assert pass_.apply(graph) == 1
    copies = [n for n in graph.nodes if n.origin != [n.name]]
    assert sorted(n.name.split("/")[1] for n in copies) == ["layers.1", "layers.2"], [n.name for n in copies]
    assert all("/layers.0/" in n.origin[0] and n.op_type == "Squeeze" for n in copies)
    net, _ = check(tmp_path, _Decoder(), (2, 4))
    classes = classes_of(net.source)
    assert [c for c in classes if "Layer" in c] == ["Layer"], net.source


def test_equal_layers_of_a_list_are_one_comprehension(tmp_path):
    """Three decoder layers written alike are ``[_Layer() for _ in range(3)]``, as mindcv writes a
    stage; their parameters keep PyTorch's indexed names."""
    net, cell = check(tmp_path, _Decoder(), (2, 4))
    root = ast.unparse(classes_of(net.source)["Net"])
    assert "nn.CellList([Layer() for _ in range(3)])" in root, root
    names = {p.name for p in cell.get_parameters()}
    assert {f"layers.{i}.proj.weight" for i in range(3)} <= names, sorted(names)
