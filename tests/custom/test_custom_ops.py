"""Converter plugins and AOT kernels (torch2ms.custom): a user's op from an ONNX custom domain to
``ops.Custom(func_type="aot")``, checked against onnxruntime on the plugin's reference, and the bad
inputs: a plugin that does not import, an op registered twice, a converter that raises, a kernel
that does not compile, one whose declared output shape is wrong, one that crashes."""

from __future__ import annotations

import json
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import run_cli
from onnx import TensorProto, helper

from torch2ms.errors import EXIT_USAGE, PluginError

GOOD_KERNEL = """
#include <cmath>
#include <cstdint>
extern "C" int {fn}(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                    void *extra) {{
  const float *x = static_cast<const float *>(params[0]);
  const float *y = static_cast<const float *>(params[1]);
  float *z = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; d++) n *= shapes[2][d];
  for (int64_t i = 0; i < n; i++) z[i] = x[i] / (1.0f + std::exp(-x[i])) * y[i];
  {extra}
  return 0;
}}
"""

PLUGIN = """
from pathlib import Path

import torch2ms

KERNEL = torch2ms.AotKernel(
    source=Path(__file__).parent / "{stem}.cc",
    function="{fn}",
    inputs=("x", "y"),
    out_shape="{out_shape}",
    out_dtype="x",{ascend}
)

REFERENCE = '''
<domain: "{domain}", opset_import: ["" : 17]>
SiluMul (x, y) => (z) {{
    s = Sigmoid(x)
    xs = Mul(x, s)
    z = Mul(xs, y)
}}
'''


@torch2ms.converter("SiluMul", domain="{domain}", reference=REFERENCE)
def silu_mul(em):
    \"\"\"SiluMul(x, y) -> x * sigmoid(x) * y\"\"\"
    {body}
"""


