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
recipe's mean/std are in the model's channel order). ``aipp_yuv420sp.cfg`` takes the NV12 frames
of DVPP's JPEG decoder instead, with the full-range BT.601 CSC matrix. ``package`` runs both
through a model of AIPP (``aipp.py``) before shipping them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch2ms.bundle import aipp
from torch2ms.errors import Torch2msError


@dataclass(frozen=True)
class Target:
    name: str
    board: str
    soc_version: str
    # Dynamic batch (``inputs[].batch``): how many batch sizes ("profiles", "gears") the board tools
    # compile into one model. CANN ATC ``--dynamic_batch_size``: (1, 100] profiles on the Atlas
    # 200I/500 A2 (310B), Atlas inference (310P) and Atlas 200/300/500 (310) products, each size in
    # [1, 2048]; converter_lite's ``dynamic_dims`` compiles the same profiles through ATC.
    max_batch_profiles: int = 100

    @property
    def lite_verified(self) -> bool:
        """Whether MindSpore Lite's Ascend path is documented for this chip. The Lite docs list the
        Atlas 200/300/500 inference products (310) and the Atlas inference series (310P) ("Integrated
        Ascend", mindspore.cn/lite/docs/zh-CN/r2.4.1/advanced/third_party/ascend_info.html;
        converter_lite ``--device``: Ascend310, Ascend310P, "converter_tool" of the cloud docs), not
        the Atlas 200I/500 A2 (310B): the bundle ships converter_lite.sh there marked unverified."""
        return not self.soc_version.startswith("Ascend310B")

    @property
    def shape_ranges(self) -> bool:
        """Shape ranges (``--input_shape="x:1~8,..."``, a truly dynamic dimension) instead of
        profiles: not on Atlas 200I/500 A2 inference products (310B), per the ATC ``--input_shape``
        docs. torch2ms writes profiles only, which every target takes."""
        return not self.soc_version.startswith("Ascend310B")


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

# precision option -> (converter_lite [ascend_context] precision_mode, atc --precision_mode). ATC's values: CANN
# ATC docs, "--precision_mode" (atlasatcparam_16_0067): force_fp16 runs every op that has an fp16 kernel in fp16;
# allow_fp32_to_fp16 runs the Cube (matrix) ops in fp16 and keeps float32 for the vector ops that support it;
# must_keep_origin_dtype keeps the graph's float32, an op whose AI Core kernel has no float32 going to its float32
# AI CPU kernel, or failing the build without one. converter_lite's names are the same modes: MindSpore's
# TransforPrecisionToAcl (mindspore/ccsrc/cxx_api/acl_utils.h) maps enforce_fp16 -> force_fp16, preferred_fp32 ->
# allow_fp32_to_fp16, enforce_origin -> must_keep_origin_dtype (values: MindSpore Lite "converter_tool_ascend",
# [ascend_context] precision_mode).
PRECISION = {
    "fp16": ("enforce_fp16", "force_fp16"),
    "cube-fp16": ("preferred_fp32", "allow_fp32_to_fp16"),  # what `fp32` wrote before: Conv/MatMul still in fp16
    "fp32": ("enforce_origin", "must_keep_origin_dtype"),
    # int8: the Cube layers quantized (AMCT's deploy ONNX for ATC, converter_lite full quantization), the rest fp16
    "int8": ("enforce_fp16", "force_fp16"),
}
PRECISION_MEANING = {
    "fp16": "every op in fp16 where it has an fp16 kernel",
    "cube-fp16": "the Cube ops (Conv, MatMul, Gemm) in fp16, vector ops in fp32 where they have an fp32 kernel",
    "fp32": "the graph's float32 kept everywhere: an op without an fp32 AI Core kernel runs on the AI CPU or fails",
    "int8": "the Cube layers in INT8 (the INT8 plan), the rest in fp16",
}


