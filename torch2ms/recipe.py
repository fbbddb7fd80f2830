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
import re
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from torch2ms.errors import RecipeError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    factory: str | None = Field(default=None, description="'module:callable' returning a torch.nn.Module")
    onnx: str | None = Field(
        default=None,
        description="an ONNX file as the source instead of a factory: validated and imported by the export "
        "stage; onnxruntime's outputs on the samples are the reference (torch2ms.export.onnx_file)",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict)
    checkpoint: str | None = Field(default=None, description="state_dict file, loaded with weights_only=True")
    seed: int = Field(default=0, description="torch seed for random init when no checkpoint is given")
    init: Literal["calibrated", "randomized", "as_is"] = Field(
        default="calibrated",
        description="without a checkpoint: 'calibrated' gives BatchNorm seeded non-trivial gamma/beta, then "
        "statistics measured by train-mode passes on seeded inputs (trained-like activation ranges); "
        "'randomized' seeds random statistics too (activations can explode with depth); 'as_is' keeps "
        "the factory's initialisation",
    )

    @model_validator(mode="after")
    def _one_source(self):
        if (self.factory is None) == (self.onnx is None):
            raise ValueError("give one source: factory ('module:callable') or onnx (a .onnx file)")
        if self.onnx is not None and (self.checkpoint or self.kwargs):
            raise ValueError("checkpoint and kwargs are for a factory; an onnx source holds its weights")
        return self

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        module, sep, attr = v.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"expected 'module:callable', got {v!r}")
        return v


# The largest batch size ATC accepts in --dynamic_batch_size (CANN ATC docs: each size in [1, 2048]).
MAX_BATCH = 2048
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
SKIMAGE_PREFIX = "skimage:"


INPUT_DTYPES = ("float32", "float16", "int64", "int32", "bool")
INTEGER_DTYPES = ("int64", "int32")


