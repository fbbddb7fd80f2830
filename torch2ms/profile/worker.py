"""One profiled variant in a subprocess of its own: ``python -m torch2ms.profile.worker SPEC.json``.

A MindSpore variant (a ``torch2ms.bench.variants`` key) is loaded as the bench loads it and its
calls run under MindSpore's Profiler (``mindspore_ops``); ``torch`` builds the recipe's PyTorch
model and runs it under ``torch.profiler`` (``torch_ops``). Only the variant's own framework is
imported. The result is the last stdout line, ``@@RESULT {json}`` (``torch2ms.bench.worker``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch2ms.bench.worker import RESULT


def profile(spec: dict) -> dict:
    from torch2ms.pipeline.workspace import load_npz, split_reference
    from torch2ms.recipe import parse_recipe

    recipe = parse_recipe(spec["recipe"], "profile", spec["base_dir"])
    folders = {k: Path(v) for k, v in spec["folders"].items()}
    inputs, _ = split_reference(load_npz(folders["reference"] / "reference.npz"))
    sample = inputs[spec.get("sample", 0)]
    if spec["variant"] == "torch":
        import torch

        from torch2ms.model_loader import build_model
        from torch2ms.profile.torch_ops import profile_torch

        model = build_model(recipe).eval()
        args = [torch.from_numpy(v.copy()) for v in sample.values()]
        return profile_torch(model, args, spec["calls"], spec["settings"]["threads"])
    from torch2ms.bench.variants import BY_KEY, Settings, load
    from torch2ms.profile.mindspore_ops import profile_loaded

    loaded = load(BY_KEY[spec["variant"]], folders, recipe, Settings(**spec["settings"]), sample)
    return profile_loaded(loaded, spec["calls"])


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = profile(spec)
    sys.stdout.write("\n" + RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