LITE_UNVERIFIED_NOTE = (
    "the MindSpore Lite docs list the Ascend 310 and 310P for Lite's Ascend inference, not the 310B (Atlas 200I/500 "
    "A2); the ATC path (atc.sh) is the documented one here"
)
LITE_UNVERIFIED = (
    "\n# UNVERIFIED: the MindSpore Lite docs list the Ascend 310 and 310P, not the {board}'s 310B;\n"
    "# atc.sh is the documented path for this board.\n"
    'echo "warning: MindSpore Lite on the 310B is not documented (unverified); atc.sh is the documented path" >&2'
)


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise Torch2msError(
            f"--target {name!r} is not a known board", hint=f"choose one of {', '.join(TARGETS)}"
        ) from None


def check_batch(target: Target, inputs: list[dict]) -> tuple[int, ...] | None:
    """The batch sizes ``inputs`` (manifest entries, ``batch`` listing them) ask ``target`` to
    serve from one model, or None for a static batch; ``Torch2msError`` with the documented reason
    where the target's tools forbid the combination."""
    lists = {tuple(i["batch"]) for i in inputs if len(i.get("batch") or ()) > 1}
    if not lists:
        return None
    if len(lists) > 1:
        raise Torch2msError(
            f"inputs list different batch sizes {sorted(lists)}: ATC --dynamic_batch_size and converter_lite "
            "dynamic_dims take one list for every input whose dimension 0 is -1"
        )
    sizes = lists.pop()
    why = f"{target.board} ({target.soc_version}): "
    if len(sizes) > target.max_batch_profiles:
        raise Torch2msError(
            f"inputs[].batch lists {len(sizes)} sizes; {why}ATC --dynamic_batch_size compiles at most "
            f"{target.max_batch_profiles} profiles into one model",
            hint="serve fewer sizes (e.g. powers of two), or build one bundle per range of sizes",
        )
    if any(b < 1 or b > 2048 for b in sizes):
        raise Torch2msError(f"inputs[].batch {list(sizes)}: {why}each batch size must be in [1, 2048] (ATC)")
    for i in inputs:
        if len(i.get("batch") or ()) > 1 and len(i["shape"]) < 2:
            raise Torch2msError(
                f"input {i['name']!r} has shape {i['shape']}: dynamic batch needs N first in a shape of rank 2 or more "
                "(ATC --dynamic_batch_size sets dimension 0 to -1)"
            )
    return sizes


def _shapes(inputs: list[dict], sep: str, brackets: bool = False, scalars: bool = False) -> str:
    """``name:1,3,224,224;...`` (``[...]`` for converter_lite's config), dimension 0 of an input
    served at several batch sizes written -1. A scalar input (shape ``[]``) is ``name:`` with
    ``scalars`` (ATC ``--input_shape``: "a scalar input, if given, is empty", and it must be given
    beside a dynamic profile; atlasatcparam_16_0016), else left out: converter_lite's pages do not
    say how to write one, and the MindIR already fixes its shape."""

    def dims(i):
        if not i["shape"]:
            return ""
        shape = [-1 if len(i.get("batch") or ()) > 1 else i["shape"][0], *i["shape"][1:]]
        if i.get("sequence"):
            shape[1] = -1
        text = sep.join(str(d) for d in shape)
        return f"[{text}]" if brackets else text

    return ";".join(f"{i['name']}:{dims(i)}" for i in inputs if i["shape"] or scalars)


