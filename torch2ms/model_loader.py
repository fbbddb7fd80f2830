"""Build the PyTorch model a recipe names: import the factory, call it, load the checkpoint.

Every failure names the culprit: the factory that cannot be imported or raised, a return value
that is not an ``nn.Module``, a checkpoint that is missing, not a state_dict, or that refuses to
load under ``weights_only=True`` (a pickle that would run code), and every missing, unexpected
or mis-shaped key at once.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

from torch2ms.errors import ModelError
from torch2ms.recipe import Recipe


def import_factory(spec: str, search_dirs: list[Path] | None = None):
    module_name, _, attr = spec.partition(":")
    for d in search_dirs or []:
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ModelError(
            f"model.factory: cannot import module {module_name!r}: {type(err).__name__}: {err}",
            hint="check the module path; it must be importable from the current folder or the recipe's folder",
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelError(f"model.factory: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelError(f"model.factory: {spec!r} is not callable")
    return obj


def factory_source(spec: str, search_dirs: list[Path]) -> Path | None:
    """The file defining the factory's module, found without running it (None if not found).

    The export fingerprint hashes it: editing the model's code must re-run the conversion. Only
    that one file is covered, not what it imports.
    """
    import importlib.util

    module_name = spec.partition(":")[0]
    for d in search_dirs:
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    origin = getattr(found, "origin", None)
    if not origin or not Path(origin).is_file():
        return None
    return Path(origin)


def build_model(recipe: Recipe):
    import torch

    spec = recipe.model
    factory = import_factory(spec.factory, [Path.cwd(), Path(recipe.base_dir).resolve()])
    torch.manual_seed(spec.seed)
    try:
        model = factory(**spec.kwargs)
    except Exception as err:
        raise ModelError(
            f"model.factory: {spec.factory}(**{spec.kwargs}) raised {type(err).__name__}: {err}",
            hint="check model.kwargs",
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"model.factory: {spec.factory} returned {type(model).__name__}, not a torch.nn.Module")
    if spec.checkpoint:
        load_checkpoint(model, recipe.resolve(spec.checkpoint))
    elif spec.init == "randomized":
        randomize_norm(model, spec.seed)
    elif spec.init == "calibrated":
        calibrate_norm(model, [tuple(i.shape) for i in recipe.inputs], spec.seed)
    return model.eval()


def load_checkpoint(model, path: Path) -> None:
    import pickle

    import torch

    if not path.is_file():
        raise ModelError(f"model.checkpoint: {path}: file not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's first line suggests weights_only=False; the line naming the refused global
        # (e.g. "Unsupported global: GLOBAL posix.system") is the one that says what is wrong.
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "GLOBAL" in ln or "global" in ln.split()[:3]), lines[0] if lines else "")
        raise ModelError(
            f"model.checkpoint: {path} was refused by torch.load(weights_only=True): {reason}",
            hint="it holds more than tensors (possibly code that would run on load); save only model.state_dict()",
        ) from None
    except Exception as err:
        raise ModelError(
            f"model.checkpoint: {path} is not a PyTorch checkpoint ({type(err).__name__}: {err})"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelError(
            f"model.checkpoint: {path} is not a state_dict (a mapping of names to tensors)",
            hint="save it with torch.save(model.state_dict(), path)",
        )
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: checkpoint {list(state[k].shape)} vs model {list(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if state[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        lines = [f"model.checkpoint: {path} does not fit the model:"]
        for title, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        ):
            if items:
                lines.append(
                    f"  {title} ({len(items)}): " + ", ".join(items[:20]) + (" ..." if len(items) > 20 else "")
                )
        raise ModelError("\n".join(lines), hint="is it the checkpoint of this model and these model.kwargs?")
    model.load_state_dict(state, strict=True)


CALIBRATION_BATCH = 4
# Images the statistics are measured on: 16 at 224x224 and below (4 passes of 4), fewer at larger
# inputs so that the pixels per channel stay about 16 x 224 x 224 (DeepLabV3+ at 512x512: 4 images,
# 1 pass). A BatchNorm's running mean/variance is an average over batch x height x width values per
# channel, so fewer larger images give it as many values; benchmarks/calibration_stats.py compares the
# statistics of 4 and of 16 images at 512x512 with those of an independent draw of 16.
CALIBRATION_IMAGES = 16
CALIBRATION_PIXELS = CALIBRATION_IMAGES * 224 * 224


def calibration_passes(input_shapes: list[tuple[int, ...]]) -> int:
    """Train-mode passes of ``CALIBRATION_BATCH`` images: ``CALIBRATION_IMAGES`` in all where an image
    has at most ``CALIBRATION_PIXELS / CALIBRATION_IMAGES`` pixels, fewer (at least one pass) above."""
    pixels = max((math.prod(s[2:]) for s in input_shapes if len(s) > 2), default=0)
    images = CALIBRATION_IMAGES if not pixels else min(CALIBRATION_IMAGES, math.ceil(CALIBRATION_PIXELS / pixels))
    return max(1, math.ceil(images / CALIBRATION_BATCH))


def calibrate_norm(model, input_shapes: list[tuple[int, ...]], seed: int, passes: int | None = None) -> int:
    """Trained-like BatchNorm: seeded non-trivial gamma/beta, then running statistics measured.

    Random init with random statistics makes activations grow with depth (inception_v3 reached
    ~1e12, deep SE nets ~4e4, where saturated sigmoids turned float32 noise into a false
    failure). Here every BatchNorm first gets seeded gamma in [0.5, 1.5] and beta in [-0.2, 0.2]
    (so folding is still exercised), then its statistics are reset and re-measured as the
    cumulative average (``momentum=None``) over ``passes`` (default ``calibration_passes``)
    train-mode forward passes on seeded standard-normal inputs of the recipe's shapes; only the
    BatchNorms are in train mode (dropout stays off). Returns how many layers were calibrated.
    """
    import torch

    if passes is None:
        passes = calibration_passes(input_shapes)
    norms = [
        m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not norms:
        return 0
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in norms:
            if m.affine:
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) * 0.4 - 0.2)
            m.reset_running_stats()
    measure_norm_stats(model, norms, input_shapes, passes, g)
    return len(norms)


def measure_norm_stats(model, norms, input_shapes: list[tuple[int, ...]], passes: int, g) -> None:
    """Running statistics of ``norms`` (reset) as the cumulative average of ``passes`` train-mode
    passes on standard-normal inputs drawn from generator ``g``."""
    import torch

    momenta = [m.momentum for m in norms]
    model.eval()
    for m in norms:
        m.momentum = None
        m.train()
    # A batch of CALIBRATION_BATCH where the model accepts one: train-mode BatchNorm needs more than
    # one value per channel (a BatchNorm after global pooling sees 1x1 maps); else the recipe's shapes.
    batched = [(CALIBRATION_BATCH, *shape[1:]) if shape else shape for shape in input_shapes]
    try:
        with torch.no_grad():
            for shapes in (batched, input_shapes):
                try:
                    for _ in range(passes):
                        model(*[torch.randn(*shape, generator=g) for shape in shapes])
                    break
                except Exception as err:
                    if shapes is input_shapes:
                        raise ModelError(
                            f"model.init: calibrated: a train-mode pass of the BatchNorms failed"
                            f" ({type(err).__name__}: {err})",
                            hint="set model.init: randomized (seeded random statistics) or as_is",
                        ) from None
                    for m in norms:
                        m.reset_running_stats()
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.eval()


def randomize_norm(model, seed: int) -> int:
    """Give BatchNorm layers non-trivial statistics and affine parameters (seeded).

    A freshly initialised BatchNorm has mean 0, variance 1, gamma 1, beta 0: a converter that
    mixed up those tensors would still match PyTorch. Returns how many layers were changed.
    """
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    n = 0
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                    m.bias.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
                n += 1
    return n


def flatten_outputs(out) -> dict:
    """Name a model's outputs: a tensor -> 'output'; tuple -> output0..; dict -> its keys."""
    import torch

    if isinstance(out, torch.Tensor):
        return {"output": out}
    if isinstance(out, dict):
        return {str(k): v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, (tuple, list)):
        return {f"output{i}": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
    raise ModelError(f"the model returned {type(out).__name__}; torch2ms needs tensors, a tuple or a dict of tensors")
