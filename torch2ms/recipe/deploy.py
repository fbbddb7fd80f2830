"""What a bundle needs beyond the network: the fp16 and INT8 plans, preprocessing, detection post-processing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from torch2ms.recipe.base import _Strict
from torch2ms.recipe.inputs import SKIMAGE_PREFIX


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
    w8a16_top1_agreement: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="the W8A16 plan's gate (text_generation recipes, `torch2ms precision --plan w8a16`): the share of "
        "teacher-forced steps whose top-1 token is fp32 PyTorch's (near-ties counted as agreeing), Linear weights and "
        "token embeddings in int8 per row; layers are kept in float until it holds",
    )
    w8a16_near_tie_share: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="near-ties are rare or not at all: a differing step whose reference top-2 gap is within the int8 "
        "noise floor (weight noise of int8's step size) is a near-tie only while at most this share of the "
        "reference's steps have gaps within that floor; beyond it int8 cannot hold the model's choices and every "
        "differing step counts",
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