def converter_lite_cfg(
    precision: str,
    inputs: list[dict] | None = None,
    plan: dict | None = None,
    quant: dict | None = None,
    fp32_outputs: bool = False,
) -> str:
    """``[ascend_context]``: with a dynamic batch its ``input_shape`` (N = -1) and ``dynamic_dims``,
    which the MindSpore Lite docs take from the config file rather than ``--inputShape``: one
    profile per size (``[1],[2],[4]``) and, with several inputs, one such group per input whose
    dimension 0 is -1, the groups separated by ``;`` (``[1],[2],[4];[1],[2],[4]``: MindSpore Lite
    "converter_tool_ascend", "Dynamic Batch Size"); ``output_type=FP32`` (same page, Table 1) keeps
    float32 outputs for a host postprocess; with an fp16 plan that keeps layers in fp32, the
    mixed-precision settings of ``precision.converter_lite_settings``."""
    context = {"input_format": input_format(inputs or [], False), "precision_mode": PRECISION[precision][0]}
    sizes = batch_sizes(inputs or [])
    if sizes:
        context["input_shape"] = _shapes(inputs, ",", brackets=True)
        group = ",".join(f"[{b}]" for b in sizes)
        context["dynamic_dims"] = ";".join(group for i in inputs if len(i.get("batch") or ()) > 1)
    if fp32_outputs:
        context["output_type"] = "FP32"
    sections = {"ascend_context": context}
    if plan is not None and precision == "fp16":
        from torch2ms.bundle.fp16 import converter_lite_settings

        for section, keys in converter_lite_settings(plan).items():
            sections.setdefault(section, {}).update(keys)
    for section, keys in (quant or {}).items():  # INT8: full quantization (int8.converter_lite_sections)
        sections.setdefault(section, {}).update(keys)
    return "".join(f"[{name}]\n" + "".join(f"{k}={v}\n" for k, v in keys.items()) for name, keys in sections.items())


def dims_profiles(inputs: list[dict]) -> list[tuple[int, ...]] | None:
    """With a sequence-length profile (``sequence`` in the manifest inputs), ATC's
    ``--dynamic_dims`` profiles: one per (batch, length) pair, one value per -1 of
    ``--input_shape`` in input order (dimension 0 the batch when it is listed, dimension 1 the
    length); else None. ATC takes 2 to 100 profiles and not together with ``--dynamic_batch_size``."""
    lengths = next((tuple(i["sequence"]) for i in inputs if i.get("sequence")), None)
    if lengths is None:
        return None
    sizes = batch_sizes(inputs) or (None,)
    profiles = []
    for b in sizes:
        for n in lengths:
            values = []
            for i in inputs:
                values += [b] if len(i.get("batch") or ()) > 1 else []
                values += [n] if i.get("sequence") else []
            profiles.append(tuple(values))
    if not 1 < len(profiles) <= 100:
        raise Torch2msError(
            f"inputs[].sequence with inputs[].batch makes {len(profiles)} (batch, length) profiles; ATC --dynamic_dims "
            "compiles 2 to 100 into one model",
            hint="serve fewer lengths or batch sizes, or build one bundle per range",
        )
    return profiles


def input_format(inputs: list[dict], profiles: bool) -> str:
    """ATC ``--input_format`` for an ONNX model (CANN ATC docs, ``--input_format``, atlasatcparam_16_0015:
    NCHW, NCDHW or ND, one value for every input) and converter_lite's ``[ascend_context]
    input_format`` (NCHW, NHWC or ND, MindSpore Lite "converter_tool_ascend" Table 1): ND with
    ``--dynamic_dims`` profiles (which take ND only, atlasatcparam_16_0020) and where no input is an
    NCHW image (token ids, masks, a KV cache), else NCHW."""
    return "ND" if profiles or all(i.get("layout") == "ND" for i in inputs) else "NCHW"


def batch_sizes(inputs: list[dict]) -> tuple[int, ...] | None:
    for i in inputs:
        if len(i.get("batch") or ()) > 1:
            return tuple(i["batch"])
    return None


