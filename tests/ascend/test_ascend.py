"""Ascend 310 placement: the lowering table covers every call a converter can emit, the derived
table places ops as its sources say, ``check --target`` prints the placement and advice, and the
Ascend rewrites fire (or not) and keep the numbers of onnxruntime on the original model."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from torch2ms.ascend import advice, generate
from torch2ms.ascend.lowering import LOWERING, NOT_EMITTED, PLACED_BY_PLUGIN, Site, lower
from torch2ms.ascend.placement import UNKNOWN, calls_in, place_graph, summary
from torch2ms.ascend.report import ascend_report, render
from torch2ms.ascend.table import AI_CORE, AI_CPU, NONE, UNSUPPORTED, load, place
from torch2ms.errors import EXIT_USAGE
from torch2ms.graph.load import graph_from_model
from torch2ms.passes import (
    ExpandGroupNorm,
    ExpandHardActivations,
    MaxPoolPadToPad,
    MirrorPadToConcat,
    PowToMul,
    fold_passes,
    run_passes,
)

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
_TOKEN = re.compile(r"\b((?:ops|nn)\.[A-Za-z_][A-Za-z0-9_]*)(\{\})?")


def emitted_names() -> set[str]:
    """Every ``ops.*`` / ``nn.*`` name in the converter and codegen sources; ``nn.MaxPool{}d``-style
    templates expanded to 1-3 dimensions. ``codegen/convert.py`` drives them and emits nothing: it
    counts the layers the others wrote (``nn.BatchNorm*``)."""
    names = set()
    sources = [*sorted((ROOT / "torch2ms/converters").glob("*.py")), *sorted((ROOT / "torch2ms/codegen").glob("*.py"))]
    for f in [f for f in sources if f.name != "convert.py" or f.parent.name != "codegen"]:
        for name, template in _TOKEN.findall(f.read_text()):
            if template:
                names |= {f"{name}{n}d" for n in (1, 2, 3)}
            elif not f.read_text().count(f"{name}{{"):  # 'nn.Conv{1,2,3}d' in a docstring: a template too
                names.add(name)
    return names


def test_lowering_table_knows_every_call_a_converter_emits():
    unknown = sorted(n for n in emitted_names() if n not in LOWERING and n not in NOT_EMITTED | PLACED_BY_PLUGIN)
    assert not unknown, f"add these to torch2ms/ascend/lowering.py (the CANN ops they lower to): {unknown}"


def test_every_lowered_op_is_known_to_a_source_or_said_missing():
    """Each CANN op the lowering names is in the AI Core or the AI CPU list, or is placed 'unsupported'
    with the reason; none is left without a verdict."""
    t = load()
    for name, low in LOWERING.items():
        ops = low if not callable(low) else ()
        for op in ops:
            w = place(op, "float32", "fp16", t)
            assert w.placement in (AI_CORE, AI_CPU, UNSUPPORTED, NONE), (name, op)
            assert w.placement != UNSUPPORTED or w.reason


def test_table_provenance_names_sources_and_versions():
    prov = load()["provenance"]
    assert "5c28a2faf9d2a117ea6f0923efe35fcd53904dd2" in prov["ai_core"]["source"]
    assert prov["ai_cpu"]["source"].startswith("mindspore 2.10.0")


def test_placement_follows_the_op_lists():
    t = {
        "ai_core": {"Relu": ["float16", "float32"], "MaxPool": ["float16"], "Add": "select_format", "Cast": ["int32"]},
        "ai_cpu": {"MaxPool3DWithArgmax": ["float16", "float32"], "Cast": ["float32", "int64"]},
    }
    assert place("Relu", "float32", "fp16", t).placement == AI_CORE
    assert place("Relu", "float32", "fp16", t).dtype == "float16"
    cube_fp16 = place("MaxPool", "float32", "cube-fp16", t)
    assert (cube_fp16.placement, cube_fp16.dtype) == (AI_CORE, "float16") and "allow_fp32_to_fp16" in cube_fp16.reason
    assert (
        place("Conv2D", "float32", "cube-fp16", {"ai_core": {"Conv2D": ["float16"]}, "ai_cpu": {}}).dtype == "float16"
    )
    assert place("Relu", "float32", "cube-fp16", t).dtype == "float32"
    fp32 = place("MaxPool", "float32", "fp32", t)  # must_keep_origin_dtype: no fp16 fallback, no AI CPU kernel either
    assert fp32.placement == UNSUPPORTED and fp32.dtype == "float32"
    assert place("Add", "int64", "fp16", t).placement == AI_CORE
    cpu = place("MaxPool3DWithArgmax", "float32", "fp16", t)
    assert cpu.placement == AI_CPU and "no AI Core kernel" in cpu.reason
    cast = place("Cast", "int64", "fp16", t)
    assert cast.placement == AI_CPU and "int64 not in its AI Core kernel's (int32)" in cast.reason
    gone = place("HardSwish", "float32", "fp16", t)
    assert gone.placement == UNSUPPORTED and "no AI CPU kernel" in gone.reason
    assert place("Reshape", "float32", "fp16", t).placement == NONE


def test_generator_reads_ops_info_and_mindspore_aicpu_registrations(tmp_path):
    ops_info = {
        "Relu": {"input0": {"dtype": "float16,float,int32", "name": "x"}},
        "Mul": {"dynamicFormat": {"flag": "true"}, "input0": {"name": "x1"}},
    }
    assert generate.ai_core_ops(ops_info) == {"Mul": "select_format", "Relu": ["float16", "float32", "int32"]}
    import mindspore

    cpu = generate.ai_cpu_ops(Path(mindspore.__file__).parent / "ops" / "_op_impl" / "aicpu")
    assert "float16" in cpu["Pow"] and "MaxPool3DWithArgmax" in cpu
    text = (Path(mindspore.__file__).parent / "ops" / "_op_impl" / "aicpu" / "pow.py").read_text()
    assert 'AiCPURegOp("Pow")' in text  # the registration the generator parses


def test_calls_in_reads_operators_layers_and_primitives():
    layers = {"layer0": ("nn.MaxPool2d", (), {"kernel_size": 3, "pad_mode": "pad", "padding": 1})}
    calls = calls_in(
        "ops.ResizeBilinearV2(align_corners=False)(self.layer0(x) * 2.0 + y, (4, 4))[0]"
        ' >= ops.pad(z, (1, 1), value=float("-inf"))',
        layers,
    )
    names = [c[0] for c in calls]
    assert sorted(names) == sorted(["ops.ResizeBilinearV2", "nn.MaxPool2d", "*", "+", "getitem", ">=", "ops.pad"])
    pad = next(c for c in calls if c[0] == "ops.pad")
    assert lower("ops.pad", Site(pad[1])) == ("PadV3D",)
    pool = next(c for c in calls if c[0] == "nn.MaxPool2d")
    assert lower("nn.MaxPool2d", Site(pool[1])) == ("MaxPool3DWithArgmax",)
    assert calls_in("2 * 3 + -1", {}) == []  # Python arithmetic on constants runs nowhere


# --- small models -------------------------------------------------------------------------------


def _model(nodes, inits, shape=(1, 3, 8, 8), opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def pow_model(exponent, per_element=False):
    e = np.full((8,), exponent, np.float32) if not per_element else np.linspace(1, 2, 8).astype(np.float32)
    inits = [_const("e", e if per_element else np.float32(exponent))]
    return _model([helper.make_node("Pow", ["x", "e"], ["y"], name="/head/Pow")], inits)


def stem_model(ceil_mode=0):
    """Conv + Relu + MaxPool(3, stride 2, pad 1): ResNet's stem."""
    inits = [_const("w", RNG.standard_normal((16, 3, 3, 3)) * 0.3)]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="/stem/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="/stem/relu/Relu"),
        helper.make_node(
            "MaxPool", ["r"], ["y"], name="/stem/pool/MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
            ceil_mode=ceil_mode,
        ),
    ]  # fmt: skip
    return _model(nodes, inits, shape=(1, 3, 9, 9))