def custom_model(domain: str) -> onnx.ModelProto:
    """x -> Relu -> SiluMul(relu, x) (domain ``domain``) -> Add 1: the custom op between standard ones."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 6, 6])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 6, 6])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [
        helper.make_node("Relu", ["input"], ["r"], name="/relu/Relu"),
        helper.make_node("SiluMul", ["r", "input"], ["s"], name="/gate/SiluMul", domain=domain),
        helper.make_node("Add", ["s", "one"], ["output"], name="/Add"),
    ]
    graph = helper.make_graph(nodes, "custom", [x], [y], initializer=[one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def make_case(
    tmp_path: Path, *, extra: str = "", out_shape: str = "x", body: str | None = None, kernel=None, ascend: str = ""
):
    """A plugin (unique module, domain and kernel name), its kernel and an ONNX-source recipe."""
    tag = uuid.uuid4().hex[:8]
    stem, fn, domain = f"plug_{tag}", f"SiluMul_{tag}", f"test.{tag}"
    (tmp_path / f"{stem}.cc").write_text(kernel if kernel is not None else GOOD_KERNEL.format(fn=fn, extra=extra))
    body = body or "return em.custom(KERNEL, 0, 1)"
    plugin = PLUGIN.format(stem=stem, fn=fn, domain=domain, out_shape=out_shape, body=body, ascend=ascend)
    (tmp_path / f"{stem}.py").write_text(textwrap.dedent(plugin))
    onnx.save(custom_model(domain), str(tmp_path / "custom.onnx"))
    recipe = {
        "name": "custom",
        "model": {"onnx": "custom.onnx"},
        "inputs": [{"name": "input", "shape": [1, 4, 6, 6]}],
        "check": {"samples": 1},
        "compile": {"graph_kernel": "off", "warmup": 1, "runs": 1},
        "converters": [stem],
        "output": str(tmp_path / "runs"),
    }
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path, stem, fn, domain


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path, monkeypatch, wide_console):
    monkeypatch.setenv("TORCH2MS_KERNEL_CACHE", str(tmp_path / "kernel-cache"))


@pytest.fixture(autouse=True)
def _registry_restored():
    """Each test's plugins leave the process's registry as they found it: the per-op tests that run
    later in the same worker must convert with the built-in converters (a plugin replacing Conv
    would otherwise take their depthwise cases)."""
    from torch2ms.converters.api import REGISTRY
    from torch2ms.converters.registry import registrations
    from torch2ms.custom import plugins

    registrations()  # the built-in converters are in the snapshot
    saved = {k: list(v) for k, v in REGISTRY.items()}
    loaded = dict(plugins.LOADED)
    yield
    for name in set(plugins.LOADED) - set(loaded):
        sys.modules.pop(name, None)  # imported again, registering again, by the next test that names it
    REGISTRY.clear()
    REGISTRY.update(saved)
    plugins.LOADED.clear()
    plugins.LOADED.update(loaded)


def _runner(recipe_path: Path, **kw):
    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    return pipeline_runner(load_recipe(recipe_path), log=lambda m: None, **kw)


def test_recipe_plugin_registers_and_check_names_its_ops(tmp_path, capsys):
    recipe, stem, _, domain = make_case(tmp_path)
    from torch2ms.converters.registry import lookup

    assert lookup("SiluMul", 17, domain) is None
    assert run_cli("check", "--recipe", str(recipe)) == 0
    reg = lookup("SiluMul", 17, domain)
    assert reg is not None and reg.plugin == stem
    assert f"converter plugin {stem}: {domain}.SiluMul" in capsys.readouterr().out


def test_unknown_custom_op_is_refused_naming_the_way_in(tmp_path, capsys, monkeypatch):
    onnx.save(custom_model("test.nobody"), str(tmp_path / "m.onnx"))
    assert run_cli("check", str(tmp_path / "m.onnx")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "domain 'test.nobody': SiluMul" in err and "converter plugin" in err
    # a plugin gives the reference but not the op's converter: the refusal says what the plugins cover
    _, stem, _, domain = make_case(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert run_cli("check", "custom.onnx", "--converters", stem) == 0
    model = custom_model(domain)
    model.graph.node[1].op_type = "SiluMul2"
    onnx.save(model, str(tmp_path / "other.onnx"))
    assert run_cli("check", "other.onnx", "--converters", stem) == EXIT_USAGE
    assert f"converter plugin {stem}: {domain}.SiluMul" in capsys.readouterr().err


def test_plugin_that_fails_to_import_is_named(tmp_path, capsys):
    recipe, stem, _, _ = make_case(tmp_path)
    (tmp_path / f"{stem}.py").write_text("import no_such_module_anywhere\n")
    assert run_cli("check", "--recipe", str(recipe)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"converter plugin {stem!r} failed to import: ModuleNotFoundError" in err


def test_two_registrations_of_one_op_are_named(tmp_path):
    from torch2ms.custom.plugins import load

    _, stem, _, domain = make_case(tmp_path)
    load(stem, [tmp_path])
    twin = tmp_path / f"{stem}_twin.py"
    twin.write_text(
        f"import torch2ms\n\n@torch2ms.converter('SiluMul', domain='{domain}')\ndef again(em):\n    return 'x'\n"
    )
    with pytest.raises(
        PluginError, match=f"{stem}_twin.*{domain}.SiluMul .since opset 1. is already registered by '{stem}'"
    ):
        load(f"{stem}_twin", [tmp_path])
    builtin = tmp_path / f"{stem}_relu.py"
    builtin.write_text("import torch2ms\n\n@torch2ms.converter('Relu')\ndef relu(em):\n    return 'x'\n")
    with pytest.raises(PluginError, match="Relu is a built-in converter"):
        load(f"{stem}_relu", [tmp_path])


def test_converter_that_raises_is_named(tmp_path, capsys):
    recipe, stem, _, domain = make_case(tmp_path, body="return {}['missing']")
    assert run_cli("check", "--recipe", str(recipe)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"converter plugin {stem!r}: its converter silu_mul for {domain}.SiluMul (node '/gate/SiluMul')" in err
    assert "raised KeyError" in err


def test_entry_point_plugin_is_loaded(tmp_path, monkeypatch):
    from importlib import metadata

    from torch2ms.custom import plugins

    _, stem, _, domain = make_case(tmp_path)
    dist = tmp_path / "team_ops-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: team-ops\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nteam = {stem}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [e.value for e in metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)] == [stem]
    plugins.load_entry_points()
    assert plugins.covered()[stem] == [f"{domain}.SiluMul"]


def test_aot_kernel_through_every_stage_and_its_build_cached(tmp_path):
    """PyNative (rebuild, fold), GRAPH_MODE (compile), MindIR export and reload from its folder."""
    recipe, _, fn, _ = make_case(tmp_path)
    result = _runner(recipe).run()
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    run = tmp_path / "runs" / "custom"
    record = json.loads((run / "fold" / "conversion.json").read_text())["custom_kernels"][fn]
    source = tmp_path / f"{fn.replace('SiluMul_', 'plug_')}.cc"
    assert record["source_sha256"] == __import__("hashlib").sha256(source.read_bytes()).hexdigest()
    assert record["compiler"].startswith("g++") and "-fPIC" in record["flags"]
    assert (run / "mindir" / "kernels" / f"{fn}.so").is_file()
    assert f"kernels/{fn}.so:{fn}".encode() in (run / "mindir" / "network.mindir").read_bytes()
    # the board: the kernel is the host's, so the op is unsupported there until its Ascend kernel is given
    fold = json.loads((run / "fold" / "stage.json").read_text())["counts"]
    assert fold["off_ai_core"] == [f"{fn} x1 (unsupported)"]
    from torch2ms.bundle.compat import scan_mindir
    from torch2ms.runtime import mindir_layout

    assert run / "mindir" / "kernels" / f"{fn}.so" in mindir_layout.files(run / "mindir")  # what the bundle carries
    (finding,) = scan_mindir(run / "mindir" / "network.mindir")["findings"]
    assert (
        finding["level"] == "error" and finding["first"] == fn and "supply its Ascend implementation" in finding["why"]
    )
    given = run / "mindir" / "kernels" / "ascend" / fn
    given.mkdir(parents=True)
    (given / "silu_mul.cpp").write_text("// the user's Ascend C kernel\n")
    (finding,) = scan_mindir(run / "mindir" / "network.mindir")["findings"]
    assert finding["level"] == "check" and "AI Core" in finding["why"] and "silu_mul.cpp" in finding["why"]
    # the bundle carries model/kernels/ and its MindIR runs from there (verify), the compat report names the op
    from torch2ms.bundle.build import build_bundle

    bundle = build_bundle(result, tmp_path / "dist", log=lambda m: None).path
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert any(n.endswith(f"model/kernels/{fn}.so") for n in names)
    assert any(n.endswith(f"model/kernels/ascend/{fn}/silu_mul.cpp") for n in names)
    assert run_cli("verify", str(bundle)) == 0
    cached = Path(record["cache"])
    stamp = cached.stat().st_mtime_ns
    from torch2ms.custom.aot import KERNELS, build

    assert build(KERNELS[fn], "op")[0] == cached and cached.stat().st_mtime_ns == stamp  # not compiled again


def test_kernel_that_does_not_compile(tmp_path, capsys):
    recipe, _, fn, domain = make_case(tmp_path, kernel='extern "C" int Broken() { return undefined_name; }\n')
    assert run_cli("check", "--recipe", str(recipe)) == 0  # analysis builds nothing
    assert run_cli("convert", "--one-process", "-r", str(recipe)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"custom op {domain}.SiluMul: AOT kernel {fn}" in err and "does not compile" in err
    assert "error: 'undefined_name' was not declared" in err
    assert not (tmp_path / "runs" / "custom" / "rebuild").exists()


def test_kernel_whose_inference_disagrees(tmp_path, capsys):
    recipe, _, fn, domain = make_case(tmp_path, out_shape="x[:2]")
    assert run_cli("convert", "--one-process", "-r", str(recipe)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"custom op {domain}.SiluMul (node '/gate/SiluMul'): AOT kernel {fn}" in err
    assert "gives (1, 4), the op's output is (1, 4, 6, 6)" in err


def test_kernel_that_crashes_fails_its_stage_and_the_run_resumes(tmp_path):
    """With plugins every stage runs in a process of its own: a segfault ends that one, by name."""
    from torch2ms.errors import StageFailed

    recipe, stem, fn, _ = make_case(tmp_path, extra="if (n > 0) { volatile int *p = nullptr; *p = 1; }")
    assert _runner(recipe).run(until="export").stages[0].status == "passed"  # here: one child process less
    with pytest.raises(StageFailed, match=f"stage 'rebuild' failed .*SIGSEGV.*AOT kernels .*{stem}"):
        _runner(recipe, own_processes=True).run(until="rebuild")
    run = tmp_path / "runs" / "custom"
    assert not (run / "rebuild").exists() and (run / "export" / "model.onnx").is_file()
    assert not [p.name for p in run.iterdir() if "partial" in p.name]
    (tmp_path / f"{stem}.cc").write_text(GOOD_KERNEL.format(fn=fn, extra=""))
    again = _runner(recipe).run(until="rebuild")
    status = {s.stage: s.status for s in again.stages}
    assert status["export"] == "up to date" and status["rebuild"] == "passed"
    worst = max(m["max_abs"] for m in again.stages[1].record["metrics"])
    np.testing.assert_array_less(worst, 1e-5)


def test_placement_with_an_ascend_kernel_is_ai_core(tmp_path):
    """The plugin declares the op's Ascend implementation: AI Core, and the MindIR's folder carries it."""
    (tmp_path / "op.cpp").write_text("// the user's Ascend C kernel\n")
    (tmp_path / "op.json").write_text("{}\n")
    ascend = '\n    ascend=torch2ms.AscendKernel(Path(__file__).parent / "op.cpp", Path(__file__).parent / "op.json"),'
    _, stem, fn, _ = make_case(tmp_path, ascend=ascend)
    from torch2ms.ascend.placement import place_node
    from torch2ms.ascend.table import AI_CORE
    from torch2ms.custom import plugins
    from torch2ms.graph import load_onnx

    plugins.load(stem, [tmp_path])
    graph = load_onnx(tmp_path / "custom.onnx")
    info = place_node(graph, graph.nodes[1], "fp16")
    assert [(o.cann, o.where.placement) for o in info.ops] == [(fn, AI_CORE)]


@pytest.mark.slow
def test_example_torch_library_op_through_five_stages(tmp_path, monkeypatch):
    """examples/custom_op: a torch.library op, its custom symbolic, the plugin's AOT kernel: every
    stage against PyTorch; the export check runs onnxruntime on the plugin's reference."""
    from conftest import REPO

    from torch2ms.recipe import load_recipe
    from torch2ms.stages import pipeline_runner

    recipe = load_recipe(REPO / "examples" / "custom_op" / "silu_mul.yaml")
    result = pipeline_runner(recipe, tmp_path / "runs", log=lambda m: None).run()
    assert [s.status for s in result.stages] == ["passed"] * 5, [(s.stage, s.reason) for s in result.stages]
    model = onnx.load(str(tmp_path / "runs" / recipe.name / "export" / "model.onnx"))
    assert [(n.domain, n.op_type) for n in model.graph.node if n.domain] == [("t2ms.example", "SiluMul")]
    assert [(f.domain, f.name) for f in model.functions] == [("t2ms.example", "SiluMul")]
    network = (tmp_path / "runs" / recipe.name / "fold" / "network.py").read_text()
    assert "ops.Custom(" in network and 'library + ":SiluMul"' in network and 'func_type="aot"' in network


