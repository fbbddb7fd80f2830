"""The INT8 plan's calibration data: the recipe's ``quantize.calibration`` entries (folders or files
of images, read through the recipe's ``preprocess``, or ``.npy`` arrays in the input's shape or a
stack of it along dimension 0), the first ``quantize.samples`` of them. Every problem names the file
and why, before anything is written."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.errors import RecipeError

FIELD = "quantize.calibration"
CALIBRATION_SUFFIXES = (".npy", ".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


def _files(recipe, entry: str) -> list[Path]:
    if entry.startswith("skimage:"):
        return [recipe.resolve_data(entry)]
    path = recipe.resolve(entry)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in CALIBRATION_SUFFIXES)
        if not found:
            raise RecipeError(
                f"{FIELD}: {path}: the folder holds no images or .npy files",
                hint=f"put calibration images ({', '.join(CALIBRATION_SUFFIXES[1:])}) or .npy samples in it",
            )
        return found
    if not path.exists():
        raise RecipeError(f"{FIELD}: {path}: no such file or folder")
    if path.suffix.lower() not in CALIBRATION_SUFFIXES:
        raise RecipeError(f"{FIELD}: {path}: not an image or a .npy file")
    return [path]


def _npy(path: Path, shape: tuple[int, ...]) -> list[np.ndarray]:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise RecipeError(f"{FIELD}: {path}: cannot read it as .npy ({err})") from None
    if arr.dtype.kind not in "biuf":
        raise RecipeError(f"{FIELD}: {path}: holds {arr.dtype} values, not numbers")
    if tuple(arr.shape) == tuple(shape):
        stack = [arr]
    elif arr.ndim == len(shape) and tuple(arr.shape[1:]) == tuple(shape[1:]) and arr.shape[0] % shape[0] == 0:
        stack = [arr[k : k + shape[0]] for k in range(0, arr.shape[0], shape[0])]
    else:
        raise RecipeError(
            f"{FIELD}: {path}: shape {list(arr.shape)} is neither the input's {list(shape)} nor a stack of it "
            f"along dimension 0 (a multiple of {shape[0]})"
        )
    out = [a.astype(np.float32) for a in stack]
    if not all(np.isfinite(a).all() for a in out):
        raise RecipeError(f"{FIELD}: {path}: holds NaN or infinite values")
    return out


def calibration_samples(recipe, log: Callable = print) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """The first ``quantize.samples`` calibration samples, and the files they came from. Every
    problem names the file and why; nothing is read past the samples needed."""
    from torch2ms.postprocess.image import image_sample

    q = recipe.quantize
    if q is None:
        raise RecipeError(
            f"{FIELD}: the recipe has no quantize section; INT8 needs calibration data",
            hint="add quantize: {calibration: <folder of images or .npy>} (e.g. 32 images like the model's inputs)",
        )
    if len(recipe.inputs) != 1 or recipe.inputs[0].dtype != "float32":
        raise RecipeError(
            f"{FIELD}: INT8 calibration takes one float32 input; this recipe has "
            + ", ".join(f"{i.name} ({i.dtype})" for i in recipe.inputs)
        )
    spec = recipe.inputs[0]
    samples, sources = [], []
    for entry in q.entries():
        for path in _files(recipe, entry):
            if len(samples) >= q.samples:
                break
            if path.suffix.lower() == ".npy":
                arrays = _npy(path, spec.shape)
            else:
                try:
                    arrays = [image_sample(path, spec.shape, recipe, FIELD)]
                except RecipeError as err:  # load_rgb names the file, not the field
                    msg = err.args[0]
                    raise RecipeError(msg if msg.startswith(FIELD) else f"{FIELD}: {msg}") from None
            for a in arrays[: q.samples - len(samples)]:
                samples.append({spec.name: a})
                sources.append(str(path))
    if len(samples) < q.samples:
        log(f"int8: {len(samples)} calibration sample(s) found, quantize.samples asks {q.samples}: using those")
    return samples, sources


def samples_digest(samples: list[dict]) -> str:
    h = hashlib.sha256()
    for s in samples:
        for k, v in sorted(s.items()):
            h.update(k.encode() + str(v.shape).encode() + np.ascontiguousarray(v).tobytes())
    return h.hexdigest()