def _graph(model):
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    return graph_from_model(model, 17, {"x": shape})


def _ort(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _run_converted(graph, x, tmp_path):
    """The graph converted to MindSpore code and run in PyNative mode (as the pipeline does)."""
    from torch2ms.codegen.convert import convert_graph
    from torch2ms.runtime import msutil

    net = convert_graph(graph, "Network", "model.onnx", "0" * 64, "ascend")
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "network.py").write_text(net.source)
    ms.save_checkpoint(
        [{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()], str(tmp_path / "network.ckpt")
    )
    cell = msutil.build_network(tmp_path, "ascend")
    return msutil.run_cell(cell, [{"x": x}], ["y"])[0]["y"], net.source


@pytest.mark.parametrize(
    "exponent,ops",
    [
        (2.0, ["Mul"]),
        (3.0, ["Mul", "Mul"]),
        (4.0, ["Mul", "Mul"]),
        (0.5, ["Sqrt"]),
        (-1.0, ["Reciprocal"]),
        (-0.5, ["Sqrt", "Reciprocal"]),
        (2.5, ["Mul", "Sqrt", "Mul"]),
        (-2.0, ["Mul", "Reciprocal"]),
    ],
)
def test_pow_to_mul_fires_and_keeps_numbers(exponent, ops, tmp_path):
    model = pow_model(exponent)
    g = _graph(model)
    assert PowToMul().apply(g) == 1
    assert [n.op_type for n in g.nodes] == ops
    x = RNG.uniform(0.2, 3.0, (1, 3, 8, 8)).astype(np.float32)
    got, source = _run_converted(g, x, tmp_path)
    assert "ops.pow" not in source and "**" not in source
    ref = _ort(model, x)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=0)


