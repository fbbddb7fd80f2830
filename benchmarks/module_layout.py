"""The generated code's shape, flat vs modules layout (``rebuild.layout``), per model.

Each model is exported as the export stage does (TorchScript, BatchNorm kept), passed through the
rebuild passes and generated in both layouts; both networks run one seeded input and must agree
bit for bit. Reported: classes made, the longest ``construct`` in statements, file lines flat vs
modules, the longest identifier, and the share of ONNX nodes inside a PyTorch module.

    PYTHONPATH=. python benchmarks/module_layout.py [deeplabv3plus resnet50 ...]
writes benchmarks/results/module_layout.md (timings none: these are counts).
"""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from codegen.test_module_layout import export  # noqa: E402

MODELS = {
    "deeplabv3plus": ("torch2ms.models.deeplabv3plus:deeplabv3plus", {"num_classes": 21}, (1, 3, 128, 128)),
    "resnet50": ("torchvision.models:resnet50", {"weights": None}, (1, 3, 64, 64)),
    "efficientnet_b0": ("torchvision.models:efficientnet_b0", {"weights": None}, (1, 3, 64, 64)),
    "vit_b_16": ("torchvision.models:vit_b_16", {"weights": None}, (1, 3, 224, 224)),
    "swin_t": ("torchvision.models:swin_t", {"weights": None}, (1, 3, 64, 64)),
    "yolov8n": ("recipe:recipes/yolov8n.yaml", {"imgsz": 256}, (1, 3, 256, 256)),
}


def build(spec: str, kwargs: dict):
    import importlib

    if spec.startswith("recipe:"):
        from torch2ms.model_loader import build_model
        from torch2ms.recipe import load_recipe

        recipe = load_recipe(spec[len("recipe:") :])
        recipe.model.kwargs.update(kwargs)
        return build_model(recipe)
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


def shape_of(source: str) -> dict:
    tree = ast.parse(source)
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef)]
    longest = max(
        len(f.body) for c in classes for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "construct"
    )
    nodes = [n for c in classes for n in ast.walk(c)]
    idents = [n.id for n in nodes if isinstance(n, ast.Name)] + [n.attr for n in nodes if isinstance(n, ast.Attribute)]
    return {"classes": len(classes), "longest_construct": longest, "lines": len(source.splitlines()),
            "longest_identifier": max(idents, key=len)}  # fmt: skip


def measure(name: str) -> dict:
    import torch

    from torch2ms.codegen.convert import convert_graph
    from torch2ms.graph.load import graph_from_model
    from torch2ms.passes import rebuild_passes, run_passes
    from torch2ms.runtime import msutil

    spec, kwargs, shape = MODELS[name]
    torch.manual_seed(0)
    model = build(spec, kwargs).eval()
    proto, classes = export(model, shape)  # the test's export: TorchScript at opset 17, BatchNorm kept
    ms = msutil.mindspore()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    row, outs = {"model": name, "onnx_nodes": len(proto.graph.node)}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("flat", "modules"):
            graph = graph_from_model(proto, 17, {"x": shape})
            run_passes(graph, rebuild_passes(True))
            net = convert_graph(graph, "Net", "model.onnx", "0" * 64, name, layout=layout, modules=classes)
            d = Path(tmp) / layout
            d.mkdir()
            (d / "network.py").write_text(net.source)
            params = [{"name": k, "data": ms.Tensor(v)} for k, v in net.params.items()]
            ms.save_checkpoint(params, str(d / "network.ckpt"))
            out = msutil.build_network(d, f"{name}_{layout}")(ms.Tensor(x))
            outs[layout] = [o.asnumpy() for o in (out if isinstance(out, tuple) else (out,))]
            row[layout] = shape_of(net.source)
            if layout == "modules":
                rec = net.layout
                row["share"] = rec.get("nodes_in_modules", 0) / max(rec.get("nodes", 1), 1)
                row["inlined"] = len(rec.get("inlined", []))
                row["fallback"] = rec.get("modules_failed")
    row["bitwise_equal"] = all(np.array_equal(a, b) for a, b in zip(outs["flat"], outs["modules"]))
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| model | classes | longest construct (statements) flat / modules | file lines flat / modules "
        "| longest identifier flat / modules | nodes in a module | inlined | outputs bitwise equal |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    body = ""
    for r in rows:
        f, m = r["flat"], r["modules"]
        body += (
            f"| {r['model']} | {m['classes'] - 1} | {f['longest_construct']} / {m['longest_construct']} "
            f"| {f['lines']} / {m['lines']} | {len(f['longest_identifier'])} / {len(m['longest_identifier'])} "
            f"(`{m['longest_identifier']}`) | {r['share']:.1%} | {r['inlined']} | {r['bitwise_equal']} |\n"
        )
    return head + body


def main(names: list[str]) -> None:
    rows = []
    for name in names or list(MODELS):
        print(f"{name} ...", flush=True)
        rows.append(measure(name))
        print(rows[-1], flush=True)
    text = (
        "# network.py: flat vs modules layout\n\n"
        "Generated by `benchmarks/module_layout.py` (rebuild passes, TorchScript export at opset 17). "
        "`classes`: module classes made (besides the network's own); `nodes in a module`: ONNX nodes whose "
        "statement belongs to a PyTorch module (its class, its layer attribute, or inline as a weight-free leaf); "
        "`inlined`: modules kept in their parent because their nodes interleave with it.\n\n" + table(rows)
    )
    out = Path(__file__).parent / "results" / "module_layout.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
