"""Fusion coverage per model: what the rebuild + fold passes fused, and what written-out
activations and normalizations are left in the graph the code generator sees.

    PYTHONPATH=. python benchmarks/fusion_coverage.py [--opset 17] [--models efficientnet_b0,yolov8n,vit_b_16@14,...]
        [--json benchmarks/results/fusion_coverage.json] [--md benchmarks/results/fusion_coverage.md]

Each model is exported with the TorchScript exporter as the export stage does it (random weights,
``training=PRESERVE``, batch 1; at ``--opset`` or the one after ``@``), loaded with static shapes,
and run through ``fold_passes()``.
Reported per model: Conv->(BN)->activation chains found / fused and the reasons for those left
(``torch2ms.passes.coverage``), Dense blocks by activation, and the leftovers a cell or one call
could compute but the graph still writes out:

* ``silu_pairs``: a Sigmoid whose output is multiplied by its own input;
* ``erf`` / ``gelu_tanh``: Erf nodes, and Tanh nodes fed by a Mul by sqrt(2/pi) (GELU parts);
* ``reduce_mean_sub``: ReduceMean feeding a Sub of the same input (a LayerNorm's first step);
* ``instance_norm``: InstanceNormalization (GroupNorm's core);
* ``hard_sigmoid_mul``: HardSigmoid multiplied by its own input (HardSwish).

Ultralytics is used here (never by the torch2ms package); YOLO_OFFLINE=1 keeps it off the network.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

MODELS = {
    # torchvision zoo (recipes/zoo/torchvision.yaml), at the zoo's input sizes
    "resnet18": ("torchvision.models:resnet18", (1, 3, 224, 224)),
    "resnet50": ("torchvision.models:resnet50", (1, 3, 224, 224)),
    "resnext50_32x4d": ("torchvision.models:resnext50_32x4d", (1, 3, 224, 224)),
    "wide_resnet50_2": ("torchvision.models:wide_resnet50_2", (1, 3, 224, 224)),
    "mobilenet_v2": ("torchvision.models:mobilenet_v2", (1, 3, 224, 224)),
    "mobilenet_v3_small": ("torchvision.models:mobilenet_v3_small", (1, 3, 224, 224)),
    "mobilenet_v3_large": ("torchvision.models:mobilenet_v3_large", (1, 3, 224, 224)),
    "efficientnet_b0": ("torchvision.models:efficientnet_b0", (1, 3, 224, 224)),
    "regnet_x_400mf": ("torchvision.models:regnet_x_400mf", (1, 3, 224, 224)),
    "shufflenet_v2_x1_0": ("torchvision.models:shufflenet_v2_x1_0", (1, 3, 224, 224)),
    "squeezenet1_1": ("torchvision.models:squeezenet1_1", (1, 3, 224, 224)),
    "densenet121": ("torchvision.models:densenet121", (1, 3, 224, 224)),
    "googlenet": ("torchvision.models:googlenet", (1, 3, 224, 224)),
    "inception_v3": ("torchvision.models:inception_v3", (1, 3, 299, 299)),
    "mnasnet1_0": ("torchvision.models:mnasnet1_0", (1, 3, 224, 224)),
    "convnext_tiny": ("torchvision.models:convnext_tiny", (1, 3, 224, 224)),
    "vit_b_16": ("torchvision.models:vit_b_16", (1, 3, 224, 224)),
    "swin_t": ("torchvision.models:swin_t", (1, 3, 224, 224)),
    "vgg11_bn": ("torchvision.models:vgg11_bn", (1, 3, 224, 224)),
    "alexnet": ("torchvision.models:alexnet", (1, 3, 224, 224)),
    "deeplabv3_resnet50": ("torchvision.models.segmentation:deeplabv3_resnet50", (1, 3, 256, 256)),
    "deeplabv3_mobilenet_v3_large": (
        "torchvision.models.segmentation:deeplabv3_mobilenet_v3_large",
        (1, 3, 256, 256),
    ),
    "fcn_resnet50": ("torchvision.models.segmentation:fcn_resnet50", (1, 3, 256, 256)),
    "lraspp_mobilenet_v3_large": ("torchvision.models.segmentation:lraspp_mobilenet_v3_large", (1, 3, 256, 256)),
    # beyond the zoo: Ultralytics, timm, segmentation_models_pytorch
    "yolov8n": ("benchmarks.fusion_models:yolov8n", (1, 3, 640, 640)),
    "vit_small_patch16_224": ("timm:vit_small_patch16_224", (1, 3, 224, 224)),
    "timm_efficientnet_b0": ("timm:efficientnet_b0", (1, 3, 224, 224)),
    "tf_efficientnet_b0": ("timm:tf_efficientnet_b0", (1, 3, 224, 224)),
    "mobilenetv3_large_100": ("timm:mobilenetv3_large_100", (1, 3, 224, 224)),
    "timm_convnext_tiny": ("timm:convnext_tiny", (1, 3, 224, 224)),
    "mobilevit_s": ("timm:mobilevit_s", (1, 3, 256, 256)),
    "poolformer_s12": ("timm:poolformer_s12", (1, 3, 224, 224)),
    "rexnet_100": ("timm:rexnet_100", (1, 3, 224, 224)),
    "cspdarknet53": ("timm:cspdarknet53", (1, 3, 256, 256)),
    "ghostnet_100": ("timm:ghostnet_100", (1, 3, 224, 224)),
    "deit_small_patch16_224": ("timm:deit_small_patch16_224", (1, 3, 224, 224)),
    "smp_unet_efficientnet_b0": ("smp:Unet:efficientnet-b0", (1, 3, 256, 256)),
    "smp_fpn_mit_b0": ("smp:FPN:mit_b0", (1, 3, 256, 256)),
}
ZOO_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": True, "transform_input": False},
    "inception_v3": {"aux_logits": False, "init_weights": True, "transform_input": False},
    "deeplabv3_resnet50": {"weights_backbone": None, "aux_loss": False},
    "deeplabv3_mobilenet_v3_large": {"weights_backbone": None, "aux_loss": False},
    "fcn_resnet50": {"weights_backbone": None, "aux_loss": False},
    "lraspp_mobilenet_v3_large": {"weights_backbone": None},
}


def build(name: str):
    import importlib

    factory, shape = MODELS[name]
    if factory.startswith("timm:"):
        import timm

        return timm.create_model(factory[5:], pretrained=False).eval(), shape
    if factory.startswith("smp:"):
        import segmentation_models_pytorch as smp

        _, arch, encoder = factory.split(":")
        return getattr(smp, arch)(encoder_name=encoder, encoder_weights=None).eval(), shape
    module, fn = factory.split(":")
    kwargs = {} if module.startswith("benchmarks") else {"weights": None, **ZOO_KWARGS.get(name, {})}
    model = getattr(importlib.import_module(module), fn)(**kwargs)
    return model.eval(), shape


class FirstOutput:
    """Segmentation models return a dict, YOLO a tuple: export the first tensor only."""

    def __new__(cls, model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                y = self.model(x)
                if isinstance(y, dict):
                    return y["out"]
                return y[0] if isinstance(y, (tuple, list)) else y

        return Wrapped().eval()


def export(name: str, opset: int, cache: Path) -> tuple[Path, tuple[int, ...]]:
    import torch

    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}_op{opset}.onnx"
    model, shape = build(name)
    if not path.exists():
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buf = io.BytesIO()
            torch.onnx.export(
                FirstOutput(model),
                (torch.randn(*shape),),
                buf,
                dynamo=False,
                opset_version=opset,
                training=torch.onnx.TrainingMode.PRESERVE,
                do_constant_folding=True,
                input_names=["input"],
            )
        path.write_bytes(buf.getvalue())
    return path, shape


def leftovers(graph) -> dict[str, int]:
    """Written-out activations / norms still in ``graph`` (see the module docstring)."""
    producer = {o: n for n in graph.nodes for o in n.outputs}
    out = dict.fromkeys(("silu_pairs", "hard_sigmoid_mul", "erf", "gelu_tanh", "reduce_mean_sub", "instance_norm"), 0)
    for n in graph.nodes:
        if n.op_type == "Mul" and len(n.inputs) == 2:
            for i in (0, 1):
                p = producer.get(n.inputs[i])
                if p is not None and p.op_type == "Sigmoid" and p.inputs[0] == n.inputs[1 - i]:
                    out["silu_pairs"] += 1
                if p is not None and p.op_type == "HardSigmoid" and p.inputs[0] == n.inputs[1 - i]:
                    out["hard_sigmoid_mul"] += 1
        elif n.op_type == "Erf":
            out["erf"] += 1
        elif n.op_type == "Tanh":
            p = producer.get(n.inputs[0])
            c = [graph.const(i) for i in (p.inputs if p is not None and p.op_type == "Mul" else [])]
            if any(v is not None and v.size == 1 and abs(float(v.reshape(())) - 0.79788456) < 1e-6 for v in c):
                out["gelu_tanh"] += 1
        elif n.op_type == "Sub":
            p = producer.get(n.inputs[1])
            if p is not None and p.op_type == "ReduceMean" and p.inputs[0] == n.inputs[0]:
                out["reduce_mean_sub"] += 1
        elif n.op_type == "InstanceNormalization":
            out["instance_norm"] += 1
    return out


def coverage(model: str, opset: int, cache: Path) -> dict:
    from torch2ms.graph import load_onnx
    from torch2ms.passes import fold_passes, fusion_counts, run_passes

    name, _, at = model.partition("@")
    opset = int(at or opset)
    path, shape = export(name, opset, cache)
    graph = load_onnx(path, {"input": shape})
    before = leftovers(graph)
    passes = fold_passes()
    t0 = time.perf_counter()
    fired = run_passes(graph, passes)
    seconds = time.perf_counter() - t0
    counts = fusion_counts(graph, passes)
    return {
        "model": model,
        "opset": opset,
        "onnx_nodes": len(load_onnx(path, {"input": shape}).nodes),
        "nodes_after": len(graph.nodes),
        "pass_seconds": round(seconds, 2),
        "fired": {k: v for k, v in fired.items() if v},
        "written_out_before": {k: v for k, v in before.items() if v},
        "written_out_after": {k: v for k, v in leftovers(graph).items() if v},
        **counts,
    }


def row(r: dict) -> str:
    c = r.get("conv_chains", {})
    d = r.get("dense_blocks", {})
    left = "; ".join(f"{u['count']}x {u['kind']}: {u['reason']}" for u in c.get("unfused", [])) or "-"
    kinds = ", ".join(f"{k} {v['fused']}/{v['found']}" for k, v in c.get("by_kind", {}).items()) or "-"
    before = ", ".join(f"{k} {v}" for k, v in r["written_out_before"].items()) or "none"
    after = ", ".join(f"{k} {v}" for k, v in r["written_out_after"].items()) or "none"
    dense = ", ".join(f"{k} {v}" for k, v in d.items()) or "-"
    return (
        f"| {r['model']} | {c.get('fused', 0)}/{c.get('supported', 0)} | {kinds} | {dense} | {before} | {after} | "
        f"{left} | {r['pass_seconds']} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cache", default="/tmp/torch2ms_fusion_coverage")
    ap.add_argument("--json")
    ap.add_argument("--md", help="the table and the total as markdown")
    ap.add_argument("--render", metavar="JSON", help="only write the tables of an earlier run's --json")
    args = ap.parse_args(argv)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    results = []
    columns = ("model", "Conv->act fused/found", "by activation (fused/found)", "Dense blocks")
    columns += ("written out before", "written out after", "left unfused", "pass s")
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    print("\n".join(lines))
    if args.render:  # the tables of an earlier --json, without running anything
        results = json.loads(Path(args.render).read_text())["models"]
    for name in [] if args.render else args.models.split(","):
        results.append(coverage(name, args.opset, cache))
    for r in results:
        lines.append(row(r))
        print(lines[-1], flush=True)
    fused = sum(r.get("conv_chains", {}).get("fused", 0) for r in results)
    supported = sum(r.get("conv_chains", {}).get("supported", 0) for r in results)
    found = sum(r.get("conv_chains", {}).get("found", 0) for r in results)
    lines.append(
        f"\ntotal Conv->(BN)->act chains fused: {fused}/{supported} ({100 * fused / max(supported, 1):.1f}%)"
        f" of those whose activation the cell supports; {found} found"
    )
    print(lines[-1])
    if args.json and not args.render:
        Path(args.json).write_text(json.dumps({"opset": args.opset, "models": results}, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    np.random.seed(0)
    sys.exit(main())