@pytest.mark.parametrize(
    "model,reason",
    [
        (lambda: pow_model(0.3), "exponent 0.3 has no Mul/Sqrt/Reciprocal form"),
        (lambda: pow_model(0, per_element=True), "the exponent differs per element"),
        (lambda: pow_model(40.0), "exponent 40 has no Mul/Sqrt/Reciprocal form"),
    ],
)
def test_pow_to_mul_must_not_fire(model, reason):
    g = _graph(model())
    p = PowToMul()
    assert p.apply(g) == 0
    assert [n.op_type for n in g.nodes] == ["Pow"]
    assert p.skipped == [("/head/Pow", reason)]


def test_pow_to_mul_must_not_fire_on_a_runtime_exponent():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(
        helper.make_graph([helper.make_node("Pow", ["x", "x"], ["y"], name="/p/Pow")], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    g = graph_from_model(model, 17, {"x": (1, 4)})
    p = PowToMul()
    assert p.apply(g) == 0 and p.skipped == [("/p/Pow", "the exponent is not a constant")]


def test_maxpool_pad_rewrite_moves_the_stem_to_ai_core_and_keeps_numbers(tmp_path):
    model = stem_model()
    g = _graph(model)
    run_passes(g, fold_passes())
    before = summary(place_graph(g))
    assert [(o["op"], o["placement"]) for o in before["off_ai_core"]] == [("MaxPool3DWithArgmax", AI_CPU)]
    assert before["off_ai_core"][0]["where"] == ["stem.pool"]
    x = RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)
    unrewritten, _ = _run_converted(copy.deepcopy(g), x, tmp_path / "before")
    assert MaxPoolPadToPad().apply(g) == 1
    assert [n.op_type for n in g.nodes][-2:] == ["Pad", "MaxPool"]
    after = summary(place_graph(g))
    assert after["off_ai_core"] == [] and after["counts"][AI_CORE] == before["counts"][AI_CORE] + 2
    got, source = _run_converted(g, x, tmp_path / "after")
    pools = [line for line in source.splitlines() if "nn.MaxPool2d(" in line]
    assert 'value=float("-inf")' in source and pools and not any("pad_mode" in line for line in pools)
    np.testing.assert_array_equal(got, unrewritten)  # a max ignores -inf padding: bit-identical
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-5, atol=1e-6)  # the conv rounds differently


def pool_model(kernel, stride, pads, ceil_mode, size, dilation=1):
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], name="/pool/MaxPool", kernel_shape=[kernel] * 2, strides=[stride] * 2,
        pads=[pads] * 4, ceil_mode=ceil_mode, dilations=[dilation] * 2,
    )  # fmt: skip
    return _model([node], [], shape=(1, 3, size, size))