def converter_lite_sh(target: Target, model_name: str, inputs: list[dict], precision: str) -> str:
    sizes = batch_sizes(inputs)
    # a dynamic batch takes its input_shape and dynamic_dims from converter_lite.cfg
    shape_flag = "" if sizes else f'  --inputShape="{_shapes(inputs, ",")}" \\\n'
    config = "${CONVERTER_CONFIG:-$HERE/converter_lite.cfg}" if precision == "int8" else "$HERE/converter_lite.cfg"
    served = f"\n# Batch sizes {','.join(map(str, sizes))} (dynamic_dims in converter_lite.cfg)." if sizes else ""
    unverified = "" if target.lite_verified else LITE_UNVERIFIED.format(board=target.board)
    return f"""#!/bin/sh
# MindSpore Lite for Ascend: optimise model/network.mindir offline for {target.board}.
# Run on the board (or a host with the Ascend CANN toolkit and the MindSpore Lite cloud-inference
# package, whose tools/converter/lib must be on LD_LIBRARY_PATH). Output: {model_name}_ascend.mindir
# Over 1 GB of weights network.mindir is the graph and model/network_variables/ holds the weights.
# Precision: {PRECISION[precision][0]} (set in converter_lite.cfg; enforce_fp16 is the Ascend default):
# {PRECISION_MEANING[precision]}.{served}
set -eu{unverified}
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$(cd "$HERE/../.." && pwd)
CONVERTER=${{CONVERTER_LITE:-converter_lite}}
cd "$HERE"  # converter_lite.cfg names modify_mixlist.json relative to this folder
"$CONVERTER" --fmk=MINDIR \\
  --modelFile="$BUNDLE/model/network.mindir" \\
  --outputFile="$BUNDLE/model/{model_name}_ascend" \\
  --saveType=MINDIR \\
  --optimize=ascend_oriented \\
{shape_flag}  --configFile="{config}"
echo "wrote $BUNDLE/model/{model_name}_ascend.mindir; run it with:"
echo "  python3 infer.py IMAGE --model model/{model_name}_ascend.mindir --device ascend"
"""


def atc_sh(
    target: Target,
    model_name: str,
    inputs: list[dict],
    precision: str,
    with_aipp: bool,
    fp32_outputs: bool = False,
    keep_dtype: bool = False,
    onnx_name: str = "model.onnx",
) -> str:
    flags = ' \\\n  --insert_op_conf="${AIPP_CFG:-$HERE/aipp.cfg}"' if with_aipp else ""
    # the fp16 plan: these ONNX nodes keep float32 under force_fp16 (precision.md)
    flags += ' \\\n  --keep_dtype="$HERE/keep_dtype.cfg"' if keep_dtype else ""
    flags += " \\\n  --output_type=FP32" if fp32_outputs else ""  # the host postprocess was checked on float32
    sizes = batch_sizes(inputs)
    profiles = dims_profiles(inputs)
    if profiles:  # (batch,) length profiles in one OM; the app picks one with aclmdlSetInputDynamicDims
        flags += f' \\\n  --dynamic_dims="{";".join(",".join(map(str, p)) for p in profiles)}"'
    elif sizes:  # one OM serving these batch sizes; the app picks one with aclmdlSetDynamicBatchSize
        flags += f' \\\n  --dynamic_batch_size="{",".join(map(str, sizes))}"'
    model = f"$BUNDLE/model/{onnx_name}"  # the opset ATC documents (board_onnx)
    if precision == "int8":  # ATC compiles the INT8 model AMCT writes (precision.md, 'For the board')
        model = "${ONNX_MODEL:?set ONNX_MODEL to AMCT's deploy ONNX (amct_quant.cfg, precision.md)}"
    note = (
        "# With AIPP the OM model takes NHWC uint8 RGB images of the model's input size; the\n"
        "# normalisation of the recipe happens on the NPU (aipp.cfg). Resize on the host first.\n"
        "# For NV12 frames from DVPP's JPEG decoder: AIPP_CFG=/path/to/aipp_yuv420sp.cfg sh atc.sh\n"
        if with_aipp
        else "# No AIPP (the input is not a 3-channel image): feed the float32 NCHW tensor as is.\n"
    )
    return f"""#!/bin/sh
# CANN ATC: compile model/{onnx_name} into an offline model (.om) for {target.board}.
# Run where the CANN toolkit is installed (source .../ascend-toolkit/set_env.sh first).
{note}# Precision: --precision_mode={PRECISION[precision][1]} (ATC's default is force_fp16):
# {PRECISION_MEANING[precision]}.
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
  --model="{model}" \\
  --output="$BUNDLE/model/{model_name}" \\
  --input_format={input_format(inputs, bool(profiles))} \\
  --input_shape="{_shapes(inputs, ",", scalars=True)}" \\
  --soc_version="$SOC" \\
  --precision_mode={PRECISION[precision][1]}{flags}
echo "wrote $BUNDLE/model/{model_name}.om"
"""


