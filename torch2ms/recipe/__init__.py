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
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from torch2ms.errors import RecipeError
from torch2ms.recipe.base import _Strict
from torch2ms.recipe.deploy import (
    KeypointsSpec,
    MasksSpec,
    PostprocessSpec,
    PrecisionSpec,
    PreprocessSpec,
    QuantizeSpec,
)
from torch2ms.recipe.generate import GenerateSpec
from torch2ms.recipe.inputs import (
    IMAGE_SUFFIXES,
    INPUT_DTYPES,
    INTEGER_DTYPES,
    MAX_BATCH,
    SKIMAGE_PREFIX,
    InputSpec,
    ModelSpec,
)
from torch2ms.recipe.stages import (
    CheckSpec,
    CompileSpec,
    ExportSpec,
    FoldSpec,
    FusionSpec,
    MindirSpec,
    RebuildSpec,
)


class Recipe(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    task: Literal[
        "classification",
        "segmentation",
        "detection",
        "language_model",
        "sequence_classification",
        "embedding",
        "text_generation",
        "text_detection",
        "text_recognition",
        "face_detection",
        "other",
    ] = "other"
    model: ModelSpec
    inputs: tuple[InputSpec, ...] = Field(default=(), validate_default=True)
    check: CheckSpec = CheckSpec()
    export: ExportSpec = ExportSpec()
    rebuild: RebuildSpec = RebuildSpec()
    fold: FoldSpec = FoldSpec()
    compile: CompileSpec = CompileSpec()
    mindir: MindirSpec = MindirSpec()
    precision: PrecisionSpec = PrecisionSpec()
    quantize: QuantizeSpec | None = None
    preprocess: PreprocessSpec = PreprocessSpec()
    class_names: tuple[str, ...] | None = None
    postprocess: PostprocessSpec | None = None
    generate: GenerateSpec | None = None
    converters: tuple[str, ...] = Field(
        default=(),
        description="converter plugins: modules importable from the current folder or the recipe's folder "
        "(e.g. my_package.t2ms_ops) whose @torch2ms.converter functions convert ops torch2ms has no "
        "converter for (docs/custom_ops.md)",
    )
    output: str = "runs"
    # Where the recipe file lives: relative paths in it are resolved against this folder.
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("inputs")
    @classmethod
    def _inputs_for_task(cls, v, info: ValidationInfo):
        generation = info.data.get("task") == "text_generation"
        if generation and v:
            raise ValueError(
                "task: text_generation takes no inputs: its graphs' inputs (token ids, masks, the cache) come "
                "from the generate section"
            )
        if not generation and not v:
            raise PydanticCustomError("missing", "Field required")
        return v

    @model_validator(mode="after")
    def _task_generate(self):
        if self.task == "text_generation" and self.generate is None:
            raise ValueError("task: text_generation needs a generate section (prompts, max_new_tokens, cache_length)")
        if self.generate is not None and self.task != "text_generation":
            raise ValueError(f"generate is for task: text_generation (task is {self.task!r})")
        return self

    @model_validator(mode="after")
    def _task_postprocess(self):
        if self.task == "detection" and self.postprocess is None:
            raise ValueError("task: detection needs a postprocess section (format, nc, ...)")
        if self.postprocess is not None and self.task != "detection":
            raise ValueError(f"postprocess is for task: detection (task is {self.task!r})")
        if self.task == "detection" and self.class_names is not None:
            raise ValueError("task: detection takes its class names in postprocess.class_names")
        return self

    @model_validator(mode="after")
    def _integer_values(self):
        for k, i in enumerate(self.inputs):
            given = len(i.data_sources())
            if i.dtype in INTEGER_DTYPES and i.range is None and i.lengths is None and given < self.check.samples:
                where = f"inputs.{k} ({i.name})"
                raise ValueError(
                    f"{where}: an {i.dtype} input needs its values: 'range: [low, high)' (e.g. [0, 30522] for token "
                    f"ids), 'lengths: [...]' for a mask, or 'data:' .npy files for all {self.check.samples} samples"
                    + (f" (it has {given})" if given else "")
                )
        return self

    @model_validator(mode="after")
    def _one_batch_list(self):
        lists = {i.batch_sizes() for i in self.inputs if len(i.batch_sizes()) > 1}
        if len(lists) > 1:
            raise ValueError(
                f"inputs list different batch sizes ({' vs '.join(str(list(s)) for s in sorted(lists))}): the board "
                "tools take one list for every input whose dimension 0 is the batch"
            )
        return self

    @model_validator(mode="after")
    def _one_sequence_list(self):
        lists = {i.sequence_lengths() for i in self.inputs if i.sequence is not None}
        if len(lists) > 1:
            raise ValueError(
                f"inputs list different sequence lengths ({' vs '.join(str(list(s)) for s in sorted(lists))}): "
                "give one list for every input whose dimension 1 is the sequence"
            )
        profiled = [i for i in self.inputs if i.sequence is not None]
        if profiled:
            same = [
                i.name
                for i in self.inputs
                if i.sequence is None and len(i.shape) > 1 and i.shape[:2] == profiled[0].shape[:2]
            ]
            if same:
                raise ValueError(
                    f"inputs {same} have the (batch, sequence) shape of {profiled[0].name!r} but no sequence list: "
                    "give every token input the same sequence list"
                )
        return self

    def sequence_lengths(self) -> tuple[int, ...] | None:
        """The sequence lengths a sequence-length profile serves (``inputs[].sequence``), or None."""
        for i in self.inputs:
            if i.sequence is not None:
                return i.sequence_lengths()
        return None

    def batch_sizes(self) -> tuple[int, ...] | None:
        """The batch sizes a dynamic-batch bundle serves (``inputs[].batch`` with more than one size),
        or None: the network is served at the recipe's shapes only."""
        for i in self.inputs:
            if len(i.batch_sizes()) > 1:
                return i.batch_sizes()
        return None

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def resolve_data(self, entry: str) -> Path:
        """The file an ``inputs[].data`` entry names ('skimage:<name>': the photo in scikit-image's data folder)."""
        if not entry.startswith(SKIMAGE_PREFIX):
            return self.resolve(entry)
        try:
            import skimage.data
        except ImportError:
            raise RecipeError(f"{entry}: scikit-image is not installed", hint="pip install scikit-image") from None
        folder = Path(skimage.data.__file__).parent
        name = entry[len(SKIMAGE_PREFIX) :]
        found = sorted(p for p in folder.iterdir() if p.stem == name and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            shipped = sorted(p.stem for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            raise RecipeError(f"{entry}: scikit-image ships no photo {name!r}", hint=f"one of: {', '.join(shipped)}")
        return found[0]

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _fields_at(loc: tuple, model: type[BaseModel] | None = None) -> list[str]:
    """The keys allowed in the mapping that holds ``loc``'s last key (``compile.x`` -> CompileSpec's)."""
    model = model or Recipe
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
        lines.append(f"  {loc}: {error_message(e)}")
    return "\n".join(lines)


def error_message(e: dict, model: type[BaseModel] | None = None) -> str:
    """One pydantic error of a recipe (or of ``model``) as the user reads it: an unknown key gets a
    did-you-mean and the keys allowed there."""
    if e["type"] == "extra_forbidden":
        allowed = _fields_at(e["loc"], model)
        close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
        return (
            "unknown key"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
        )
    if e["type"] == "missing":
        return "required field is missing"
    if "input" in e and not isinstance(e["input"], (dict, list)):
        return f"{e['msg']} (got {e['input']!r})"
    return e["msg"]


def parse_recipe(data: Any, source: str = "<recipe>", base_dir: str | Path = ".") -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    try:
        return Recipe.model_validate({**data, "base_dir": str(base_dir)})
    except ValidationError as err:
        raise RecipeError(_format_validation(source, err)) from None


def read_yaml(path: Path):
    """Parse a YAML file; a syntax error names the file, line and column."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(
            f"{path}: recipe file not found",
            hint="pass an existing YAML file with --recipe, e.g. recipes/deeplabv3plus.yaml",
        )
    return parse_recipe(read_yaml(path), str(path), base_dir=path.parent)


__all__ = [
    "Recipe",
    "error_message",
    "load_recipe",
    "parse_recipe",
    "read_yaml",
    "CheckSpec",
    "CompileSpec",
    "ExportSpec",
    "FoldSpec",
    "FusionSpec",
    "GenerateSpec",
    "IMAGE_SUFFIXES",
    "INPUT_DTYPES",
    "INTEGER_DTYPES",
    "InputSpec",
    "KeypointsSpec",
    "MAX_BATCH",
    "MasksSpec",
    "MindirSpec",
    "ModelSpec",
    "PostprocessSpec",
    "PrecisionSpec",
    "PreprocessSpec",
    "QuantizeSpec",
    "RebuildSpec",
    "SKIMAGE_PREFIX",
]