@pytest.mark.parametrize(
    "kernel,stride,pads,size,ops",
    [
        (3, 2, 0, 8, ["Pad", "MaxPool"]),  # SqueezeNet's pools: ceil mode adds a 4th window over 1 end pad
        (3, 2, 1, 10, ["Pad", "MaxPool"]),  # padded and ceil: end pad 2
        (3, 1, 1, 7, ["Pad", "MaxPool"]),  # GoogLeNet's branch pools: ceil mode changes nothing at stride 1
        (2, 2, 0, 8, ["MaxPool"]),  # no overhang: ceil_mode is dropped, nothing padded
    ],
)
def test_maxpool_ceil_mode_becomes_end_padding_and_keeps_numbers(kernel, stride, pads, size, ops, tmp_path):
    model = pool_model(kernel, stride, pads, 1, size)
    g = _graph(model)
    before = summary(place_graph(g))
    assert [(o["op"], o["placement"]) for o in before["off_ai_core"]] == [("MaxPool3DWithArgmax", AI_CPU)]
    x = RNG.standard_normal((1, 3, size, size)).astype(np.float32)
    unrewritten, _ = _run_converted(copy.deepcopy(g), x, tmp_path / "before")
    assert MaxPoolPadToPad().apply(g) == 1
    assert [n.op_type for n in g.nodes] == ops
    assert "ceil_mode" not in g.nodes[-1].attrs and "pads" not in g.nodes[-1].attrs
    assert summary(place_graph(g))["off_ai_core"] == []
    got, _ = _run_converted(g, x, tmp_path / "after")
    np.testing.assert_array_equal(got, unrewritten)
    np.testing.assert_array_equal(got, _ort(model, x))


def test_maxpool_pad_rewrite_must_not_fire_on_a_dilated_window():
    g = _graph(pool_model(3, 2, 1, 1, 11, dilation=2))
    p = MaxPoolPadToPad()
    assert p.apply(g) == 0 and p.skipped == [("/pool/MaxPool", "dilated window")]


def test_maxpool_pad_rewrite_must_not_fire_on_an_unpadded_floor_pool():
    g = _graph(pool_model(3, 2, 0, 0, 9))
    p = MaxPoolPadToPad()
    assert p.apply(g) == 0 and p.skipped == []


def test_report_advice_on_the_stem():
    rep = ascend_report(_graph(stem_model()), "fp16")
    assert rep["rewrites"] == {"ascend_maxpool_explicit_pad": 1}
    assert rep["placement"]["off_ai_core"] == []
    (w,) = rep["channels"]["worst"]
    # 3 input channels use the C04 layout (padded to 4), 16 outputs need none: one quarter extra
    assert (w["c_in"], w["c_out"]) == (3, 16) and w["waste_macs"] == 9 * 9 * 9 * 16 * 1
    assert rep["ub_fusion"]["chains"] == {"conv + 1 element-wise": 1}
    assert rep["ub_fusion"]["breaks"][0]["reason"] == "conv: followed by PadV3D, not element-wise"


def test_resize_alignment_rule():
    assert advice._aligned(176, 351) and not advice._aligned(175, 350)
    assert advice._nearest_aligned(175, 351) == 176
    assert advice._aligned(1, 32)  # from one pixel: a broadcast


def test_check_target_prints_placement_advice_and_ai_cpu_list(tmp_path, capsys, wide_console):
    path = tmp_path / "stem.onnx"
    onnx.save(stem_model(), path)
    assert run_cli("check", str(path), "--target", "ascend310") == 0
    out = capsys.readouterr().out
    assert "Placement on the Ascend310 (fp16)" in out and "nothing was run on a board" in out
    assert "rewritten for AI Core: ascend_maxpool_explicit_pad x1" in out
    assert "No op off AI Core." in out
    assert "Channel padding: 1 of 1 convolutions" in out and "stem.conv: 3 -> 16 channels" in out
    assert "UB fusion chains: conv + 1 element-wise x1" in out
    assert run_cli("check", str(path), "--target", "ascend999") == EXIT_USAGE
    assert "ascend310" in capsys.readouterr().err


def test_render_names_every_ai_cpu_op_with_its_module_and_reason():
    g = _graph(stem_model())
    rep = ascend_report(g, "fp16", rewrites=False)
    text = "\n".join(render(rep))
    assert "AI CPU      MaxPool3DWithArgmax x1 [float16] (nn.MaxPool2d): no AI Core kernel for the 310" in text
    assert "at stem.pool" in text
    assert not [o for info in place_graph(g) for o in info.ops if o.where.placement == UNKNOWN]


