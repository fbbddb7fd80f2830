"""Recipes: the typed YAML that drives a conversion.

A recipe says which model to build (``factory`` + ``kwargs``, optional ``checkpoint``), which
inputs it takes, how strictly every stage is checked against PyTorch, and the options of each
stage. Unknown keys and wrong types are errors naming the field path, e.g.
``recipes/x.yaml: compile.graph_kernel: Input should be 'auto', 'on' or 'off'``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from torch2ms.errors import RecipeError

STAGES = ("export", "rebuild", "fold", "compile", "mindir")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    factory: str = Field(description="'module:callable' returning a torch.nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    checkpoint: str | None = Field(default=None, description="state_dict file, loaded with weights_only=True")
    seed: int = Field(default=0, description="torch seed for random init when no checkpoint is given")
    randomize_norm: bool = Field(
        default=True,
        description="without a checkpoint, give BatchNorm non-trivial statistics and affine "
        "parameters (seeded) so that the checks exercise them",
    )

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, v: str) -> str:
        module, sep, attr = v.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"expected 'module:callable', got {v!r}")
        return v


class InputSpec(_Strict):
    name: str = "input"
    shape: tuple[int, ...]
    dtype: Literal["float32"] = "float32"
    data: str | None = Field(default=None, description=".npy file with sample data of this shape")

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be a positive integer, got {list(v)}")
        return v


class CheckSpec(_Strict):
    samples: int = Field(default=2, ge=1, le=64)
    seed: int = 0
    rel_error: float = Field(default=1e-4, gt=0, le=1, description="max |a-b| / max |reference|")
    cosine: float = Field(default=0.99999, ge=0.5, le=1)
    argmax_agreement: float = Field(default=0.0, ge=0, le=1, description="minimum argmax agreement (0: report only)")
    task_agreement: float | None = Field(
        default=None, ge=0, le=1, description="minimum task agreement with PyTorch (default: the task's own gate)"
    )


class ExportSpec(_Strict):
    opset: int = Field(default=17, ge=11, le=23)


class RebuildSpec(_Strict):
    fuse_conv_bn_act: bool = True


class FoldSpec(_Strict):
    enabled: bool = True


class CompileSpec(_Strict):
    graph_kernel: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: build with and without graph-kernel fusion, keep the faster"
    )
    graph_kernel_flags: str = ""
    jit_level: Literal["O0", "O1", "O2"] | None = None
    warmup: int = Field(default=2, ge=0)
    runs: int = Field(default=10, ge=1)


class MindirSpec(_Strict):
    enabled: bool = True


class PreprocessSpec(_Strict):
    """How raw images become the model input (used by packaging; not applied by the checks)."""

    resize: tuple[int, int] | None = None
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    color: Literal["rgb", "bgr"] = "rgb"
    scale: float = Field(default=1 / 255, gt=0)


class Recipe(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    task: Literal["classification", "segmentation", "detection", "other"] = "other"
    model: ModelSpec
    inputs: tuple[InputSpec, ...] = Field(min_length=1)
    check: CheckSpec = CheckSpec()
    export: ExportSpec = ExportSpec()
    rebuild: RebuildSpec = RebuildSpec()
    fold: FoldSpec = FoldSpec()
    compile: CompileSpec = CompileSpec()
    mindir: MindirSpec = MindirSpec()
    preprocess: PreprocessSpec = PreprocessSpec()
    class_names: tuple[str, ...] | None = None
    output: str = "runs"
    # Where the recipe file lives: relative paths in it are resolved against this folder.
    base_dir: str = Field(default=".", exclude=True)

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def stage_config(self, stage: str) -> dict[str, Any]:
        """The part of the recipe a stage depends on (its fingerprint input)."""
        common = {
            "check": self.check.model_dump(mode="json"),
            "inputs": [i.model_dump(mode="json") for i in self.inputs],
        }
        if stage == "export":
            from torch2ms.model_loader import factory_source_sha256

            model = self.model.model_dump(mode="json")
            source = factory_source_sha256(self.model.factory, [Path.cwd(), Path(self.base_dir).resolve()])
            if source:
                model["factory_source_sha256"] = source
            if self.model.checkpoint:
                path = self.resolve(self.model.checkpoint)
                if not path.is_file():
                    raise RecipeError(
                        f"model.checkpoint: {path}: file not found",
                        hint="check the path (a relative path starts at the recipe's folder)",
                    )
                model["checkpoint_sha256"] = file_sha256(path)
            # the sample data's bytes, not only its path: new data in the same file is a new reference
            data = {}
            for i in self.inputs:
                if i.data:
                    path = self.resolve(i.data)
                    if not path.is_file():
                        raise RecipeError(
                            f"inputs.{i.name}.data: {path}: file not found",
                            hint="check the path (a relative path starts at the recipe's folder)",
                        )
                    data[i.name] = file_sha256(path)
            return {
                **common,
                "model": model,
                "export": self.export.model_dump(mode="json"),
                **({"inputs_data_sha256": data} if data else {}),
            }
        return {**common, stage: getattr(self, stage).model_dump(mode="json")}

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    except FileNotFoundError:
        raise RecipeError(
            f"{path}: file not found", hint="check the path in the recipe (relative paths start at the recipe's folder)"
        ) from None
    return h.hexdigest()


def _fields_at(loc: tuple) -> list[str]:
    """The keys allowed in the mapping that holds ``loc``'s last key (``compile.x`` -> CompileSpec's)."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        candidates = [field.annotation, *get_args(field.annotation)]
        nested = [t for t in candidates if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return [k for k in model.model_fields if k != "base_dir"]


def _format_validation(source: str, err: ValidationError) -> str:
    errors = err.errors()
    # pydantic also says "inputs: should have at least 1 item" when an item failed: noise
    errors = [
        e
        for e in errors
        if not (
            e["type"] == "too_short"
            and any(len(o["loc"]) > len(e["loc"]) and o["loc"][: len(e["loc"])] == e["loc"] for o in errors)
        )
    ]
    lines = [f"{source}: invalid recipe ({len(errors)} problem{'s' if len(errors) > 1 else ''}):"]
    for e in errors:
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(e["loc"])
            close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
            msg = (
                "unknown key"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
            )
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif "input" in e and not isinstance(e["input"], (dict, list)):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_recipe(data: Any, source: str = "<recipe>", base_dir: str | Path = ".") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    try:
        return Recipe.model_validate({**data, "base_dir": str(base_dir)})
    except ValidationError as err:
        raise RecipeError(_format_validation(source, err)) from None


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(
            f"{path}: recipe file not found",
            hint="pass an existing YAML file with --recipe, e.g. recipes/deeplabv3plus.yaml",
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse_recipe(data, str(path), base_dir=path.parent)