def aipp_cfg(pre: dict, height: int, width: int, yuv: str | None = None) -> str:
    """Static AIPP for the recipe's preprocessing; ``yuv`` (a ``aipp.STANDARDS`` name) makes the
    YUV420SP_U8 variant with its colour-space conversion, else the input is RGB888_U8."""
    scale, bgr = pre["scale"], pre["color"] == "bgr"
    channels = "B, G, R" if bgr else "R, G, B"
    mean, std = list(pre["mean"]), list(pre["std"])
    lines = [
        "# Static AIPP generated by torch2ms from the recipe's preprocessing:",
        f"#   x = (pixel * {scale:.10g} - mean) / std,  mean={mean}, std={std}, colour {pre['color']}",
        "# AIPP computes out = (pixel - mean_chn - min_chn) * var_reci_chn in fp16, so min_chn = mean/scale and",
        f"# var_reci_chn = scale/std; channels in the model's order ({channels}).",
    ]
    if yuv is None:
        lines += [
            f"# Expects: packed RGB888 (H x W x 3 uint8, R first) of exactly {width}x{height}, e.g. an image decoded",
            "# on the host with Pillow (OpenCV decodes BGR: cv2.cvtColor(img, cv2.COLOR_BGR2RGB) first) and resized",
            "# to the model's size. Frames from DVPP's JPEG decoder are YUV420SP: use aipp_yuv420sp.cfg.",
        ]
    else:
        narrow = _matrix_text(aipp.csc_matrix("bt601-narrow", pre["color"]))
        lines += [
            f"# Expects: YUV420SP_U8 of exactly {width}x{height} (NV12: Y plane, then U,V interleaved at half",
            f"# resolution), {aipp.STANDARDS[yuv].source}. NV21 (V before U): set rbuv_swap_switch: true.",
            "# Other sources need another matrix (ATC docs, 'CSC Configuration'), e.g. narrow-range BT.601 camera or",
            f"# VDEC frames: input_bias_0: 16 and matrix_r*c* = {narrow}",
            "# CSC: out = (matrix @ (yuv - input_bias)) >> 8, rows in the model's channel order.",
        ]
    lines += [
        "aipp_op {",
        "  aipp_mode: static",
        "  related_input_rank: 0",
        f"  input_format: {'RGB888_U8' if yuv is None else 'YUV420SP_U8'}",
        f"  src_image_size_w: {width}",
        f"  src_image_size_h: {height}",
    ]
    if yuv is None:
        lines += ["  csc_switch: false", f"  rbuv_swap_switch: {'true' if bgr else 'false'}"]
    else:
        matrix = aipp.csc_matrix(yuv, pre["color"])
        lines += ["  csc_switch: true", "  rbuv_swap_switch: false"]
        lines += [f"  matrix_r{i}c{j}: {matrix[i, j]}" for i in range(3) for j in range(3)]
        lines += [f"  input_bias_{i}: {b}" for i, b in enumerate(aipp.STANDARDS[yuv].bias)]
    for i in range(3):
        lines.append(f"  mean_chn_{i}: 0")
    for i, m in enumerate(pre["mean"]):
        lines.append(f"  min_chn_{i}: {m / scale:.{aipp.MIN_DECIMALS}f}")
    for i, s in enumerate(pre["std"]):
        lines.append(f"  var_reci_chn_{i}: {scale / s:.{aipp.VAR_DECIMALS}f}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _matrix_text(m) -> str:
    return " ".join(str(v) for v in m.ravel())


YUV_STANDARD = "jpeg"  # what DVPP's JPEG decoder hands AIPP on the board


def aipp_configs(pre: dict, height: int, width: int) -> dict[str, tuple[str, str | None]]:
    """The AIPP files a bundle ships: file name -> (text, YUV standard or None). YUV420SP needs an
    even width and height (ATC), so an odd-sized input gets the RGB888 file only."""
    configs = {"aipp.cfg": (aipp_cfg(pre, height, width), None)}
    if height % 2 == 0 and width % 2 == 0:
        configs["aipp_yuv420sp.cfg"] = (aipp_cfg(pre, height, width, YUV_STANDARD), YUV_STANDARD)
    return configs
