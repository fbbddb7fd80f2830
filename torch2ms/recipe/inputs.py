"""The model a recipe builds and the inputs it takes: shapes, dtypes, batch and sequence profiles, sample data."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from torch2ms.recipe.base import _Strict


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
