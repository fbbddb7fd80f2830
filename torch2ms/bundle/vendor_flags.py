"""What the board tools take: every flag and config key a bundle may write, the values each
documentation page allows, and that page. ``lint.py`` checks every generated script and config
against this table (``package`` before writing, ``verify`` after unpacking); a flag or key that
is not here fails the bundle, so a new one needs its documented values added here first.

``Allowed.values`` lists the documented values; ``pattern`` (a regular expression the whole
value must match) stands for a documented format (a shape list, a profile list, a number);
neither means a path or a name, any non-empty value.
"""

from __future__ import annotations

from dataclasses import dataclass

# The pages (stored copies read on 2026-12-01; the CANN pages are the 8.0 versions).
ATC_PARAMS = "CANN 8.0 ATC docs, command-line options (hiascend.com .../devaids/atc/atlasatcparam_16_00xx.html)"
ATC_FRAMEWORK = "CANN 8.0 ATC docs, --framework (atlasatcparam_16_0014)"
ATC_INPUT_SHAPE = "CANN ATC docs, --input_shape (atlasatcparam_16_0016)"
ATC_PRECISION = "CANN 8.0 ATC docs, --precision_mode (atlasatcparam_16_0067)"
ATC_FUSION_SWITCH = "CANN 8.0 ATC docs, --fusion_switch_file (atlasatcparam_16_0053; the JSON form: atlasatc_16_0085)"
ATC_AIPP = "CANN ATC docs, AIPP configuration (aipp_op fields; 'Normalization', 'CSC Configuration')"
LITE_CLI = "MindSpore Lite cloud docs, converter_tool.md (r2.10.0), 'Description of Parameters'"
LITE_ASCEND = "MindSpore Lite cloud docs, converter_tool_ascend.md (r2.10.0), Tables 1-3 and 'Dynamic Batch Size'"
LITE_QUANT = (
    "MindSpore Lite docs, advanced/quantization.html; key names as converter_lite's config_file_parser.cc, "
    "target_device values as full_quant_quantizer.cc reads them"
)
AMCT_CFG = (
    "CANN AMCT docs, 'Simplified PTQ Configuration File' (atlasamct_16_0163; calibration_config_onnx.proto) "
    "and create_quant_config (atlasamct_16_0153)"
)

BOOL = ("true", "false")
INT = r"[0-9]+"
FLOAT = r"-?[0-9]+(\.[0-9]+)?"
_DIMS = r"-?[0-9]+(,-?[0-9]+)*"
ATC_SHAPES = rf"[^:;]+:({_DIMS})?(;[^:;]+:({_DIMS})?)*"  # name:1,3,224,224;name2:-1,16;scalar:
LITE_SHAPES = rf"[^:;]+:\[{_DIMS}\](;[^:;]+:\[{_DIMS}\])*"  # name:[1,3,224,224];name2:[-1,16]
_GROUP = rf"\[{INT}\](,\[{INT}\])*"  # [1],[2],[4]: one profile per batch size
LITE_DYNAMIC_DIMS = rf"{_GROUP}(;{_GROUP})*"  # one group per dynamic input, separated by ';'


@dataclass(frozen=True)
class Allowed:
    page: str
    values: tuple[str, ...] | None = None
    pattern: str | None = None

    def describe(self) -> str:
        if self.values is not None:
            return "one of " + ", ".join(self.values)
        return f"a value matching {self.pattern}" if self.pattern else "a path or name"


def _any(page: str) -> Allowed:
    return Allowed(page)


