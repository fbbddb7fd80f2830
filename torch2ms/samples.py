"""The sample inputs every stage is checked on, made from the recipe's ``inputs``.

Per input, by ``dtype``:

* float32 / float16: seeded standard-normal values (one generator, ``check.seed``, drawn input by
  input and sample by sample), or the ``data`` files (``.npy`` or images) for the first samples;
* int64 / int32: uniform integers from ``range: [low, high)`` (token ids), or a mask from
  ``lengths`` (row ``i`` is 1 at its first ``lengths[i]`` positions, 0 after), or ``.npy`` data;
* bool: a ``lengths`` mask, ``.npy`` data, or seeded random bits.

``.npy`` data must hold values the input's dtype represents exactly: an integer input takes an
integer or bool file, or a float file whose values are whole numbers in the dtype's range.
"""

from __future__ import annotations

import numpy as np

from torch2ms.errors import RecipeError


def random_input(spec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One seeded sample of input ``spec`` at ``shape`` (the recipe's, or another batch size)."""
    if spec.lengths is not None:
        lengths = np.resize(np.asarray(spec.lengths), shape[0])  # one value for every row, or cycled per row
        mask = np.arange(shape[1])[None, :] < lengths[:, None]
        return mask.astype(spec.dtype)
    if spec.range is not None:
        low, high = spec.range
        return rng.integers(low, high, shape, dtype=np.int64).astype(spec.dtype)
    if spec.dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.standard_normal(shape).astype(spec.dtype)


def sample_inputs(recipe) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(recipe.check.seed)
    samples = []
    for k in range(recipe.check.samples):
        sample = {}
        for spec in recipe.inputs:
            sources = spec.data_sources()
            if k < len(sources):
                arr = load_sample(recipe, sources[k], spec)
            else:
                arr = random_input(spec, spec.shape, rng)
            sample[spec.name] = arr
        samples.append(sample)
    return samples


def batch_samples(recipe) -> dict[int, dict[str, np.ndarray]]:
    """One seeded sample per size of ``inputs[].batch`` other than shape[0] (the reference's):
    dimension 0 of the inputs that list the sizes is that size, the other inputs keep their shape."""
    batched = [i for i in recipe.inputs if len(i.batch_sizes()) > 1]
    out = {}
    for n in batched[0].batch_sizes() if batched else ():
        if n == batched[0].shape[0]:
            continue
        rng = np.random.default_rng([recipe.check.seed, n])
        out[n] = {
            i.name: random_input(i, (n, *i.shape[1:]) if len(i.batch_sizes()) > 1 else i.shape, rng)
            for i in recipe.inputs
        }
    return out


def sequence_samples(recipe) -> dict[int, dict[str, np.ndarray]]:
    """One seeded sample per length of ``inputs[].sequence`` other than shape[1] (the reference's),
    at the reference batch: dimension 1 of the inputs that list the lengths is that length."""
    out = {}
    for n in recipe.sequence_lengths() or ():
        profiled = [i for i in recipe.inputs if i.sequence is not None]
        if n == profiled[0].shape[1]:
            continue
        rng = np.random.default_rng([recipe.check.seed, 1, n])
        out[n] = {
            i.name: random_input(i, (i.shape[0], n, *i.shape[2:]) if i.sequence else i.shape, rng)
            for i in recipe.inputs
        }
    return out


def load_sample(recipe, entry: str, spec) -> np.ndarray:
    """One ``inputs[].data`` entry as the input's array: a .npy file, or an image (float inputs)."""
    path = recipe.resolve_data(entry)
    field = f"inputs.{spec.name}.data"
    if not entry.endswith(".npy"):
        from torch2ms.postprocess.image import image_sample

        return image_sample(path, spec.shape, recipe, field).astype(spec.dtype)
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise RecipeError(f"{field}: cannot read {path} as .npy ({err})") from None
    if tuple(arr.shape) != tuple(spec.shape):
        raise RecipeError(f"{field}: {path} has shape {list(arr.shape)}, the recipe says {list(spec.shape)}")
    if spec.dtype in ("float32", "float16"):
        return arr.astype(spec.dtype)
    if arr.dtype.kind not in "biuf":
        raise RecipeError(f"{field}: {path} holds {arr.dtype} values; a {spec.dtype} input needs numbers")
    if spec.dtype == "bool":
        if not np.isin(arr, (0, 1)).all():
            raise RecipeError(f"{field}: {path} holds values other than 0 and 1; a bool input takes a 0/1 mask")
        return arr.astype(bool)
    info = np.iinfo(spec.dtype)
    if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise RecipeError(f"{field}: {path} holds fractional values; a {spec.dtype} input takes whole numbers")
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise RecipeError(
            f"{field}: {path} holds values {arr.min()}..{arr.max()} outside {spec.dtype} ({info.min}..{info.max})"
        )
    return arr.astype(spec.dtype)