class InputSpec(_Strict):
    name: str = "input"
    shape: tuple[int, ...]
    dtype: Literal["float32", "float16", "int64", "int32", "bool"] = Field(
        default="float32",
        description="float inputs get seeded standard-normal samples; an int64/int32 input needs 'range' "
        "(e.g. token ids) or 'lengths' (a mask) or 'data'; a bool input without them gets seeded random bits",
    )
    range: tuple[int, int] | None = Field(
        default=None,
        description="integer inputs: sample values uniformly from [low, high), e.g. [0, 30522] for BERT token ids",
    )
    lengths: tuple[int, ...] | None = Field(
        default=None,
        description="a mask input (batch, sequence): row i is 1 (True) at its first lengths[i] positions and 0 "
        "after, e.g. [8, 5] for two sequences of 8 and 5 tokens; one value for every row, or one per row",
    )
    data: str | tuple[str, ...] | None = Field(
        default=None,
        description="sample data, one entry per sample from sample 0 on: a .npy of this shape, an image file "
        "(preprocessed like the bundle's infer.py does) or 'skimage:<name>' (a photo scikit-image ships, e.g. "
        "skimage:astronaut)",
    )
    batch: int | tuple[int, ...] | None = Field(
        default=None,
        description="the batch sizes the bundle serves, e.g. [1, 2, 4, 8] (dimension 0; shape[0], the batch "
        "the reference samples are made at, must be one of them); a single value is shape[0], as without it",
    )
    sequence: tuple[int, ...] | None = Field(
        default=None,
        description="a sequence-length profile: the lengths (dimension 1) the converted network and the bundle "
        "take, e.g. [16, 32, 64]; shape[1], the length the reference samples are made at, must be one of them",
    )

    @model_validator(mode="after")
    def _values_spec(self):
        if self.range is not None:
            if self.dtype not in INTEGER_DTYPES:
                raise ValueError(f"range is for integer inputs (dtype int64 or int32), dtype is {self.dtype!r}")
            low, high = self.range
            if low >= high:
                raise ValueError(f"range [{low}, {high}) is empty: give [low, high) with low < high")
            info = np.iinfo(self.dtype)
            if low < info.min or high - 1 > info.max:
                raise ValueError(f"range [{low}, {high}) does not fit {self.dtype} ({info.min}..{info.max})")
            if self.lengths is not None:
                raise ValueError("range and lengths both given: range samples values, lengths makes a mask; keep one")
        if self.lengths is not None:
            if len(self.shape) != 2:
                raise ValueError(f"lengths makes a (batch, sequence) mask; shape {list(self.shape)} is not 2-D")
            if len(self.lengths) not in (1, self.shape[0]):
                raise ValueError(
                    f"lengths has {len(self.lengths)} values: give one for every row, or one per row "
                    f"({self.shape[0]} rows)"
                )
            bad = [n for n in self.lengths if not 0 <= n <= self.shape[1]]
            if bad:
                raise ValueError(f"lengths {bad} outside 0..{self.shape[1]} (the sequence length, shape[1])")
        if self.dtype != "float32" and self.dtype != "float16":
            images = [e for e in self.data_sources() if not e.lower().endswith(".npy")]
            if images:
                raise ValueError(f"{images[0]!r}: an image is float data; a {self.dtype} input takes .npy files")
        return self

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        """``[]`` is a scalar (a rank-0 input: a threshold, a sample rate); every dimension is positive."""
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be a positive integer, got {list(v)}")
        return v

    @field_validator("data")
    @classmethod
    def _data_kind(cls, v):
        for entry in (v,) if isinstance(v, str) else v or ():
            if entry.startswith(SKIMAGE_PREFIX):
                if not entry[len(SKIMAGE_PREFIX) :].isidentifier():
                    raise ValueError(f"{entry!r}: expected 'skimage:<name>', e.g. 'skimage:astronaut'")
            elif not entry.lower().endswith((".npy", *IMAGE_SUFFIXES)):
                raise ValueError(
                    f"{entry!r}: expected a .npy file, an image ({', '.join(IMAGE_SUFFIXES)}) or 'skimage:<name>'"
                )
        return v

    @field_validator("batch")
    @classmethod
    def _batch_values(cls, v):
        sizes = (v,) if isinstance(v, int) else v
        if sizes is not None:
            if not sizes:
                raise ValueError("an empty list: give the batch sizes to serve, e.g. [1, 2, 4, 8]")
            bad = [b for b in sizes if isinstance(b, bool) or b < 1 or b > MAX_BATCH]
            if bad:
                raise ValueError(f"batch sizes are integers from 1 to {MAX_BATCH} (ATC's limit), got {bad}")
            if len(set(sizes)) != len(sizes):
                raise ValueError(f"{list(sizes)} lists a size twice")
        return v

    @model_validator(mode="after")
    def _batch_holds_shape(self):
        if not self.shape:
            if self.batch is not None:
                raise ValueError("batch lists sizes for dimension 0; a scalar (shape []) has none")
            return self
        sizes = self.batch_sizes()
        if self.shape[0] not in sizes:
            raise ValueError(
                f"batch {list(sizes)} does not include shape[0]={self.shape[0]}, the batch the reference samples "
                f"are made at: add it, or set shape[0] to one of them"
            )
        return self

    @model_validator(mode="after")
    def _sequence_values(self):
        if self.sequence is None:
            return self
        if len(self.shape) < 2:
            raise ValueError(f"sequence lists lengths for dimension 1; shape {list(self.shape)} has none")
        if not self.sequence:
            raise ValueError("sequence is an empty list: give the lengths to serve, e.g. [16, 32, 64]")
        bad = [n for n in self.sequence if isinstance(n, bool) or n < 1]
        if bad:
            raise ValueError(f"sequence lengths are positive integers, got {bad}")
        if len(set(self.sequence)) != len(self.sequence):
            raise ValueError(f"sequence {list(self.sequence)} lists a length twice")
        if self.shape[1] not in self.sequence:
            raise ValueError(
                f"sequence {list(self.sequence)} does not include shape[1]={self.shape[1]}, the length the reference "
                "samples are made at: add it, or set shape[1] to one of them"
            )
        if self.lengths is not None and max(self.lengths) > min(self.sequence):
            raise ValueError(
                f"lengths {list(self.lengths)} make a mask longer than the shortest sequence length "
                f"{min(self.sequence)}: give lengths up to {min(self.sequence)}"
            )
        return self

    def sequence_lengths(self) -> tuple[int, ...]:
        """The sequence lengths (dimension 1) this input is served at, ascending (``(shape[1],)``
        without ``sequence``; ``()`` for an input of rank 1)."""
        if self.sequence is None:
            return tuple(self.shape[1:2])
        return tuple(sorted(self.sequence))

    def batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes this input is served at, ascending (``(shape[0],)`` without ``batch``;
        ``()`` for a scalar)."""
        if self.batch is None:
            return tuple(self.shape[:1])
        return tuple(sorted((self.batch,) if isinstance(self.batch, int) else self.batch))

    def data_sources(self) -> tuple[str, ...]:
        return (self.data,) if isinstance(self.data, str) else tuple(self.data or ())


class CheckSpec(_Strict):
    samples: int = Field(default=2, ge=1, le=64)
    seed: int = 0
    rel_error: float = Field(default=1e-4, gt=0, le=1, description="max |a-b| / max |reference|")
    cosine: float = Field(default=0.99999, ge=0.5, le=1)
    argmax_agreement: float = Field(default=0.0, ge=0, le=1, description="minimum argmax agreement (0: report only)")
    noise_factor: float = Field(
        default=10.0,
        ge=0,
        description="a stage also passes within this many times onnxruntime's own distance from PyTorch "
        "(the network's float32 noise floor, measured at export) when that is looser; 0: the recipe's bound only",
    )
    ceiling: float = Field(
        default=1e-3,
        gt=0,
        description="the widest relative error a widened bound (noise_factor) passes without evidence that every "
        "node is right (diff's replay; for export, model.onnx in float64 against PyTorch in float64); beyond it a "
        "stage without that evidence is 'not checkable'",
    )
    task_agreement: float | None = Field(
        default=None, ge=0, le=1, description="minimum task agreement with PyTorch (default: the task's own gate)"
    )


class ExportSpec(_Strict):
    opset: int = Field(
        default=17,
        ge=11,
        le=23,
        description="the first ONNX opset to try; if the TorchScript exporter fails there, newer ones up to "
        "the newest it writes are tried",
    )
    exporter: Literal["auto", "torchscript", "dynamo"] = Field(
        default="auto",
        description="auto: the TorchScript exporter (BatchNorm kept), then the dynamo exporter if it cannot "
        "export the model; torchscript or dynamo: that path only",
    )


class RebuildSpec(_Strict):
    fuse_conv_bn_act: bool = True
    layout: Literal["modules", "flat"] = Field(
        default="modules",
        description="modules: network.py mirrors the PyTorch module tree (a class per module structure, "
        "PyTorch's parameter names); flat: one class, one statement per node",
    )


class FoldSpec(_Strict):
    enabled: bool = True
    ascend_rewrites: bool = Field(
        default=True,
        description="rewrite ops the Ascend 310 runs on AI CPU into AI Core equivalents (Pow with a constant "
        "exponent -> Mul/Sqrt/Reciprocal, padded MaxPool -> Pad + MaxPool, HardSwish/HardSigmoid and GroupNorm -> "
        "their formulas); checked against PyTorch like every fold rewrite",
    )


_OP_TYPE = r"[A-Z][A-Za-z0-9]*"
# Why exclude_modules is refused (docs/recipes.md, "Fusion rules"): MindSpore 2.10 reads its graph-kernel flags
# once per compiled graph from MS_DEV_GRAPH_KERNEL_FLAGS (set_context(graph_kernel_flags=...) is deprecated for
# it: mindspore/context.py), and GRAPH_MODE compiles the top cell with every sub-cell inlined; the one per-node
# opt-out of clustering, the ``keep_basic`` node attribute, is set by backend passes only (mindspore/ccsrc
# backend/common/graph_kernel/recognize_softmax_grad_ext.cc), with no Python API.
_NO_MODULE_SCOPE = (
    "MindSpore 2.10 cannot keep one module out of graph-kernel fusion: its flags apply to the whole compiled graph "
    "(MS_DEV_GRAPH_KERNEL_FLAGS), GRAPH_MODE inlines every sub-cell into it, and the per-node opt-out "
    "(keep_basic) has no Python API; keep that module's op types out with disable_cluster_ops instead"
)


class FusionSpec(_Strict):
    """Graph-kernel fusion rules (MindSpore's MS_DEV_GRAPH_KERNEL_FLAGS, rendered by
    ``torch2ms.runtime.graph_kernel.flags``): op types by their MindSpore primitive name (``Select``,
    ``MatMul``, ``BiasAdd``), as the fused kernels' names (``Fused_Select_Add_fusion``) show them."""

    enable_cluster_ops: tuple[str, ...] = Field(
        default=(),
        description="op types clustered into fused kernels besides MindSpore's defaults (--enable_cluster_ops)",
    )
    disable_cluster_ops: tuple[str, ...] = Field(
        default=(), description="op types kept out of fused kernels (--disable_cluster_ops)"
    )
    disable_expand_ops: tuple[str, ...] = Field(
        default=(),
        description="composite op types not expanded into basic ops (--disable_expand_ops)",
    )
    disable_fusion_pattern: tuple[str, ...] = Field(
        default=(), description="fusion patterns (passes) switched off by name (--disable_fusion_pattern)"
    )
    opt_level: int | None = Field(
        default=None, ge=0, le=3, description="graph-kernel optimisation level, 0 (none) to 3 (--opt_level)"
    )
    exclude_modules: tuple[str, ...] = Field(
        default=(),
        description="module paths to keep out of fusion (the article's classifier head): refused, "
        "MindSpore 2.10 cannot scope fusion to a module; give the op types in disable_cluster_ops",
    )

    @field_validator("enable_cluster_ops", "disable_cluster_ops", "disable_expand_ops", "disable_fusion_pattern")
    @classmethod
    def _names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in v if not re.fullmatch(_OP_TYPE, n)]
        if bad:
            raise ValueError(f"{bad}: expected MindSpore op type names such as 'Select' or 'MatMul'")
        return v

    @field_validator("exclude_modules")
    @classmethod
    def _no_module_scope(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v:
            raise ValueError(f"{list(v)}: {_NO_MODULE_SCOPE}")
        return v


class CompileSpec(_Strict):
    graph_kernel: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: build with and without graph-kernel fusion, keep the faster"
    )
    graph_kernel_flags: str = Field(
        default="",
        description="MS_DEV_GRAPH_KERNEL_FLAGS as written ('--opt_level=2 --disable_cluster_ops=Select'); "
        "compile.fusion's fields render into the same string and may not set a flag this sets too",
    )
    fusion: FusionSpec = Field(default_factory=FusionSpec)
    jit_level: Literal["O0", "O1", "O2"] | None = None
    warmup: int = Field(default=2, ge=0)
    runs: int = Field(default=10, ge=1)

    @field_validator("graph_kernel_flags")
    @classmethod
    def _flags_form(cls, v: str) -> str:
        from torch2ms.runtime.graph_kernel import parse_flags

        parse_flags(v)
        return v

    @model_validator(mode="after")
    def _flags_once(self):
        from torch2ms.runtime.graph_kernel import parse_flags, typed_flags

        both = sorted(set(parse_flags(self.graph_kernel_flags)) & set(typed_flags(self.fusion)))
        if both:
            raise ValueError(
                f"graph_kernel_flags sets --{', --'.join(both)}, which compile.fusion sets too: give each in one place"
            )
        return self


