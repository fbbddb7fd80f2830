"""The INT8 plan (``bundle/int8.py``, ``bundle/emulate.py``).

* the quantization math against exact references: QuantizeLinear -> DequantizeLinear in onnxruntime
  against numpy to the bit, and a whole int8 Conv against ``converters/exact.py``'s integer oracle
  (int64 accumulation), per channel and per tensor;
* calibration: minmax keeps an outlier, percentile and entropy clip it;
* a model with one INT8-sensitive layer (``int8_models.int8_sensitive``: a 1e4 activation among
  ~1 ones): the plan keeps exactly it in float, meets the gate, and all-INT8 does not;
* bad calibration data is named with exit 2 and nothing written; INT8 with a dynamic batch packaged;
* the bundle carries AMCT's and converter_lite's configs and the calibration set, and verifies;
* the plan is the same on an AVX2-only CPU (``qemu-x86_64 -cpu Haswell``) as here (slow);
* the generated MindSpore network with the plan's weights quantized-dequantized and activations
  fake-quantized agrees with the emulation within one step (slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import REPO, run_cli, write_recipe
from converters.exact import conv_integer
from onnx import TensorProto, helper, numpy_helper

from torch2ms.bundle import int8
from torch2ms.bundle.build import build_bundle
from torch2ms.bundle.emulate_int8 import (
    Calibrator,
    Int8Emulator,
    activation_qparams,
    fake_quant_activation,
    fake_quant_weight,
    weight_scales,
)
from torch2ms.bundle.verify import verify_bundle
from torch2ms.pipeline.workspace import load_npz, split_reference
from torch2ms.recipe import load_recipe
from torch2ms.stages import pipeline_runner

SENSITIVE = "/conv_mid/Conv"


def conv_model(tmp_path: Path, w: np.ndarray, b: np.ndarray, shape) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_qdq_in_onnxruntime_is_the_numpy_formula_to_the_bit(tmp_path):
    """Values on exact half steps too (round half to even), and beyond the range (saturation)."""
    import onnxruntime as ort

    scale, zero = activation_qparams(-1.5, 6.0)
    rng = np.random.default_rng(0)
    halves = (np.arange(-300, 300) + 0.5).astype(np.float32) * scale
    x = np.concatenate([rng.uniform(-3, 9, 4000).astype(np.float32), halves]).reshape(1, -1)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(np.asarray(scale), "s"), numpy_helper.from_array(np.asarray(zero), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], fake_quant_activation(x, scale, zero))
    assert np.unique(fake_quant_activation(x, scale, zero)).size <= 256


def test_weights_are_symmetric_per_channel():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (5, 3, 3, 3)).astype(np.float32)
    w[2] = 0
    w[3] *= 100
    s = weight_scales(w, 0)
    assert s.shape == (5,) and s[2] == 1.0
    np.testing.assert_allclose(s[[0, 1, 3, 4]], np.abs(w[[0, 1, 3, 4]]).reshape(4, -1).max(1) / 127, rtol=1e-6)
    q = fake_quant_weight(w, 0)
    np.testing.assert_array_equal(fake_quant_weight(-w, 0), -q)  # symmetric: -w quantizes to -q
    assert np.abs(q - w).reshape(5, -1).max(1)[0] <= s[0] / 2 + 1e-7
    # per tensor, channel 3's large values make the others coarse: per channel is much closer
    per_tensor = fake_quant_weight(w, None)
    assert np.abs(per_tensor - w)[0].max() > 10 * np.abs(q - w)[0].max()


@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_conv_against_the_exact_integer_oracle(tmp_path, per_channel):
    """Emulated int8 Conv = (exact int64 conv of the int8 activations and weights) x scales + bias,
    within float32 accumulation; the float run (the negative control) is far from it."""
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.3, (6, 4, 3, 3)).astype(np.float32)
    w[1] *= 20  # a wide channel
    b = rng.normal(0, 0.1, 6).astype(np.float32)
    x = rng.uniform(-1, 3, (1, 4, 9, 9)).astype(np.float32)
    path = conv_model(tmp_path, w, b, list(x.shape))
    lo, hi = float(x.min()), float(x.max())
    emu = Int8Emulator(path, [{"x": x}], ["y"], {"x": (lo, hi)}, per_channel=per_channel)
    assert emu.labels == ["conv"] and emu.macs == [6 * 9 * 9 * 4 * 9]
    got = emu.run()[0]["y"].astype(np.float64)

    s, z = activation_qparams(lo, hi)
    qx = np.clip(np.rint(x / s) + z, -128, 127).astype(np.int8)
    sw = weight_scales(w, 0 if per_channel else None)
    qw = np.clip(np.rint(w / (sw.reshape(-1, 1, 1, 1) if per_channel else sw)), -127, 127).astype(np.int8)
    acc = conv_integer(qx, qw, np.int8(z), None, pads=[1, 1, 1, 1]).astype(np.float64)
    want = acc * float(s) * (sw.astype(np.float64).reshape(1, -1, 1, 1) if per_channel else float(sw))
    want += b.reshape(1, -1, 1, 1)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale
    floating = emu.run(int8=[])[0]["y"]
    assert np.abs(floating - want).max() > 1e-3 * scale


def test_calibration_methods_clip_an_outlier(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.3, (2, 4, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path, w, np.zeros(2, np.float32), [1, 4, 16, 16])
    samples = [{"x": rng.normal(0, 1, (1, 4, 16, 16)).astype(np.float32)} for _ in range(8)]
    samples[3]["x"][0, 0, 0, 0] = 500.0  # 1 value in 8192: above the 99.9th percentile
    cal = Calibrator(path, ["x"])
    cal.observe(samples, histograms=True)
    hi = {m: cal.ranges(m, percentile=99.9)["x"][1] for m in ("minmax", "percentile", "entropy")}
    assert hi["minmax"] == 500.0
    assert 2.0 < hi["percentile"] < 50 and 2.0 < hi["entropy"] < 50, hi


# --- the plan on a model with one INT8-sensitive layer ------------------------------------------


def sensitive_recipe(folder: Path, **extra) -> Path:
    rng = np.random.default_rng(5)
    np.save(folder / "calib.npy", rng.standard_normal((8 * 4, 3, 16, 16)).astype(np.float32))
    data = {
        "name": "sensitive",
        "model": {"factory": "int8_models:int8_sensitive", "seed": 0},
        "inputs": [{"name": "input", "shape": [4, 3, 16, 16]}],
        "check": {"samples": 4},
        "quantize": {"calibration": "calib.npy", "samples": 8},
        "precision": {"int8_task_agreement": 0.9, "int8_rel_error": 1.0},  # the task gate decides
    }
    data.update(extra)
    return write_recipe(folder / "sensitive.yaml", **data)


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sensitive")
    recipe = load_recipe(sensitive_recipe(folder))
    result = pipeline_runner(recipe, log=lambda m: None).run(until="export")
    assert result.stages[0].status == "passed", result.stages[0].reason
    onnx_path, ref_path = result.root / "export" / "model.onnx", result.root / "export" / "reference.npz"
    inputs, reference = split_reference(load_npz(ref_path))
    calib, _ = int8.calibration_samples(recipe, log=lambda m: None)
    return recipe, onnx_path, inputs, reference, calib


def test_plan_keeps_the_sensitive_layer_in_float(sensitive):
    recipe, onnx_path, inputs, reference, calib = sensitive
    plan = int8.make_plan(recipe, onnx_path, inputs, reference, calib, log=lambda m: None)
    assert [k["label"] for k in plan["keep_float"]] == [SENSITIVE]
    assert not plan["before"]["ok"] and plan["after"]["ok"]
    assert plan["before"]["task"]["agreement"] < 0.9 <= plan["after"]["task"]["agreement"]
    assert plan["float"]["task"]["agreement"] == 1.0
    # re-emulated independently: all INT8 misses the gate, the plan meets it, conv_mid alone breaks it
    ranges = int8.calibrate(recipe, onnx_path, calib)
    emu = Int8Emulator(onnx_path, inputs, ["output"], ranges)
    mid = emu.labels.index(SENSITIVE)
    others = [i for i in range(len(emu.labels)) if i != mid]
    assert not int8.judge(recipe, emu.run(), reference)["ok"]
    assert int8.judge(recipe, emu.run(int8=others), reference)["ok"]
    assert not int8.judge(recipe, emu.run(int8=[mid]), reference)["ok"]
    # MACs from the shapes: conv_mid is 16 x 8 x 8 outputs x 8 x 3 x 3 per image, 4 images
    assert emu.macs[mid] == 4 * 16 * 8 * 8 * 8 * 9
    assert plan["mac_share_int8"] == pytest.approx(sum(emu.macs[i] for i in others) / sum(emu.macs), abs=1e-4)
    slow = int8.make_plan(recipe, onnx_path, inputs, reference, calib, log=lambda m: None, exhaustive=True)
    assert [k["label"] for k in slow["keep_float"]] == [SENSITIVE]
    md = int8.plan_markdown(plan, "sensitive")
    assert "| all INT8 | 3 / 3 | 100.0% |" in md and f"- `{SENSITIVE}` (Conv" in md


def test_the_plan_is_the_same_every_time(sensitive):
    recipe, onnx_path, inputs, reference, calib = sensitive
    plans = [int8.make_plan(recipe, onnx_path, inputs, reference, calib, log=lambda m: None) for _ in range(2)]
    for p in plans:
        p.pop("seconds")
    assert plans[0] == plans[1]


def test_amct_config_skips_the_float_layers(sensitive):
    recipe, onnx_path, inputs, reference, calib = sensitive
    plan = int8.make_plan(recipe, onnx_path, inputs, reference, calib, log=lambda m: None)
    cfg = int8.amct_config(plan, len(calib))
    assert f'skip_layers: "{SENSITIVE}"' in cfg.splitlines() and "batch_num: 8" in cfg
    assert "activation_offset: true" in cfg and "channel_wise: true" in cfg
    sections = int8.converter_lite_sections(plan, "input", len(calib))
    assert sections["common_quant_param"] == {"quant_type": "FULL_QUANT", "bit_num": "8"}
    assert sections["full_quant_param"]["activation_quant_method"] == "MAX_MIN"
    assert sections["data_preprocess_param"]["calibrate_size"] == "8"


def test_precision_int8_command_prints_and_writes_the_plan(tmp_path, capsys, wide_console):
    path = sensitive_recipe(tmp_path)
    assert run_cli("precision", "--recipe", str(path), "--int8", "--out", str(tmp_path / "plan")) == 0
    out = capsys.readouterr().out
    assert "all INT8              3/3 in INT8" in out and f"keep float: {SENSITIVE} (Conv)" in out
    files = {p.name for p in (tmp_path / "plan").iterdir()}
    assert files == {"amct_quant.cfg", "converter_lite_int8.cfg", "precision.md", "int8_plan.json"}
    plan = json.loads((tmp_path / "plan" / "int8_plan.json").read_text())
    assert plan["calibration"]["sources"] == ["calib.npy"] and plan["calibration"]["samples"] == 8
    # the second time the plan comes from the run folder
    assert run_cli("precision", "--recipe", str(path), "--int8") == 0
    assert "int8 plan: up to date" in capsys.readouterr().err


# --- bad input ----------------------------------------------------------------------------------


def _corrupt_png(folder: Path) -> str:
    (folder / "imgs").mkdir()
    (folder / "imgs" / "a.png").write_bytes(b"not a png at all")
    return "imgs"


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda f: "nowhere/", "quantize.calibration: {f}/nowhere: no such file or folder"),
        (lambda f: (f / "empty").mkdir() or "empty", "quantize.calibration: {f}/empty: the folder holds no images"),
        (_corrupt_png, "quantize.calibration: {f}/imgs/a.png is an image, but the input's shape [4, 3, 16, 16]"),
        (
            lambda f: np.save(f / "bad.npy", np.zeros((5, 3, 16, 16), np.float32)) or "bad.npy",
            "quantize.calibration: {f}/bad.npy: shape [5, 3, 16, 16] is neither the input's [4, 3, 16, 16]",
        ),
        (
            lambda f: np.save(f / "nan.npy", np.full((4, 3, 16, 16), np.nan, np.float32)) or "nan.npy",
            "quantize.calibration: {f}/nan.npy: holds NaN or infinite values",
        ),
    ],
)
def test_bad_calibration_data_is_named_and_nothing_written(tmp_path, capsys, wide_console, make, words):
    path = sensitive_recipe(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["quantize"]["calibration"] = make(tmp_path)
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "plan"
    assert run_cli("precision", "--recipe", str(path), "--int8", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert words.format(f=tmp_path) in " ".join(err.split()), err
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_an_unreadable_image_is_named(tmp_path, capsys, wide_console):
    path = sensitive_recipe(tmp_path, inputs=[{"name": "input", "shape": [1, 3, 16, 16]}])
    data = yaml.safe_load(path.read_text())
    data["quantize"]["calibration"] = [_corrupt_png(tmp_path)]
    path.write_text(yaml.safe_dump(data))
    assert run_cli("precision", "--recipe", str(path), "--int8") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"quantize.calibration: {tmp_path}/imgs/a.png: cannot read it as an image" in err, err
    assert not (tmp_path / "runs").exists()


def test_no_quantize_section_is_named(tmp_path, capsys, wide_console):
    path = write_recipe(tmp_path / "r.yaml")
    assert run_cli("precision", "--recipe", str(path), "--int8") == 2
    assert "quantize.calibration: the recipe has no quantize section" in capsys.readouterr().err


def test_package_int8_names_bad_data_before_any_stage_runs(tmp_path, capsys, wide_console):
    path = sensitive_recipe(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["quantize"]["calibration"] = "missing.npy"
    path.write_text(yaml.safe_dump(data))
    dist = tmp_path / "dist"
    assert run_cli("package", "--recipe", str(path), "--precision", "int8", "--out", str(dist)) == 2
    assert f"quantize.calibration: {tmp_path}/missing.npy: no such file or folder" in capsys.readouterr().err
    assert not dist.exists() and not (tmp_path / "runs").exists()


def test_int8_with_a_dynamic_batch_packages_and_verifies_at_every_size(tmp_path):
    """No CANN or AMCT page limits a quantized model's dynamic batch, so INT8 packages with
    inputs[].batch: ATC gets the profiles for AMCT's deploy ONNX, and the MindIR verifies at every size."""
    path = sensitive_recipe(tmp_path, inputs=[{"name": "input", "shape": [1, 3, 16, 16], "batch": [1, 2, 4]}])
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", precision="int8", log=lambda m: None).path
    with tarfile.open(bundle) as tar:
        atc = tar.extractfile("targets/atlas-200i-dk-a2/atc.sh").read().decode()
        names = tar.getnames()
    assert '--dynamic_batch_size="1,2,4"' in atc and "ONNX_MODEL" in atc and '--input_shape="input:-1,3,16,16"' in atc
    assert "targets/atlas-200i-dk-a2/amct_quant.cfg" in names and "calibration/input/0000.bin" in names
    assert sorted(verify_bundle(bundle, log=lambda m: None).batches) == [2, 4]


