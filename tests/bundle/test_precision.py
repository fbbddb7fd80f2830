"""The fp16 plan: per-layer sensitivity, the fewest layers kept in fp32, the files for the board.

The models put one fp16-fragile spot between ordinary layers (``tiny_models.fp16_fragile``: a
cancellation ``(y + 1000) - 1000``, or a conv whose outputs overflow fp16). The plan must find
exactly the two nodes of that spot, and the emulated error with it must meet the recipe's bound.
The emulation itself is checked against true fp16 execution (PyTorch ``.half()`` on CPU), and
against its own negative control (no rounding at all)."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
from conftest import run_cli, write_recipe

from torch2ms.bundle import fp16
from torch2ms.bundle.emulate import Fp16Emulator
from torch2ms.bundle.fp16_truth import true_fp16
from torch2ms.compare import compare_arrays
from torch2ms.errors import RecipeError
from torch2ms.pipeline.workspace import load_npz, split_reference
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

SPOT = {"cancel": {"/Add", "/Sub"}, "overflow": {"/big/Conv", "/Mul"}}


def fragile_recipe(folder, kind: str = "cancel", **extra):
    path = write_recipe(
        folder / f"{kind}.yaml",
        name=f"fragile_{kind}",
        model={"factory": "tiny_models:fp16_fragile", "kwargs": {"kind": kind}, "seed": 0},
        inputs=[{"name": "input", "shape": [1, 3, 16, 16]}],
        **extra,
    )
    return path


@pytest.fixture(scope="module", params=["cancel", "overflow"])
def exported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    recipe = load_recipe(fragile_recipe(folder, request.param))
    result = pipeline_runner(recipe, log=lambda m: None).run(until="export")
    assert result.stages[0].status == "passed", result.stages[0].reason
    onnx_path, ref_path = result.root / "export" / "model.onnx", result.root / "export" / "reference.npz"
    inputs, reference = split_reference(load_npz(ref_path))
    return request.param, recipe, onnx_path, inputs, reference


def worst_error(outputs, reference) -> float:
    m = compare_arrays("output", np.stack([o["output"] for o in outputs]), np.stack([r["output"] for r in reference]))
    return np.inf if m.nonfinite else m.rel_error


def test_plan_keeps_exactly_the_fragile_spot(exported):
    kind, recipe, onnx_path, inputs, reference = exported
    bound = recipe.precision.fp16_rel_error
    plan = fp16.make_plan(recipe, onnx_path, inputs, reference, log=lambda m: None)
    assert {k["label"] for k in plan["keep_fp32"]} == SPOT[kind]
    assert {s["label"] for s in plan["sensitivity"][:2]} == SPOT[kind]  # the two most sensitive layers
    assert not plan["before"]["ok"] and plan["after"]["ok"]
    # re-emulate independently: the plan meets the bound, and neither kept node alone is enough
    emu = Fp16Emulator(onnx_path, inputs, ["output"])
    index = {label: i for i, label in enumerate(emu.labels)}
    spot = [index[label] for label in SPOT[kind]]
    assert worst_error(emu.run(), reference) > bound
    assert worst_error(emu.run(fp32=spot), reference) <= bound
    for i in spot:
        assert worst_error(emu.run(fp32=[i]), reference) > bound
    assert worst_error(emu.run(fp32=range(len(emu.labels))), reference) < 1e-5  # all fp32: onnxruntime itself
    if kind == "overflow":
        assert plan["before"]["error"] == "inf"
        assert fp16.mixlist(plan) == {"black-list": {"to-add": ["Conv2D"]}}  # Mul has no verified IR type
    assert fp16.keep_dtype_text(plan).splitlines() == [k["name"] for k in plan["keep_fp32"]]


def test_a_bound_all_fp16_meets_needs_no_sensitivity(exported):
    kind, recipe, onnx_path, inputs, reference = exported
    emu = Fp16Emulator(onnx_path, inputs, ["output"])
    all_fp16 = worst_error(emu.run(), reference)
    if not np.isfinite(all_fp16):
        pytest.skip("fp16 overflows: no bound is met with every layer in fp16")
    loose = recipe.model_copy(
        update={"precision": recipe.precision.model_copy(update={"fp16_rel_error": 2 * all_fp16})}
    )
    plan = fp16.make_plan(loose, onnx_path, inputs, reference, log=lambda m: None, emulator=emu)
    assert plan["before"]["ok"] and plan["keep_fp32"] == [] and plan["sensitivity"] == []
    assert emu.runs == 2  # this test's run and the plan's all-fp16 one, not one per layer
    assert "Not measured" in fp16.plan_markdown(plan, "m")


def test_emulation_agrees_with_true_fp16_pytorch(exported):
    """PyTorch's CPU fp16 kernels store every tensor in fp16 and accumulate in fp32, which is what
    the emulation models: the error they cause must be the emulation's, and the emulated outputs
    much closer to them than to fp32. Without rounding (the negative control) the same check fails."""
    kind, recipe, onnx_path, inputs, reference = exported
    emu = Fp16Emulator(onnx_path, inputs, ["output"])
    truth = true_fp16(recipe, inputs, reference, emu.run())["pytorch"]["outputs"]["output"]
    if kind == "overflow":
        assert truth["true_rel_error"] == truth["emulated_rel_error"] == "nan"  # both overflow
        return
    true_err, emu_err = truth["true_rel_error"], truth["emulated_rel_error"]
    assert 0.5 <= emu_err / true_err <= 2.0, truth
    assert truth["emulated_vs_true"] <= 0.25 * true_err, truth
    control = true_fp16(recipe, inputs, reference, emu.run(fp32=range(len(emu.labels))))
    assert control["pytorch"]["outputs"]["output"]["emulated_vs_true"] > 0.5 * true_err


def test_a_bound_below_float32_noise_is_refused(exported, tmp_path):
    _, recipe, onnx_path, inputs, reference = exported
    tight = recipe.model_copy(update={"precision": recipe.precision.model_copy(update={"fp16_rel_error": 1e-12})})
    with pytest.raises(RecipeError, match=r"precision\.fp16_rel_error: even with every layer in fp32"):
        fp16.make_plan(tight, onnx_path, inputs, reference, log=lambda m: None)


@pytest.mark.parametrize(
    "value, words",
    [
        ({"fp16_rel_error": 0}, "precision.fp16_rel_error: Input should be greater than 0"),
        ({"fp16_rel_error": "tight"}, "precision.fp16_rel_error: Input should be a valid number"),
        ({"fp16_rel_eror": 0.01}, "precision.fp16_rel_eror: unknown key; did you mean 'fp16_rel_error'?"),
    ],
)
def test_bad_precision_field_names_it(tmp_path, value, words):
    path = fragile_recipe(tmp_path, precision=value)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert words in str(err.value)


def test_precision_command_prints_and_writes_the_plan(tmp_path, capsys, wide_console):
    recipe = fragile_recipe(tmp_path, "cancel")
    assert run_cli("precision", "--recipe", str(recipe), "--out", str(tmp_path / "plan"), "--true-fp16") == 0
    out = capsys.readouterr().out
    assert "with the plan     2 layer(s) in fp32" in out and "keep fp32: /Add (Add)" in out
    files = {p.name for p in (tmp_path / "plan").iterdir()}
    # Add/Sub have no verified Ascend IR type: no modify_mixlist.json
    assert files == {"plan.json", "precision.md", "keep_dtype.cfg", "converter_lite.cfg", "true_fp16.json"}
    truth = json.loads((tmp_path / "plan" / "true_fp16.json").read_text())
    for engine in ("pytorch", "mindspore"):  # the generated MindSpore network with fp16 parameters too
        m = truth[engine]["outputs"]["output"]
        assert 0.5 <= m["emulated_rel_error"] / m["true_rel_error"] <= 2.0, (engine, m)
    assert "## The emulation against true fp16 execution here" in (tmp_path / "plan" / "precision.md").read_text()
    assert (tmp_path / "plan" / "keep_dtype.cfg").read_text() in ("/Add\n/Sub\n", "/Sub\n/Add\n")
    md = (tmp_path / "plan" / "precision.md").read_text()
    assert "| `/Add` | Add |" in md and "only `keep_dtype.cfg` (ATC) keeps them" in md


def test_bundle_carries_the_plan(tmp_path):
    from torch2ms.bundle.build import build_bundle

    recipe = load_recipe(fragile_recipe(tmp_path, "overflow"))
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", log=lambda m: None)
    tdir = "targets/atlas-200i-dk-a2"
    with tarfile.open(bundle.path) as tar:
        texts = [m for m in tar if m.name.endswith((".cfg", ".json", ".md", ".sh"))]
        read = {m.name: tar.extractfile(m).read().decode() for m in texts}
    assert sorted(read[f"{tdir}/keep_dtype.cfg"].splitlines()) == sorted(SPOT["overflow"])
    assert json.loads(read[f"{tdir}/modify_mixlist.json"]) == {"black-list": {"to-add": ["Conv2D"]}}
    assert '--keep_dtype="$HERE/keep_dtype.cfg"' in read[f"{tdir}/atc.sh"]
    cfg = read[f"{tdir}/converter_lite.cfg"]
    assert (
        "precision_mode=preferred_optimal" in cfg
        and "[acl_build_options]\nge.exec.modify_mixlist=modify_mixlist.json" in cfg
    )
    assert "| all fp16 | 0 | inf |" in read["precision.md"]
    plan = json.loads(read["precision.json"])
    assert plan["after"]["ok"] and float(plan["after"]["error"]) <= recipe.precision.fp16_rel_error
    assert sorted(bundle.manifest["fp16_plan"]["keep_fp32"]) == sorted(SPOT["overflow"])


def r16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("fp32", [(), ("mul",), ("add",), ("mul", "add")])
def test_emulator_rounds_exactly_the_fp16_nodes(tmp_path, fp32):
    """y = x * w + b as two ONNX nodes; each choice of fp32 nodes against the same rounding in numpy:
    a node in fp16 rounds its inputs (the weights too) and its output, a node in fp32 neither."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.normal(0, 3, (4, 5)).astype(np.float32), rng.normal(0, 3, (4, 5)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
            helper.make_node("Add", ["m", "b"], ["y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    path = tmp_path / "mul_add.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.normal(0, 3, (4, 5)).astype(np.float32)
    emu = Fp16Emulator(path, [{"x": x}], ["y"])
    assert emu.labels == ["mul", "add"] and emu.op_types == ["Mul", "Add"]
    got = emu.run(fp32=[emu.labels.index(n) for n in fp32])[0]["y"]
    m = x * w if "mul" in fp32 else r16(r16(x) * r16(w))
    want = m + b if "add" in fp32 else r16(r16(m) + r16(b))
    np.testing.assert_array_equal(got, want)


def test_samples_emulated_side_by_side_give_each_samples_own_bits(exported):
    """The emulator runs its samples in parallel threads (one per core): each sample's outputs
    must be bit for bit those of a run of that sample alone, and in the samples' order."""
    _, recipe, onnx_path, inputs, _ = exported
    samples = [*inputs, *[{k: v * (2.0 + i) for k, v in s.items()} for i, s in enumerate(inputs)]]
    together = Fp16Emulator(onnx_path, samples, ["output"]).run(fp32=[0])
    assert len(together) == len(samples) >= 2
    for sample, got in zip(samples, together, strict=True):
        alone = Fp16Emulator(onnx_path, [sample], ["output"]).run(fp32=[0])[0]
        np.testing.assert_array_equal(got["output"], alone["output"])
    assert not np.array_equal(together[0]["output"], together[1]["output"])