class MindirSpec(_Strict):
    enabled: bool = True


class PrecisionSpec(_Strict):
    """The fp16 plan (``torch2ms precision``, ``package --precision fp16``): which layers stay fp32 on the board."""

    fp16_rel_error: float = Field(
        default=1e-2,
        gt=0,
        le=1,
        description="max |fp16 - PyTorch| / max |PyTorch| per output allowed under fp16 on the board, as emulated "
        "in onnxruntime; layers are kept in fp32 (most sensitive first) until the emulated outputs are within it, "
        "and within check.task_agreement when the recipe sets it. fp16 rounds each value by up to 4.9e-4 and a deep "
        "network compounds many roundings, so ~1e-3..1e-2 is what a well-scaled network reaches",
    )
    int8_task_agreement: float = Field(
        default=0.99,
        ge=0,
        le=1,
        description="the INT8 plan's task gate: agreement with PyTorch (top-1, pixel, detection at box IoU >= 0.5) "
        "of the emulated INT8 network; layers are kept in float until it holds",
    )
    int8_rel_error: float = Field(
        default=0.2,
        gt=0,
        le=10,
        description="the INT8 plan's tensor bound, max |int8 - PyTorch| / max |PyTorch| per output: a guard beside "
        "the task gate (one int8 step is 1/255 of a tensor's range; a deep network compounds them)",
    )


