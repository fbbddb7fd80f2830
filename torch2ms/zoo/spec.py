"""Zoo files: many recipes in one YAML, converted as a batch by ``torch2ms zoo``.

```yaml
defaults:            # a partial recipe merged under every model
  check: {samples: 1}
models:
  - {name: resnet18, model: {factory: "torchvision.models:resnet18", kwargs: {weights: null}},
     inputs: [{shape: [1, 3, 224, 224]}]}
  - {recipe: ../resnet50.yaml, check: {samples: 2}}   # a recipe file (relative to this file) + overrides
  - {name: vit_b_16, timeout: 3600, max_memory_mb: 12000, ...}   # own limits (also in defaults), over the options
```

Merge order, later wins: ``defaults`` < the recipe file (if any) < the entry's own keys. Mappings
merge key by key; anything else (lists such as ``inputs``, scalars) is replaced whole. Every merged
model is validated as a recipe; problems are reported all at once, each under the path where it
was written: ``defaults.compile.graph_kernal``, ``models[3].inputs.0.shape`` or the recipe file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torch2ms.errors import RecipeError
from torch2ms.recipe import Recipe, error_message, parse_recipe, read_yaml


class ZooFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: dict[str, Any] = Field(default_factory=dict, description="partial recipe merged under every model")
    models: list[dict[str, Any]] = Field(min_length=1, description="inline recipes, or {recipe: path} plus overrides")


@dataclass(frozen=True)
class ZooModel:
    name: str
    recipe: Recipe
    data: dict  # the merged recipe as plain data (what the worker validates again)
    source: str  # where it came from, for messages: "zoo.yaml: models[3]"
    timeout: float | None = None  # the entry's own limits; None: the command's --timeout / --max-memory
    max_memory_mb: float | None = None


LIMITS = {"timeout": "seconds", "max_memory_mb": "MB"}


def _pop_limits(data: dict, where: str, problems: list[str]) -> dict:
    """Take the zoo's own keys (limits of the worker, not recipe fields) out of ``data``."""
    out = {}
    for key, unit in LIMITS.items():
        v = data.pop(key, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            problems.append(f"  {where}.{key}: expected a positive number of {unit}, got {v!r}")
        else:
            out[key] = float(v)
    return out


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else copy.deepcopy(v)
    return out


def _has_path(data: Any, loc: tuple) -> bool:
    """Whether ``data`` spells out the first key(s) of an error location (so the error is its)."""
    if not loc:
        return True
    if isinstance(data, dict) and loc[0] in data:
        return _has_path(data[loc[0]], loc[1:]) if isinstance(data[loc[0]], dict) else True
    return False


def load_zoo(path: str | Path) -> list[ZooModel]:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: zoo file not found", hint="pass a zoo YAML, e.g. recipes/zoo/torchvision.yaml")
    return parse_zoo(read_yaml(path), str(path), path.parent)


def parse_zoo(raw: Any, source: str, base_dir: Path) -> list[ZooModel]:
    zoo = _validated_zoo(raw, source)
    problems: list[str] = []
    models: list[ZooModel] = []
    defaults = dict(zoo.defaults)
    default_limits = _pop_limits(defaults, "defaults", problems)
    seen: dict[str, int] = {}
    for i, entry in enumerate(zoo.models):
        where = f"models[{i}]"
        entry = dict(entry)
        ref = entry.pop("recipe", None)
        n_problems = len(problems)
        limits = {**default_limits, **_pop_limits(entry, where, problems)}
        if len(problems) > n_problems:
            continue
        file_data, entry_base = {}, base_dir
        if ref is not None:
            found = _recipe_file(ref, where, base_dir, problems)
            if found is None:
                continue
            file_data, entry_base = found
        merged = deep_merge(deep_merge(defaults, file_data), entry)
        label = f"{where} ({merged.get('name', 'unnamed')})"
        try:
            recipe = Recipe.model_validate({**merged, "base_dir": str(entry_base)})
        except ValidationError as err:
            _place_problems(err, label, (entry, ref, file_data, defaults), problems)
            continue
        if recipe.name in seen:
            problems.append(
                f"  {where}.name: {recipe.name!r} is already used by models[{seen[recipe.name]}];"
                " names must be unique (each is a run folder)"
            )
            continue
        seen[recipe.name] = i
        # Validate exactly as the worker will, so a model never fails late on its recipe.
        parse_recipe(merged, f"{source}: {label}", entry_base)
        models.append(ZooModel(recipe.name, recipe, merged, f"{source}: {label}", **limits))
    if problems:
        n = len(problems)
        raise RecipeError(f"{source}: invalid zoo file ({n} problem{'s' if n > 1 else ''}):\n" + "\n".join(problems))
    return models


def _validated_zoo(raw: Any, source: str) -> ZooFile:
    """The zoo file's top level checked against ``ZooFile``; every problem named at once."""
    if not isinstance(raw, dict):
        raise RecipeError(
            f"{source}: a zoo file must be a YAML mapping with `models:` (and optional `defaults:`),"
            f" got {type(raw).__name__}"
        )
    try:
        return ZooFile.model_validate(raw)
    except ValidationError as err:
        lines = [f"{source}: invalid zoo file:"]
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"  {loc}: {error_message(e, ZooFile)}")
        raise RecipeError("\n".join(lines)) from None


def _recipe_file(ref, where: str, base_dir: Path, problems: list[str]) -> tuple[dict, Path] | None:
    """A model's ``recipe:`` file read (its data, its folder); None, with the problem noted, if it
    cannot be."""
    if not isinstance(ref, str):
        problems.append(f"  {where}.recipe: expected a path to a recipe YAML, got {type(ref).__name__}")
        return None
    rpath = Path(ref) if Path(ref).is_absolute() else base_dir / ref
    if not rpath.is_file():
        problems.append(f"  {where}.recipe: {rpath}: file not found (paths are relative to the zoo file's folder)")
        return None
    try:
        file_data = read_yaml(rpath) or {}
    except RecipeError as err:
        problems.append(f"  {where}.recipe: {err.message}")
        return None
    if not isinstance(file_data, dict):
        problems.append(f"  {where}.recipe: {rpath}: a recipe must be a YAML mapping")
        return None
    return file_data, rpath.parent


def _place_problems(err: ValidationError, label: str, sources: tuple, problems: list[str]) -> None:
    """Each recipe error named where it was written: the model's entry, its recipe file, or the
    zoo's defaults (once). ``sources``: (entry, recipe reference, recipe file data, defaults)."""
    entry, ref, file_data, defaults = sources
    for e in err.errors():
        loc = tuple(e["loc"])
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        if _has_path(entry, loc):
            problems.append(f"  {label}.{dotted}: {error_message(e)}")
        elif ref is not None and _has_path(file_data, loc):
            problems.append(f"  {label}: {ref}: {dotted}: {error_message(e)}")
        elif _has_path(defaults, loc):
            msg = f"  defaults.{dotted}: {error_message(e)}"
            if msg not in problems:
                problems.append(msg)
        else:
            problems.append(f"  {label}.{dotted}: {error_message(e)}")


def select(models: list[ZooModel], only: str | None, source: str) -> list[ZooModel]:
    """The models named in ``--only a,b`` (in zoo order); all when ``only`` is empty."""
    if not only:
        return models
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    names = {m.name for m in models}
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise RecipeError(
            f"--only: {', '.join(unknown)} not in {source}", hint=f"choose from: {', '.join(m.name for m in models)}"
        )
    return [m for m in models if m.name in wanted]
