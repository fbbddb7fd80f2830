"""The bundle's README.md: ``templates/README.md`` filled in for one recipe, board and precision
(what the model takes and returns, how to preprocess, the files, the plan, how to convert it)."""

from __future__ import annotations

from pathlib import Path
from string import Template

from torch2ms import __version__
from torch2ms.bundle import board_onnx, targets
from torch2ms.pipeline.markdown import row
from torch2ms.recipe import Recipe
from torch2ms.runtime import mindir_layout

TEMPLATES = Path(__file__).parent / "templates"  # README.md filled in here; infer.py copied as it is


def readme(
    recipe: Recipe,
    version: str,
    target,
    precision: str,
    manifest: dict,
    is_image: bool,
    size,
    opset: int,
    weights_apart: bool = False,
    board: bool = False,
) -> str:
    pre_text, aipp_note, aipp_howto = _input_text(recipe, manifest["preprocess"], is_image, size)
    post = manifest["postprocess"]
    if post["kind"] == "detection":
        from torch2ms.bundle import detection

        pre_text, post_text = detection.readme_texts(manifest)
    else:
        post_text = _output_text(post)
    shape = recipe.inputs[0].shape
    return Template((TEMPLATES / "README.md").read_text()).substitute(
        name=recipe.name,
        version=version,
        board=target.board,
        target=target.name,
        soc=target.soc_version,
        tool_version=__version__,
        recipe_short=recipe.sha256()[:16],
        input_desc=f"input `{recipe.inputs[0].name}` {'x'.join(map(str, shape))}"
        + (f" (+{len(recipe.inputs) - 1} more)" if len(recipe.inputs) > 1 else ""),
        opset=opset,
        aipp_note=aipp_note,
        aipp_howto=aipp_howto,
        precision=precision,
        board_row=(
            row(
                [
                    f"`model/{board_onnx.NAME}`",
                    f"the ONNX `atc.sh` and AMCT read: opset {board_onnx.OPSET} (ATC documents 11-15, AMCT 11), "
                    "checked against PyTorch like `model.onnx`",
                ]
            )
            + "\n"
            if board
            else ""
        ),
        lite_note="" if target.lite_verified else f" **Unverified on this board:** {targets.LITE_UNVERIFIED_NOTE}",
        precision_modes=(
            f"converter_lite precision_mode={targets.PRECISION[precision][0]}, atc "
            f"--precision_mode={targets.PRECISION[precision][1]}: {targets.PRECISION_MEANING[precision]}"
        ),
        pre_text=pre_text,
        post_text=post_text,
        plan_note=_fp16_note(manifest.get("fp16_plan")) or _int8_note(manifest.get("int8_plan")),
        variables_row=(
            row(
                [
                    f"`model/{mindir_layout.VARIABLES}/`",
                    "the MindIR's weights (over 1 GB, MindSpore keeps them beside the graph): copy and convert it "
                    "with `network.mindir`",
                ]
            )
            + "\n"
            if weights_apart
            else ""
        ),
    )


def _input_text(recipe: Recipe, pre: dict, is_image: bool, size) -> tuple[str, str, str]:
    """The README's input paragraph, its AIPP note and its AIPP how-to."""
    if is_image:
        pre_text = (
            f"Input `{recipe.inputs[0].name}`: one RGB image -> Pillow `resize(({size[1]}, {size[0]}), BILINEAR)` -> "
            "float32"
            + (" -> channels reversed to BGR" if pre["color"] == "bgr" else "")
            + f" -> `(pixel * {pre['scale']:.6g} - mean) / std` with mean {pre['mean']}, std {pre['std']} -> NCHW, "
            "batch 1."
        )
        aipp_note = ", AIPP does the normalisation"
        aipp_howto = (
            f"With `aipp.cfg` the OM model takes an NHWC uint8 RGB image of {size[1]}x{size[0]}: resize on the host "
            "(or with DVPP) and skip the normalisation, AIPP does it on the NPU. For the NV12 frames of DVPP's JPEG "
            "decoder, compile with `AIPP_CFG=targets/<board>/aipp_yuv420sp.cfg` (where the size is even). Both "
            "files were checked against the recipe's preprocessing (compatibility.md, 'AIPP')."
        )
    else:
        pre_text = (
            "The input is not a 3-channel image: feed float32 tensors of the shapes in `manifest.json` (`.npy` with "
            "infer.py)."
        )
        aipp_note, aipp_howto = "", "No AIPP (the input is not an image): feed the tensors of `manifest.json`."
        if any(i.dtype != "float32" for i in recipe.inputs):
            pre_text = (
                "Inputs "
                + ", ".join(f"`{i.name}` {i.dtype} {list(i.shape)}" for i in recipe.inputs)
                + ': one `.npy` per input with infer.py, or `infer.py --tokens "101 2023 102"` for token ids '
                "(padded; a second input of the same shape gets the attention mask)."
            )
    return pre_text, aipp_note, aipp_howto


def _output_text(post: dict) -> str:
    """The README's output paragraph for a postprocess kind other than detection."""
    return {
        "classification": (
            f"Output `{post['output']}`: class scores; infer.py writes the logits (.npy) and the "
            f"top-{post.get('top_k')} classes after softmax (.json)."
        ),
        "segmentation": (
            f"Output `{post['output']}`: per-pixel class scores; infer.py writes the logits (.npy), a class-index "
            "PNG mask (argmax over classes) and the classes present (.json)."
        ),
        "argmax": (
            f"Output `{post['output']}`: logits; infer.py writes them (.npy) and the argmax over the last axis "
            "(the label of each sequence, or the predicted token at each position) (.json)."
        ),
        "none": f"Output `{post['output']}`: written as .npy by infer.py.",
    }[post["kind"]]


def _fp16_note(plan: dict | None) -> str:
    if plan is None:
        return ""
    if not plan["keep_fp32"]:
        return f"`precision.md`: every layer may run in fp16 (emulated rel error {plan['rel_error_all_fp16']})."
    return (
        f"`precision.md`: {len(plan['keep_fp32'])} layer(s) stay fp32 (the files it names in `targets/`), "
        f"emulated rel error {plan['rel_error_all_fp16']} -> {plan['rel_error_with_plan']}."
    )


def _int8_note(plan: dict | None) -> str:
    if plan is None:
        return ""
    task = plan["task_with_plan"]
    return (
        f"`precision.md`: INT8 plan, {len(plan['keep_float'])} of {plan['layers']} Cube layer(s) kept in float, "
        f"{plan['mac_share_int8']:.1%} of their MACs in INT8"
        + (f", emulated {task['metric']} {task['agreement']:.4f}" if task else "")
        + "; `targets/<board>/amct_quant.cfg` (AMCT) and `converter_lite.cfg` (full quantization) take `calibration/`."
    )