class QuantizeSpec(_Strict):
    """INT8 calibration (``torch2ms precision --int8``, ``package --precision int8``)."""

    calibration: str | tuple[str, ...] = Field(
        description="calibration data, read through the recipe's preprocess like inputs[].data: a folder (its "
        "images and .npy files, sorted by name), or a list of entries (an image, a .npy, 'skimage:<name>'). A .npy "
        "holds one sample of the input's shape, or a stack of them along dimension 0 (a multiple of shape[0])"
    )
    samples: int = Field(default=32, ge=1, le=4096, description="calibration samples used (the first ones)")
    method: Literal["minmax", "percentile", "entropy"] = Field(
        default="minmax",
        description="activation ranges: minmax (observed extremes; converter_lite MAX_MIN), percentile (clip |x| at "
        "the given percentile; converter_lite REMOVAL_OUTLIER is the closest), entropy (TensorRT's KL threshold; "
        "converter_lite KL)",
    )
    percentile: float = Field(default=99.99, gt=50, le=100, description="method: percentile only")
    per_channel: bool = Field(default=True, description="weights: one symmetric scale per output channel")

    @field_validator("calibration")
    @classmethod
    def _entries(cls, v):
        entries = (v,) if isinstance(v, str) else v
        if not entries:
            raise ValueError("no calibration data: give a folder or a list of files")
        for entry in entries:
            if entry.startswith(SKIMAGE_PREFIX) and not entry[len(SKIMAGE_PREFIX) :].isidentifier():
                raise ValueError(f"{entry!r}: expected 'skimage:<name>', e.g. 'skimage:astronaut'")
        return v

    def entries(self) -> tuple[str, ...]:
        return (self.calibration,) if isinstance(self.calibration, str) else tuple(self.calibration)