def hard_model(kind: str, alpha: float = 1 / 6):
    """Conv -> BN -> HardSwish (fused into one Conv2dBnAct), or a lone HardSigmoid(alpha, 0.5)."""
    if kind == "HardSwish":
        import sys

        sys.path.insert(0, str(Path(__file__).parents[1]))
        from passes.graphs import conv_bn_model

        return conv_bn_model("HardSwish")
    node = helper.make_node("HardSigmoid", ["x"], ["y"], name="/gate/HardSigmoid", alpha=alpha, beta=0.5)
    return _model([node], [])


@pytest.mark.parametrize("kind", ["HardSwish", "HardSigmoid"])
def test_hard_activations_expand_to_ai_core_ops_and_keep_numbers(kind, tmp_path):
    model = hard_model(kind)
    g = _graph(model)
    run_passes(g, fold_passes())
    before = summary(place_graph(g))
    assert [(o["op"], o["placement"]) for o in before["off_ai_core"]] == [(kind, UNSUPPORTED)]
    assert ExpandHardActivations().apply(g) == 1
    after = summary(place_graph(g))
    assert after["off_ai_core"] == []
    ops = [n.op_type for n in g.nodes]
    assert ops[-4:] == ["Mul", "Add", "Clip", "Mul"] if kind == "HardSwish" else ops == ["Mul", "Add", "Clip"]
    if kind == "HardSwish":  # the fused cell keeps conv + BN, without its activation
        conv = next(n for n in g.nodes if n.op_type == "ConvBnAct")
        assert conv.attrs["activation"] == ""
    x = RNG.uniform(-5, 5, (1, 3, 8, 8)).astype(np.float32)
    got, source = _run_converted(g, x, tmp_path)
    assert "hswish" not in source and "hardswish" not in source and "hardsigmoid" not in source
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-5, atol=1e-6)


def test_hard_activation_expansion_must_not_fire_on_other_activations():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from passes.graphs import conv_bn_model

    g = _graph(conv_bn_model("Relu"))
    run_passes(g, fold_passes())
    p = ExpandHardActivations()
    assert p.apply(g) == 0 and p.skipped == []
    assert next(n for n in g.nodes if n.op_type == "ConvBnAct").attrs["activation"] == "Relu"
    g = _graph(hard_model("HardSigmoid", alpha=0.2))  # its converter writes Clip(0.2 x + 0.5) already
    assert p.apply(g) == 0
    assert p.skipped == [("/gate/HardSigmoid", "HardSigmoid(alpha=0.2, beta=0.5) is written as its formula already")]


def test_bundle_compatibility_section_places_the_deployed_network(tmp_path):
    from torch2ms.ascend.report import markdown
    from torch2ms.bundle import compat

    path = tmp_path / "stem.onnx"
    onnx.save(stem_model(), path)
    kept = compat.ascend_placement(path, {"x": (1, 3, 9, 9)}, "fp16", True, False, "Ascend310B4")
    assert kept["target_soc"] == "Ascend310B4"
    (warning,) = compat.placement_warnings(kept)
    assert warning.startswith("[slow] MaxPool3DWithArgmax x1 runs on AI CPU (nn.MaxPool2d; first at stem.pool)")
    text = "\n".join(markdown(kept))
    assert "## Op placement on the Ascend310 (fp16)" in text and "| AI CPU | MaxPool3DWithArgmax | 1 |" in text
    rewritten = compat.ascend_placement(path, {"x": (1, 3, 9, 9)}, "fp16", True, True, "Ascend310")
    assert compat.placement_warnings(rewritten) == [] and rewritten["rewrites"] == {"ascend_maxpool_explicit_pad": 1}


def norm_model(op: str, opset: int = 17, runtime_scale: bool = False):
    """A lone InstanceNormalization, or GroupNormalization (opset 18: scale and bias per group)."""
    c, groups = 6, 3
    n_params = groups if op == "GroupNormalization" else c
    inits = [_const("b", RNG.standard_normal(n_params))]
    inputs = ["x", "s", "b"]
    if not runtime_scale:
        inits.append(_const("s", RNG.uniform(0.5, 1.5, n_params)))
    attrs = {"epsilon": 1e-3} | ({"num_groups": groups} if op == "GroupNormalization" else {})
    node = helper.make_node(op, inputs, ["y"], name=f"/norm/{op}", **attrs)
    model = _model([node], inits, shape=(2, c, 4, 5), opset=opset)
    if runtime_scale:
        model.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [n_params]))
    return model