ATC = {
    "--framework": Allowed(ATC_FRAMEWORK, ("0", "1", "3", "5")),
    "--model": _any(ATC_PARAMS),
    "--output": _any(ATC_PARAMS),
    "--input_format": Allowed(ATC_PARAMS, ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC")),
    "--input_shape": Allowed(ATC_INPUT_SHAPE, pattern=ATC_SHAPES),
    "--soc_version": _any(ATC_PARAMS),
    "--precision_mode": Allowed(
        ATC_PRECISION,
        (
            "force_fp32",
            "cube_fp16in_fp32out",
            "force_fp16",
            "allow_fp32_to_fp16",
            "must_keep_origin_dtype",
            "allow_mix_precision",
            "allow_mix_precision_fp16",
        ),
    ),
    "--insert_op_conf": _any(ATC_PARAMS + ", --insert_op_conf"),
    "--keep_dtype": _any(ATC_PARAMS + ", --keep_dtype (atlasatcparam_16_0074)"),
    "--output_type": Allowed(ATC_PARAMS + ", --output_type", ("FP32", "UINT8", "FP16")),
    "--dynamic_batch_size": Allowed(ATC_PARAMS + ", --dynamic_batch_size", pattern=rf"{INT}(,{INT})*"),
    "--dynamic_dims": Allowed(ATC_PARAMS + ", --dynamic_dims", pattern=rf"{_DIMS}(;{_DIMS})*"),
    "--fusion_switch_file": _any(ATC_FUSION_SWITCH),
}

CONVERTER_LITE = {
    "--fmk": Allowed(LITE_CLI, ("MINDIR", "CAFFE", "TFLITE", "TF", "ONNX")),
    "--modelFile": _any(LITE_CLI),
    "--outputFile": _any(LITE_CLI),
    "--configFile": _any(LITE_CLI),
    "--saveType": Allowed(LITE_CLI, ("MINDIR", "MINDIR_LITE")),
    "--optimize": Allowed(LITE_CLI, ("none", "general", "gpu_oriented", "ascend_oriented")),
    "--inputShape": Allowed(LITE_CLI, pattern=rf"[^:;]+:{_DIMS}(;[^:;]+:{_DIMS})*"),
}

CONVERTER_LITE_CFG = {
    "ascend_context": {
        "input_format": Allowed(LITE_ASCEND, ("NCHW", "NHWC", "ND")),
        "input_shape": Allowed(LITE_ASCEND, pattern=LITE_SHAPES),
        "dynamic_dims": Allowed(LITE_ASCEND, pattern=LITE_DYNAMIC_DIMS),
        "precision_mode": Allowed(
            LITE_ASCEND, ("enforce_fp32", "preferred_fp32", "enforce_fp16", "enforce_origin", "preferred_optimal")
        ),
        "op_select_impl_mode": Allowed(LITE_ASCEND, ("high_performance", "high_precision")),
        "output_type": Allowed(LITE_ASCEND, ("FP16", "FP32", "UINT8")),
        "fusion_switch_config_file_path": _any(LITE_ASCEND),
        "insert_op_config_file_path": _any(LITE_ASCEND),
    },
    "acl_build_options": {"ge.exec.modify_mixlist": _any(LITE_ASCEND)},
    "common_quant_param": {
        "quant_type": Allowed(LITE_QUANT, ("WEIGHT_QUANT", "FULL_QUANT", "DYNAMIC_QUANT")),
        "bit_num": Allowed(LITE_QUANT, pattern=INT),
    },
    "data_preprocess_param": {
        "calibrate_path": Allowed(LITE_QUANT, pattern=r"[^:,]+:[^,]+(,[^:,]+:[^,]+)*"),
        "calibrate_size": Allowed(LITE_QUANT, pattern=INT),
        "input_type": Allowed(LITE_QUANT, ("IMAGE", "BIN")),
    },
    "full_quant_param": {
        "activation_quant_method": Allowed(LITE_QUANT, ("MAX_MIN", "KL", "REMOVAL_OUTLIER")),
        "bias_correction": Allowed(LITE_QUANT, BOOL),
        "per_channel": Allowed(LITE_QUANT, BOOL),
        "target_device": Allowed(LITE_QUANT, ("CPU", "KIRIN", "NVGPU", "DSP", "ASCEND")),
    },
}

# AMCT's simplified config: text protobuf, a nested message's fields named by their path
AMCT = {
    "batch_num": Allowed(AMCT_CFG, pattern=INT),
    "activation_offset": Allowed(AMCT_CFG, BOOL),
    "skip_layers": Allowed(AMCT_CFG, pattern=r'"[^"]+"'),
    "common_config.arq_quantize.channel_wise": Allowed(AMCT_CFG, BOOL),
}

AIPP = {
    "aipp_mode": Allowed(ATC_AIPP, ("static", "dynamic")),
    "related_input_rank": Allowed(ATC_AIPP, pattern=INT),
    "input_format": Allowed(
        ATC_AIPP,
        (
            "YUV420SP_U8",
            "XRGB8888_U8",
            "RGB888_U8",
            "YUV400_U8",
            "ARGB8888_U8",
            "YUYV_U8",
            "YUV422SP_U8",
            "AYUV444_U8",
            "RGB16",
            "RGB20",
            "RGB24",
            "RGB8_IR",
            "RGB16_IR",
            "RGB24_IR",
        ),
    ),
    "src_image_size_w": Allowed(ATC_AIPP, pattern=INT),
    "src_image_size_h": Allowed(ATC_AIPP, pattern=INT),
    "csc_switch": Allowed(ATC_AIPP, BOOL),
    "rbuv_swap_switch": Allowed(ATC_AIPP, BOOL),
    **{f"matrix_r{i}c{j}": Allowed(ATC_AIPP, pattern=r"-?[0-9]+") for i in range(3) for j in range(3)},
    **{f"input_bias_{i}": Allowed(ATC_AIPP, pattern=INT) for i in range(3)},
    **{f"mean_chn_{i}": Allowed(ATC_AIPP, pattern=INT) for i in range(4)},
    **{f"min_chn_{i}": Allowed(ATC_AIPP, pattern=FLOAT) for i in range(4)},
    **{f"var_reci_chn_{i}": Allowed(ATC_AIPP, pattern=FLOAT) for i in range(4)},
}