class PreprocessSpec(_Strict):
    """How raw images become the model input (used by packaging; not applied by the checks)."""

    resize: tuple[int, int] | None = None
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    color: Literal["rgb", "bgr"] = "rgb"
    scale: float = Field(default=1 / 255, gt=0)


class MasksSpec(_Strict):
    """Instance masks (YOLO -seg): mask coefficients after the class scores, prototypes as a second output."""

    coefficients: int = Field(default=32, ge=1, description="mask coefficients per anchor (channels after the classes)")
    prototypes: str | None = Field(
        default=None, description="the prototypes output [1, coefficients, H/4, W/4] (default: the second output)"
    )


class KeypointsSpec(_Strict):
    """Keypoints (YOLO -pose): keypoints x, y (and visibility) per anchor after the class scores."""

    shape: tuple[int, int] = Field(default=(17, 3), description="[keypoints, 2 or 3 values each]")

    @field_validator("shape")
    @classmethod
    def _dims(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 1 or v[1] not in (2, 3):
            raise ValueError(f"expected [keypoints >= 1, 2 or 3], got {list(v)}")
        return v


class PostprocessSpec(_Strict):
    """What turns the raw head into detections. The NMS runs on the host (torch2ms.postprocess.yolo), in the
    checks and in the bundle alike: the exported model ends at the head."""

    format: Literal["yolo"] = Field(
        description="yolo: Ultralytics anchor-free heads (v8/v9/11/12), raw head [1, 4 + nc + extra, anchors], "
        "boxes xywh in input pixels, class probabilities; letterboxed input (grey 114)"
    )
    kind: Literal["detect", "segment", "pose", "obb"] = "detect"
    output: str | None = Field(default=None, description="the head output (default: the first)")
    nc: int = Field(ge=1, description="number of classes")
    class_names: tuple[str, ...] | None = None
    conf: float = Field(default=0.25, ge=0, le=1, description="confidence threshold (bundle inference)")
    iou: float = Field(default=0.7, ge=0, le=1, description="NMS IoU threshold")
    max_det: int = Field(default=300, ge=1, description="detections kept per image")
    agnostic: bool = Field(default=False, description="NMS across classes instead of per class")
    masks: MasksSpec | None = Field(default=None, description="kind segment (default: 32 coefficients)")
    keypoints: KeypointsSpec | None = Field(default=None, description="kind pose (default: [17, 3])")

    @model_validator(mode="after")
    def _consistent(self):
        if self.class_names is not None and len(self.class_names) != self.nc:
            raise ValueError(f"class_names has {len(self.class_names)} entries, nc is {self.nc}")
        if self.masks is not None and self.kind != "segment":
            raise ValueError(f"masks is only for kind: segment (kind is {self.kind!r})")
        if self.keypoints is not None and self.kind != "pose":
            raise ValueError(f"keypoints is only for kind: pose (kind is {self.kind!r})")
        return self

    @property
    def extra(self) -> int:
        """Channels after the class scores: mask coefficients, keypoint values or the angle."""
        if self.kind == "segment":
            return (self.masks or MasksSpec()).coefficients
        if self.kind == "pose":
            k, d = (self.keypoints or KeypointsSpec()).shape
            return k * d
        return 1 if self.kind == "obb" else 0


class GenerateSpec(_Strict):
    """Greedy generation (task: text_generation) with a prefill and a decode graph of static shapes
    (``torch2ms.generation``). The checks that need the model (its positions, its vocabulary, its
    cache interface) are ``torch2ms.generation.plan``'s."""

    prompts: tuple[tuple[int, ...], ...] | None = Field(
        default=None, description="the prompts as token-id lists, e.g. [[1, 15, 27], [1, 9]]"
    )
    prompt_lengths: tuple[int, ...] | None = Field(
        default=None,
        description="instead of prompts: one length per prompt, the token ids drawn with seed from range",
    )
    range: tuple[int, int] | None = Field(
        default=None, description="prompt_lengths: token ids drawn from [low, high) (default: the whole vocabulary)"
    )
    seed: int = Field(default=0, description="prompt_lengths: the seed the token ids are drawn with")
    max_new_tokens: int = Field(ge=1, description="tokens generated per prompt")
    cache_length: int = Field(
        ge=1, description="the static KV-cache size: at least the longest prompt plus max_new_tokens"
    )
    batch: int | None = Field(
        default=None, ge=1, description="the graphs' batch: prompts run in batches of it (default: all in one)"
    )

    @model_validator(mode="after")
    def _consistent(self):
        if (self.prompts is None) == (self.prompt_lengths is None):
            raise ValueError("give prompts (token-id lists) or prompt_lengths (drawn from seed), one of them")
        if self.prompts is not None:
            if not self.prompts or any(not p for p in self.prompts):
                raise ValueError("prompts: every prompt needs at least one token id")
            if any(t < 0 for p in self.prompts for t in p):
                raise ValueError("prompts: token ids are non-negative integers")
            if self.range is not None:
                raise ValueError("range is for prompt_lengths (drawn token ids); prompts give theirs")
        elif not self.prompt_lengths or any(n < 1 for n in self.prompt_lengths):
            raise ValueError("prompt_lengths: give one positive length per prompt")
        if self.range is not None and not 0 <= self.range[0] < self.range[1]:
            raise ValueError(f"range [{self.range[0]}, {self.range[1]}) is not [low, high) with 0 <= low < high")
        if len(self.lengths()) % self.batch_size():
            raise ValueError(f"batch {self.batch}: {len(self.lengths())} prompts do not make batches of {self.batch}")
        need = max(self.lengths()) + self.max_new_tokens
        if self.cache_length < need:
            raise ValueError(
                f"cache_length {self.cache_length} is below the longest prompt ({max(self.lengths())}) plus "
                f"max_new_tokens ({self.max_new_tokens}): give cache_length >= {need}"
            )
        return self

    def lengths(self) -> tuple[int, ...]:
        """Every prompt's length, in order."""
        return tuple(len(p) for p in self.prompts) if self.prompts is not None else tuple(self.prompt_lengths)

    def batch_size(self) -> int:
        return self.batch or len(self.lengths())


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
