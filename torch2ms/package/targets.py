"""Board targets and the conversion files written for each: MindSpore Lite ``converter_lite``
(from the MindIR) and CANN ``atc`` (from the ONNX, with AIPP preprocessing).

``soc_version`` is what ``npu-smi info`` shows in its Name column, prefixed with ``Ascend``
(CANN ATC docs, ``--soc_version``). Atlas 200I DK A2 boards report 310B4; the generated
``atc.sh`` re-checks this on the board when ``npu-smi`` is available.

AIPP normalisation (CANN ATC docs, "Normalization Configuration"), per channel ``i``::

    out_i = (pixel_i - mean_chn_i - min_chn_i) * var_reci_chn_i

``mean_chn_i`` is an integer in the AIPP info struct, so the float mean goes into ``min_chn_i``
and ``mean_chn_i`` is 0. The recipe's preprocessing is ``x = (pixel * scale - mean) / std``,
i.e. ``(pixel - mean / scale) * (scale / std)``: ``min_chn = mean / scale``,
``var_reci_chn = scale / std``. With AIPP the OM model takes NHWC uint8 images of the input's
size (static AIPP does not resize); AIPP's input is RGB888_U8, and ``rbuv_swap_switch: true``
feeds a BGR model from RGB pixels (normalisation applies to the channels after the swap, so the
recipe's mean/std are in the model's channel order).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch2ms.errors import Torch2msError


@dataclass(frozen=True)
class Target:
    name: str
    board: str
    soc_version: str


TARGETS = {
    t.name: t
    for t in (
        Target("atlas-200i-dk-a2", "Atlas 200I DK A2 developer kit (Ascend 310B)", "Ascend310B4"),
        Target("atlas-200i-a2", "Atlas 200I A2 module / Atlas 500 A2 (Ascend 310B, 20 TOPS)", "Ascend310B1"),
        Target("atlas-300i-pro", "Atlas 300I Pro inference card (Ascend 310P)", "Ascend310P3"),
        Target("atlas-300i-duo", "Atlas 300I Duo inference card (Ascend 310P)", "Ascend310P3"),
        Target("atlas-200-dk", "Atlas 200 DK, model 3000 (Ascend 310)", "Ascend310"),
    )
}

# precision option -> (converter_lite [ascend_context] precision_mode, atc --precision_mode)
PRECISION = {
    "fp16": ("enforce_fp16", "force_fp16"),
    "fp32": ("preferred_fp32", "allow_fp32_to_fp16"),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise Torch2msError(
            f"--target {name!r} is not a known board", hint=f"choose one of {', '.join(TARGETS)}"
        ) from None


def _shapes(inputs: list[dict], sep: str) -> str:
    return ";".join(f"{i['name']}:{sep.join(str(d) for d in i['shape'])}" for i in inputs)


def converter_lite_cfg(precision: str) -> str:
    mode, _ = PRECISION[precision]
    return f"[ascend_context]\ninput_format=NCHW\nprecision_mode={mode}\n"


def converter_lite_sh(
    target: Target, model_name: str, inputs: list[dict], precision: str, fp32_outputs: bool = False
) -> str:
    # detection heads go to a host postprocess that was checked on float32 (box pixels, nearly equal scores)
    out_type = " \\\n  --outputDataType=FLOAT32" if fp32_outputs else ""
    return f"""#!/bin/sh
# MindSpore Lite for Ascend: optimise model/network.mindir offline for {target.board}.
# Run on the board (or a host with the Ascend CANN toolkit and the MindSpore Lite cloud-inference
# package, whose tools/converter/lib must be on LD_LIBRARY_PATH). Output: {model_name}_ascend.mindir
# Precision: {PRECISION[precision][0]} (set in converter_lite.cfg; enforce_fp16 is the Ascend default).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$(cd "$HERE/../.." && pwd)
CONVERTER=${{CONVERTER_LITE:-converter_lite}}
"$CONVERTER" --fmk=MINDIR \\
  --modelFile="$BUNDLE/model/network.mindir" \\
  --outputFile="$BUNDLE/model/{model_name}_ascend" \\
  --saveType=MINDIR \\
  --optimize=ascend_oriented \\
  --inputShape="{_shapes(inputs, ",")}" \\
  --configFile="$HERE/converter_lite.cfg"{out_type}