# --- the bundle ---------------------------------------------------------------------------------


def test_bundle_carries_both_configs_and_the_calibration_set(tmp_path):
    from torch2ms.bundle.build import build_bundle
    from torch2ms.bundle.verify import verify_bundle

    recipe = load_recipe(sensitive_recipe(tmp_path))
    result = pipeline_runner(recipe, log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", precision="int8", log=lambda m: None)
    tdir = "targets/atlas-200i-dk-a2"
    with tarfile.open(bundle.path) as tar:
        names = tar.getnames()
        read = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert f'skip_layers: "{SENSITIVE}"' in read[f"{tdir}/amct_quant.cfg"].decode()
    cfg = read[f"{tdir}/converter_lite_int8.cfg"].decode()
    assert "[full_quant_param]\nactivation_quant_method=MAX_MIN\n" in cfg and "target_device=ASCEND" in cfg
    # all INT8 misses the gate and converter_lite cannot skip a layer: its default config stays fp16
    assert "quant" not in read[f"{tdir}/converter_lite.cfg"].decode()
    assert '--configFile="${CONVERTER_CONFIG:-$HERE/converter_lite.cfg}"' in read[f"{tdir}/converter_lite.sh"].decode()
    assert "calibrate_path=input:../../calibration/input\ncalibrate_size=8\ninput_type=BIN" in cfg
    bins = sorted(n for n in names if n.startswith("calibration/input/"))
    assert len(bins) == 8 and all(len(read[n]) == 4 * 3 * 16 * 16 * 4 for n in bins)
    calib, _ = int8.calibration_samples(recipe, log=lambda m: None)
    np.testing.assert_array_equal(np.frombuffer(read[bins[0]], np.float32).reshape(4, 3, 16, 16), calib[0]["input"])
    plan = json.loads(read["precision.json"])
    assert [k["label"] for k in plan["keep_float"]] == [SENSITIVE] and plan["after"]["ok"]
    assert "| INT8 with the plan | 2 / 3 |" in read["precision.md"].decode()
    assert bundle.manifest["int8_plan"]["keep_float"] == [SENSITIVE]
    assert "ONNX_MODEL" in read[f"{tdir}/atc.sh"].decode()
    assert verify_bundle(bundle.path, log=lambda m: None).files == len(names) - 1


# --- the same plan on an AVX2-only CPU ----------------------------------------------------------

PLAN_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from torch2ms.bundle import int8
from torch2ms.pipeline.workspace import load_npz, split_reference
from torch2ms.recipe import load_recipe
recipe = load_recipe({recipe!r})
inputs, reference = split_reference(load_npz({ref!r}))
calib, _ = int8.calibration_samples(recipe, log=lambda m: None)
plan = int8.make_plan(recipe, {onnx!r}, inputs, reference, calib, log=lambda m: None)
plan.pop("seconds")
print(json.dumps(plan, sort_keys=True))
"""


@pytest.mark.slow
def test_the_plan_is_the_same_on_an_avx2_only_cpu(sensitive, tmp_path):
    """The planner under ``qemu-x86_64 -cpu Haswell`` (AVX2, no AVX-512, no VNNI) and natively."""
    import shutil

    if shutil.which("qemu-x86_64") is None:
        pytest.skip("qemu-x86_64 is not installed")
    recipe, onnx_path, *_ = sensitive
    ref = onnx_path.parent / "reference.npz"
    script = tmp_path / "plan.py"
    recipe_path = Path(recipe.base_dir) / "sensitive.yaml"
    script.write_text(
        PLAN_SCRIPT.format(tests=str(REPO / "tests"), recipe=str(recipe_path), ref=str(ref), onnx=str(onnx_path))
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    runs = {}
    for cpu, argv in (("native", [sys.executable]), ("haswell", ["qemu-x86_64", "-cpu", "Haswell", sys.executable])):
        done = subprocess.run([*argv, str(script)], capture_output=True, text=True, env=env, timeout=1500)
        stderr = [line for line in done.stderr.splitlines() if not line.startswith("qemu-x86_64: warning")]
        assert done.returncode == 0, (cpu, stderr[-20:])
        runs[cpu] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["haswell"] == runs["native"]
    assert [k["label"] for k in runs["native"]["keep_float"]] == [SENSITIVE]


# --- the emulation against MindSpore ------------------------------------------------------------


def _fake_quant_cell(cell, scale: float, zero: int):
    """Wrap ``cell.construct`` so that its input is fake-quantized like QuantizeLinear -> DequantizeLinear."""
    from mindspore import ops

    inner = cell.construct

    def construct(x):
        q = ops.clip_by_value(ops.round(x / scale) + zero, -128.0, 127.0)
        return inner((q - zero) * scale)

    object.__setattr__(cell, "construct", construct)


@pytest.mark.slow
def test_mindspore_with_the_plan_agrees_with_the_emulation_within_one_step(tmp_path):
    """The rebuild stage's generated network (``int8_models.int8_plain``: no BatchNorm, so its weights
    are the ONNX's), with every Cube layer's weight quantized-dequantized per channel and its input
    fake-quantized with the emulation's (scale, zero point), against the emulation with every layer
    in INT8: the outputs differ by less than one activation step at the last layer's input can move
    them (step x the largest row sum of |W|), and much less than INT8 moves them from float."""
    from torch2ms.runtime import msutil

    rng = np.random.default_rng(9)
    np.save(tmp_path / "calib.npy", rng.standard_normal((8, 3, 16, 16)).astype(np.float32))
    path = write_recipe(
        tmp_path / "plain.yaml",
        name="plain",
        model={"factory": "int8_models:int8_plain", "seed": 0},
        inputs=[{"name": "input", "shape": [2, 3, 16, 16]}],
        quantize={"calibration": "calib.npy", "samples": 4},
    )
    recipe = load_recipe(path)
    result = pipeline_runner(recipe, log=lambda m: None).run(until="rebuild")
    assert result.passed or result.stages[1].status == "passed", [(s.stage, s.status) for s in result.stages]
    onnx_path = result.root / "export" / "model.onnx"
    inputs, reference = split_reference(load_npz(result.root / "export" / "reference.npz"))
    calib, _ = int8.calibration_samples(recipe, log=lambda m: None)
    emu = Int8Emulator(onnx_path, inputs, ["output"], int8.calibrate(recipe, onnx_path, calib))
    emulated = emu.run()

    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    plain = msutil.run_cell(msutil.build_network(result.root / "rebuild", "int8float"), inputs, ["output"])
    net = msutil.build_network(result.root / "rebuild", "int8check")
    var = {
        origin: e["var"]
        for e in json.loads((result.root / "rebuild" / "tensor_map.json").read_text())
        for origin in e["origin"]
    }
    for i, name in enumerate(emu.names):
        cell = getattr(net, var[name])
        conv = getattr(cell, "conv", cell)  # Conv2dBnAct holds its nn.Conv2d as .conv
        conv.weight.set_data(ms.Tensor(fake_quant_weight(conv.weight.asnumpy(), emu.axes[i])))
        _fake_quant_cell(cell, *emu.qparams[emu.activations[i][0]])
    got = msutil.run_cell(net, inputs, ["output"])

    last = emu.names.index("/fc/Gemm")
    step = emu.qparams[emu.activations[last][0]][0]
    w_fc = getattr(net, var["/fc/Gemm"]).weight.asnumpy()
    one_step = step * np.abs(w_fc).sum(1).max()
    gap = max(np.abs(g["output"] - e["output"]).max() for g, e in zip(got, emulated))
    int8_error = max(np.abs(e["output"] - r["output"]).max() for e, r in zip(emulated, reference))
    print(f"MindSpore fake-quant vs emulation {gap:.3g}, one step {one_step:.3g}, INT8 vs PyTorch {int8_error:.3g}")
    assert gap <= one_step, (gap, one_step)
    # the negative control: MindSpore in float is as far from the emulation as INT8 is from PyTorch
    assert max(np.abs(g["output"] - e["output"]).max() for g, e in zip(plain, emulated)) > 0.5 * int8_error
    assert gap <= 0.1 * int8_error, (gap, int8_error)
    for g, e in zip(got, emulated):
        assert (g["output"].argmax(1) == e["output"].argmax(1)).all()


# --- the trained fixtures: the goal, and a bundle verify accepts ----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["digits", "shapes"])
def test_trained_fixture_int8_bundle(tmp_path, which):
    """Trained on real data, checked on the held-out set: the plan keeps the task metric against the
    labels within 1 point of fp32 (top-1 for digits, mIoU for shapes) with >= 90% of MACs in INT8, and
    ``package --precision int8`` writes a bundle ``verify`` accepts."""
    import trained_models as tm

    from torch2ms.bundle.build import build_bundle
    from torch2ms.bundle.verify import verify_bundle

    if which == "digits":
        t = tm.train_digits(tmp_path / "w.pt")
        np.save(tmp_path / "calib.npy", tm.digits_data()[0][:1080])  # 3 batches of 360 training images
        task, factory = "classification", "digits_cnn"
    else:
        t = tm.train_shapes(tmp_path / "w.pt")
        np.save(tmp_path / "calib.npy", tm.shapes_data(96, seed=7)[0])  # 3 batches of 32 other scenes
        task, factory = "segmentation", "shapes_unet"
    np.save(tmp_path / "heldout.npy", t.heldout_x)
    path = write_recipe(
        tmp_path / f"{which}.yaml",
        name=f"trained_{which}",
        task=task,
        model={"factory": f"trained_models:{factory}", "checkpoint": str(t.checkpoint)},
        inputs=[{"name": "input", "shape": list(t.heldout_x.shape), "data": "heldout.npy"}],
        check={"samples": 1, "task_agreement": 0.999},
        quantize={"calibration": "calib.npy", "samples": 3},
    )
    result = pipeline_runner(load_recipe(path), log=lambda m: None).run()
    assert result.passed, [(s.stage, s.status, s.reason) for s in result.stages]
    bundle = build_bundle(result, tmp_path / "dist", precision="int8", log=lambda m: None)
    plan = json.loads((result.root / "precision" / "int8_plan.json").read_text())
    assert plan["after"]["ok"] and plan["mac_share_int8"] >= 0.9, plan["mac_share_int8"]

    import onnx as _onnx  # the plan's layers in INT8, the emulation against the labels

    recipe = load_recipe(path)
    calib, _ = int8.calibration_samples(recipe, log=lambda m: None)
    onnx_path = result.root / "export" / "model.onnx"
    emu = Int8Emulator(onnx_path, [{"input": t.heldout_x}], ["output"], int8.calibrate(recipe, onnx_path, calib))
    assert len(emu.names) == sum(n.op_type in ("Conv", "Gemm") for n in _onnx.load(str(onnx_path)).graph.node)
    plan_int8 = [emu.labels.index(x) for x in plan["layers_int8"]]

    def metric(int8_layers) -> float:
        pred = emu.run(int8=int8_layers)[0]["output"].argmax(1)
        if which == "digits":
            return float((pred == t.heldout_y).mean())
        return float(
            np.mean(
                [np.sum((pred == c) & (t.heldout_y == c)) / np.sum((pred == c) | (t.heldout_y == c)) for c in range(3)]
            )
        )

    assert metric(plan_int8) >= metric([]) - 0.01
    verified = verify_bundle(bundle.path, log=lambda m: None)
    assert verified.manifest["target"]["precision"] == "int8" and "int8_plan" in verified.manifest
