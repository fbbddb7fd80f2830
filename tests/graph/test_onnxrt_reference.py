"""The reference session's policy (torch2ms/graph/onnxrt.py): a graph with quantization ops runs
without QDQ fusion, so onnxruntime computes PyTorch's float32 fake-quant arithmetic on every CPU,
not integer kernels that saturate without VNNI; the export stage says so in stage.json."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import run_cli, write_recipe
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from torch2ms.graph.onnxrt import reference_policy, run_reference


def test_policy_by_op_types():
    assert reference_policy({"Conv": 3, "Relu": 2})["graph_optimization"] == "all"
    policy = reference_policy(["Conv", "QuantizeLinear", "DequantizeLinear"])
    assert policy["graph_optimization"] == "basic"
    assert "DequantizeLinear, QuantizeLinear" in policy["why"] and "VNNI" in policy["why"]


class _Calibration(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.batches = iter([{"x": (rng.standard_normal((1, 64, 8, 8)) * 3).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


def test_quantized_graph_reference_is_the_unfused_fake_quant(tmp_path):
    """uint8 activations x per-channel int8 weights, as onnxruntime's own quantizer writes them: the
    reference session's outputs equal the graph evaluated without any optimization (Q/DQ in float32),
    to the bit. onnxruntime's default level would fuse QLinearConv / QGemm instead, whose outputs
    move by ~0.06 on an AVX2-only CPU (measured under qemu -cpu Haswell)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64 * 64, 10)
    ).eval()
    float_path, path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    torch.onnx.export(
        net, (torch.randn(1, 64, 8, 8),), str(float_path), dynamo=False, opset_version=17, input_names=["x"]
    )
    quantize_static(str(float_path), str(path), _Calibration(), quant_format=QuantFormat.QDQ, per_channel=True)
    samples = [{"x": (np.random.default_rng(9).standard_normal((1, 64, 8, 8)) * 3).astype(np.float32)}]
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    got, policy = run_reference(path, ops, samples, [model.graph.output[0].name])
    assert policy["graph_optimization"] == "basic"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, samples[0])[0]
    assert np.array_equal(next(iter(got[0].values())), want)


def test_fake_quant_model_converts_and_records_the_reference(tmp_path):
    """A quantization-aware PyTorch model (fake-quant uint8 activations, per-channel int8 weights):
    all five stages pass, and the export stage's record names the policy. Its bound is a
    quantization step, not 1e-4: PyTorch's and onnxruntime's convolutions sum in different orders,
    and a value at a rounding midpoint of the next QuantizeLinear flips by one step (measured 5.9e-4)."""
    recipe = write_recipe(
        tmp_path / "fq.yaml",
        name="fq",
        model={"factory": "tiny_models:fake_quant_net", "kwargs": {"width": 16}, "seed": 0},
        inputs=[{"name": "input", "shape": [1, 3, 8, 8]}],
        check={"samples": 2, "rel_error": 1.0e-2, "cosine": 0.999},
    )
    assert run_cli("convert", "--recipe", str(recipe)) == 0
    record = json.loads((tmp_path / "runs" / "fq" / "export" / "stage.json").read_text())
    assert record["extra"]["onnxruntime"]["graph_optimization"] == "basic"


def test_only_the_factory_builds_sessions():
    """Every onnxruntime session of the package comes from ``graph/onnxrt.session`` under a named
    purpose: no other module builds ``InferenceSession`` or ``SessionOptions``, or imports them."""
    import ast
    from pathlib import Path

    import torch2ms

    package = Path(torch2ms.__file__).parent
    factory = package / "graph" / "onnxrt.py"
    built = {"InferenceSession", "SessionOptions"}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == factory:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = set()
            if isinstance(node, ast.Attribute):
                names = {node.attr}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnxruntime"):
                names = {a.name for a in node.names}
            if names & built:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert not found, f"onnxruntime sessions built outside torch2ms/graph/onnxrt.py: {found}"


def test_each_purpose_has_its_options():
    """The options each purpose documents: the reference's level follows the policy, the loader's
    run keeps nothing between runs, the emulators run unoptimized on one thread, the benchmark on
    the caller's threads."""
    from torch2ms.graph import onnxrt

    level = ort.GraphOptimizationLevel
    ref = onnxrt.session_options(onnxrt.REFERENCE, {"Conv"})
    assert ref.graph_optimization_level == level.ORT_ENABLE_ALL and not ref.enable_cpu_mem_arena
    assert (
        onnxrt.session_options(onnxrt.REFERENCE, {"QuantizeLinear"}).graph_optimization_level == level.ORT_ENABLE_BASIC
    )
    shapes = onnxrt.session_options(onnxrt.SHAPES)
    assert shapes.graph_optimization_level == level.ORT_DISABLE_ALL and not shapes.enable_cpu_mem_arena
    assert shapes.get_session_config_entry("session.disable_prepacking") == "1"
    emu = onnxrt.session_options(onnxrt.EMULATION)
    assert emu.graph_optimization_level == level.ORT_DISABLE_ALL and emu.intra_op_num_threads == 1
    assert onnxrt.session_options(onnxrt.BENCHMARK, threads=3).intra_op_num_threads == 3
    with pytest.raises(ValueError, match="op types"):
        onnxrt.session_options(onnxrt.REFERENCE)