echo "wrote $BUNDLE/model/{model_name}_ascend.mindir; run it with:"
echo "  python3 infer.py IMAGE --model model/{model_name}_ascend.mindir --device ascend"
"""


def atc_sh(
    target: Target, model_name: str, inputs: list[dict], precision: str, with_aipp: bool, fp32_outputs: bool = False
) -> str:
    flags = ' \\\n  --insert_op_conf="$HERE/aipp.cfg"' if with_aipp else ""
    flags += " \\\n  --output_type=FP32" if fp32_outputs else ""  # the host postprocess was checked on float32
    note = (
        "# With AIPP the OM model takes NHWC uint8 RGB images of the model's input size; the\n"
        "# normalisation of the recipe happens on the NPU (aipp.cfg). Resize on the host first.\n"
        if with_aipp
        else "# No AIPP (the input is not a 3-channel image): feed the float32 NCHW tensor as is.\n"
    )
    return f"""#!/bin/sh
# CANN ATC: compile model/model.onnx into an offline model (.om) for {target.board}.
# Run where the CANN toolkit is installed (source .../ascend-toolkit/set_env.sh first).
{note}# Precision: --precision_mode={PRECISION[precision][1]} (ATC's default is force_fp16).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$(cd "$HERE/../.." && pwd)
SOC=${{SOC_VERSION:-{target.soc_version}}}
if command -v npu-smi >/dev/null 2>&1; then
  NAME=$(npu-smi info 2>/dev/null | grep -oE '(310|910)[0-9A-Z]*' | head -n 1 || true)
  if [ -n "$NAME" ] && [ "Ascend$NAME" != "$SOC" ]; then
    echo "warning: npu-smi reports Ascend$NAME but this bundle targets $SOC;" \\
      "set SOC_VERSION=Ascend$NAME to compile for this board" >&2
  fi
fi
atc --framework=5 \\
  --model="$BUNDLE/model/model.onnx" \\
  --output="$BUNDLE/model/{model_name}" \\
  --input_format=NCHW \\
  --input_shape="{_shapes(inputs, ",")}" \\
  --soc_version="$SOC" \\
  --precision_mode={PRECISION[precision][1]}{flags}
echo "wrote $BUNDLE/model/{model_name}.om"
"""


def aipp_cfg(pre: dict, height: int, width: int) -> str:
    scale = pre["scale"]
    lines = [
        "# Static AIPP generated by torch2ms from the recipe's preprocessing:",
        f"#   x = (pixel * {scale:.10g} - mean) / std,  mean={list(pre['mean'])}, std={list(pre['std'])}, colour "
        f"{pre['color']}",
        "# AIPP computes out = (pixel - mean_chn - min_chn) * var_reci_chn, so min_chn = mean/scale and",
        "# var_reci_chn = scale/std. Input: RGB888_U8 image of exactly src_image_size_w x src_image_size_h.",
        "aipp_op {",
        "  aipp_mode: static",
        "  related_input_rank: 0",
        "  input_format: RGB888_U8",
        f"  src_image_size_w: {width}",
        f"  src_image_size_h: {height}",
        "  csc_switch: false",
        f"  rbuv_swap_switch: {'true' if pre['color'] == 'bgr' else 'false'}",
    ]
    for i in range(3):
        lines.append(f"  mean_chn_{i}: 0")
    for i, m in enumerate(pre["mean"]):
        lines.append(f"  min_chn_{i}: {m / scale:.6f}")
    for i, s in enumerate(pre["std"]):
        lines.append(f"  var_reci_chn_{i}: {scale / s:.9f}")
    lines.append("}")
    return "\n".join(lines) + "\n"