@pytest.mark.parametrize("op,opset", [("InstanceNormalization", 17), ("GroupNormalization", 18)])
def test_group_norm_expands_to_ai_core_ops_and_keeps_numbers(op, opset, tmp_path):
    model = norm_model(op, opset)
    g = graph_from_model(model, opset, {"x": (2, 6, 4, 5)})
    assert [(o["op"], o["placement"]) for o in summary(place_graph(g))["off_ai_core"]] == [("GroupNorm", UNSUPPORTED)]
    assert ExpandGroupNorm().apply(g) == 1
    assert summary(place_graph(g))["off_ai_core"] == []
    assert [n.op_type for n in g.nodes].count("ReduceMean") == 2
    x = RNG.standard_normal((2, 6, 4, 5)).astype(np.float32) * 3 + 1
    got, source = _run_converted(g, x, tmp_path)
    assert "nn.GroupNorm" not in source
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-5, atol=2e-5)


def test_group_norm_expansion_must_not_fire_on_a_runtime_scale():
    g = graph_from_model(norm_model("InstanceNormalization", runtime_scale=True), 17, {"x": (2, 6, 4, 5), "s": (6,)})
    p = ExpandGroupNorm()
    assert p.apply(g) == 0 and p.skipped == [("/norm/InstanceNormalization", "scale or bias is not a constant")]


def mirror_pad_model(mode: str, pads, shape=(1, 3, 6, 7)):
    """A lone Pad (reflect or edge), pads given as ONNX lists them (all begins, then all ends)."""
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="/aa/Pad", mode=mode)
    return _model([node], inits, shape=shape)


@pytest.mark.parametrize(
    "mode,pads,slices",
    [
        ("reflect", [0, 0, 1, 1, 0, 0, 1, 1], 4),  # TResNet's BlurPool: 1 on each side of H and W
        ("reflect", [0, 0, 2, 0, 0, 0, 1, 3], 6),
        ("edge", [0, 0, 1, 2, 0, 0, 2, 1], 6),
    ],
)
def test_mirror_pad_becomes_slices_and_concat_on_ai_core_and_keeps_numbers(mode, pads, slices, tmp_path):
    model = mirror_pad_model(mode, pads)
    g = _graph(model)
    before = summary(place_graph(g))
    assert [(o["op"], o["placement"]) for o in before["off_ai_core"]] == [
        ("MirrorPad" if mode == "reflect" else "PadV3", AI_CPU)
    ]
    assert MirrorPadToConcat().apply(g) == 1
    ops = [n.op_type for n in g.nodes]
    assert ops.count("Slice") == slices and ops.count("Concat") == 2 and "Pad" not in ops
    assert summary(place_graph(g))["off_ai_core"] == []
    x = RNG.standard_normal((1, 3, 6, 7)).astype(np.float32)
    got, source = _run_converted(g, x, tmp_path)
    assert "ops.pad" not in source
    np.testing.assert_array_equal(got, _ort(model, x))  # data movement only: exact


@pytest.mark.parametrize(
    "mode,pads,reason",
    [
        ("reflect", [0, 0, 0, 9, 0, 0, 0, 9], "pad 9 wider than 8"),
        ("edge", [0, 0, 12, 0, 0, 0, 0, 0], "pad 12 wider than 8"),
        ("edge", [0, 0, -1, 0, 0, 0, 1, 0], "negative pads (a crop)"),
    ],
)
def test_mirror_pad_rewrite_must_not_fire(mode, pads, reason):
    g = _graph(mirror_pad_model(mode, pads, shape=(1, 3, 6, 20)))
    p = MirrorPadToConcat()
    assert p.apply(g) == 0 and p.skipped == [("/aa/Pad", reason)]
    assert [n.op_type for n in g.nodes] == ["Pad"]


def test_mirror_pad_rewrite_leaves_constant_pads_alone():
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    g = _graph(_model([helper.make_node("Pad", ["x", "pads"], ["y"], name="/p/Pad", mode="constant")], inits))
    p = MirrorPadToConcat()
    assert p.apply(g) == 0 and p.skipped == []
