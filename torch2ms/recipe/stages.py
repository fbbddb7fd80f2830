"""The options of each conversion stage: the check's bounds, export, rebuild, fold, compile
(graph-kernel fusion rules) and mindir."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from torch2ms.recipe.base import _Strict


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


LIST_FLAGS = ("enable_cluster_ops", "disable_cluster_ops", "disable_expand_ops", "disable_fusion_pattern")
_TOKEN = re.compile(r"--([a-z][a-z0-9_]*)(?:=(\S*))?")


def parse_flags(text: str) -> dict[str, str]:
    """``--name=value`` tokens by name (a bare ``--name`` is ``"true"``); anything else is an error."""
    out: dict[str, str] = {}
    for token in text.split():
        m = _TOKEN.fullmatch(token)
        if not m:
            raise ValueError(
                f"{token!r}: expected --name=value tokens (e.g. --opt_level=2 --disable_cluster_ops=Select)"
            )
        out[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return out


def typed_flags(fusion) -> dict[str, str]:
    """The flags ``compile.fusion`` (a ``FusionSpec``) sets."""
    out = {name: ",".join(getattr(fusion, name)) for name in LIST_FLAGS if getattr(fusion, name)}
    if fusion.opt_level is not None:
        out["opt_level"] = str(fusion.opt_level)
    return out


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
        parse_flags(v)
        return v

    @model_validator(mode="after")
    def _flags_once(self):
        both = sorted(set(parse_flags(self.graph_kernel_flags)) & set(typed_flags(self.fusion)))
        if both:
            raise ValueError(
                f"graph_kernel_flags sets --{', --'.join(both)}, which compile.fusion sets too: give each in one place"
            )
        return self


class MindirSpec(_Strict):
    enabled: bool = True