def test_plugin_replacing_a_builtin_op_takes_only_what_it_claims(tmp_path, monkeypatch):
    """examples/custom_op/t2ms_depthwise: a 3x3 depthwise Conv goes to the user kernel (its weight
    and bias stored in the checkpoint), a 1x1 Conv to the built-in converter; checked against
    onnxruntime in the rebuild stage."""
    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples" / "custom_op"))
    rng = np.random.default_rng(0)
    dw = helper.make_tensor("dw", TensorProto.FLOAT, [4, 1, 3, 3], rng.standard_normal(36).astype(np.float32))
    db = helper.make_tensor("db", TensorProto.FLOAT, [4], rng.standard_normal(4).astype(np.float32))
    pw = helper.make_tensor("pw", TensorProto.FLOAT, [6, 4, 1, 1], rng.standard_normal(24).astype(np.float32))
    nodes = [
        helper.make_node("Conv", ["input", "dw", "db"], ["d"], name="/dw/Conv", group=4, pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Conv", ["d", "pw"], ["output"], name="/pw/Conv"),
    ]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 9, 9])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 6, 5, 5])
    graph = helper.make_graph(nodes, "dw", [x], [y], initializer=[dw, db, pw])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "dw.onnx"))
    recipe = {
        "name": "dw",
        "model": {"onnx": "dw.onnx"},
        "inputs": [{"name": "input", "shape": [1, 4, 9, 9]}],
        "check": {"samples": 1},
        "converters": ["t2ms_depthwise"],
        "output": str(tmp_path / "runs"),
    }
    (tmp_path / "dw.yaml").write_text(yaml.safe_dump(recipe))
    result = _runner(tmp_path / "dw.yaml").run(until="rebuild")
    assert [s.status for s in result.stages[:2]] == ["passed", "passed"], [s.reason for s in result.stages]
    layers = json.loads((tmp_path / "runs" / "dw" / "rebuild" / "conversion.json").read_text())["layers"]
    assert layers == {"DepthwiseConv3x3S2Kernel": 1, "nn.Conv2d": 1}
