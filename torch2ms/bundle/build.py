"""``torch2ms package``: a checked run folder -> one reproducible deployment archive.

The archive holds the MindIR and the ONNX, the reference samples, ``infer.py``, conversion
scripts for one board, a compatibility report and ``manifest.json`` (what the model takes and
returns, how to preprocess, the equivalence figures of every stage, versions, the recipe, and
the sha256 of every other file). Its name is ``<name>-<version>.tar.gz``; the default version is
``<torch2ms version>-<first 8 hex digits of the recipe's sha256>``, so a changed recipe gives a
new file name and the same recipe the same bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch2ms import __version__
from torch2ms.bundle import aipp, board_onnx, compat, fusion_switch, int8, lint, targets
from torch2ms.bundle import fp16 as fp16_plan
from torch2ms.bundle import readme as bundle_readme
from torch2ms.bundle.readme import TEMPLATES
from torch2ms.errors import CheckFailed, RecipeError, Torch2msError
from torch2ms.pipeline.result import RunResult
from torch2ms.pipeline.workspace import load_npz, sha256_file, split_reference
from torch2ms.recipe import Recipe
from torch2ms.runtime import mindir_layout
from torch2ms.stages import writer_of

FORMAT = "torch2ms-bundle/1"
TOP_K = 5


@dataclass
class Packaged:
    path: Path
    version: str
    manifest: dict
    sizes: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def default_version(recipe: Recipe) -> str:
    return f"{__version__}-{recipe.sha256()[:8]}"


def image_geometry(recipe: Recipe) -> tuple[bool, tuple[int, int] | None]:
    """(does the model take one 1x3xHxW float32 image, (H, W)); checks ``preprocess.resize`` against it.
    Token ids, masks and other integer or bool inputs are never images: no preprocessing, no AIPP."""
    shape = recipe.inputs[0].shape
    is_image = (
        len(recipe.inputs) == 1
        and len(shape) == 4
        and shape[0] == 1
        and shape[1] == 3
        and recipe.inputs[0].dtype == "float32"
    )
    size = (shape[2], shape[3]) if is_image else None
    resize = recipe.preprocess.resize
    if resize is not None and is_image and tuple(resize) != size:
        raise RecipeError(
            f"preprocess.resize is {list(resize)} but input {recipe.inputs[0].name!r} is {list(shape)}: the model has "
            "fixed shapes",
            hint=f"set preprocess.resize to [{size[0]}, {size[1]}] (height, width) or remove it",
        )
    return is_image, size


def postprocess_spec(recipe: Recipe, out_name: str, out_shape: tuple[int, ...]) -> dict:
    names = list(recipe.class_names) if recipe.class_names else None
    if recipe.task == "classification":
        classes = out_shape[-1]
        kind = {
            "kind": "classification",
            "output": out_name,
            "op": "softmax over the last axis, then top-k",
            "top_k": min(TOP_K, classes),
        }
    elif recipe.task == "segmentation":
        classes = out_shape[1] if len(out_shape) == 4 else None
        if classes is None:
            raise RecipeError(
                f"task: segmentation, but output {out_name!r} has shape {list(out_shape)}; expected N x classes x H x W"
            )
        kind = {"kind": "segmentation", "output": out_name, "op": "argmax over axis 1 (classes) -> class-index mask"}
    elif recipe.task in ("sequence_classification", "language_model"):
        return {"kind": "argmax", "output": out_name, "op": "argmax over the last axis (label or token per row)"}
    else:
        return {"kind": "none", "output": out_name, "class_names": None}
    if names is not None and len(names) != classes:
        raise RecipeError(
            f"class_names has {len(names)} entries but output {out_name!r} has {classes} classes",
            hint="list one name per class, in index order",
        )
    return {**kind, "class_names": names}


def bundle_tolerance(recipe: Recipe, record: dict) -> dict:
    """What ``verify`` and ``infer.py --self-check`` hold the MindIR to: the bound its stage passed
    under (stage.json ``bounds``: the recipe's, or ``check.noise_factor`` times the network's float32
    noise floor where that is looser), the loosest over the outputs, and the task gate it passed
    (``task.gate``). A network float32 cannot compute closer than the recipe's bound packages and
    verifies under the bound its conversion was checked at (benchmarks/results/design_measurements.md,
    "A bundle's tolerance")."""
    tol = {"rel_error": recipe.check.rel_error, "cosine": recipe.check.cosine, "by": "recipe"}
    for b in (record.get("bounds") or {}).values():
        if b["rel_error"] > tol["rel_error"] or b["cosine"] < tol["cosine"]:
            tol = {
                "rel_error": max(tol["rel_error"], b["rel_error"]),
                "cosine": min(tol["cosine"], b["cosine"]),
                "by": b["by"],
            }
    gate = (record.get("task") or {}).get("gate")
    if gate:
        tol["task_agreement"], tol["task_by"] = gate["agreement"], gate["by"]
    return tol


def stage_figures(records: dict[str, dict]) -> list[dict]:
    out = []
    for stage, rec in records.items():
        out.append(
            {
                "stage": stage,
                "status": rec.get("status"),
                "worst": rec.get("worst"),
                "metrics": rec.get("metrics", []),
                "counts": rec.get("counts", {}),
            }
        )
    return out


def build_bundle(
    result: RunResult,
    out_dir: Path,
    target_name: str = "atlas-200i-dk-a2",
    version: str | None = None,
    precision: str = "fp16",
    log: Callable[[str], None] = print,
) -> Packaged:
    """Package the run ``stages.pipeline_runner(recipe).run()`` returned; every enabled stage must have passed."""
    version = _checked_version(result.recipe, precision, version)
    files, manifest, warnings = bundle_payload(result, target_name, version, precision, log)
    return write_bundle(out_dir / f"{result.recipe.name}-{version}.tar.gz", files, manifest, warnings, log)


def bundle_payload(result: RunResult, target_name: str, version: str, precision: str, log: Callable[[str], None]):
    """(files by archive name, manifest.json without its ``files``, warnings) of the run ``result``,
    every enabled stage passed: what ``write_bundle`` seals; ``version`` checked (``_checked_version``)."""
    recipe, run_root = result.recipe, result.root
    target = targets.get_target(target_name)
    is_image, size = image_geometry(recipe)
    records = _passed_records(result)
    mindir, onnx_path, ref_path = _run_files(recipe, run_root)
    arrays = load_npz(ref_path)
    ref_in, ref_out = split_reference(arrays)
    inputs, outputs = _io_specs(recipe, arrays, list(ref_out[0]))
    targets.check_batch(target, inputs)
    preprocess = _preprocess_spec(recipe, is_image, size)
    tolerance = bundle_tolerance(recipe, records[writer_of("network.mindir", recipe)])
    # what ATC and AMCT read (board_onnx: opset 11, checked against PyTorch); the plans are made on it
    board, opset_note = board_onnx.board_onnx(recipe, run_root, onnx_path, ref_path, tolerance, log)
    plan, int8_plan, calib = _precision_plans(recipe, run_root, board, ref_path, precision, is_image, log)
    log("scanning the model for the target and measuring the fp16 error budget")
    report = compat.build_report(board, mindir, ref_in, ref_out, precision, tolerance, plan)
    report["warnings"] += [opset_note] if opset_note else []
    aipp_configs = _placement_and_aipp(report, recipe, board, precision, target, preprocess, size, log)

    plans = (plan, int8_plan, calib)
    files = _payload(
        mindir, onnx_path, ref_path, recipe, target, inputs, precision, report, aipp_configs, plans, board.name
    )
    if board != onnx_path:
        files[f"model/{board_onnx.NAME}"] = board
    manifest = _manifest(recipe, version, target, precision, (inputs, outputs, preprocess, tolerance), records, report)
    manifest.update(_plan_summaries(plan, int8_plan), files={})
    _add_detection_files(files, recipe, manifest)
    fusion_switch.add(files, manifest, recipe, records, target.name)  # ATC's --fusion_switch_file
    # the opset model.onnx has: a newer one than export.opset when the export fell back to it
    opset = (records.get("export") or {}).get("extra", {}).get("export_path", {}).get("opset", recipe.export.opset)
    apart = any(name.startswith(f"model/{mindir_layout.VARIABLES}/") for name in files)
    with_board = f"model/{board_onnx.NAME}" in files
    readme = bundle_readme.readme(
        recipe, version, target, precision, manifest, is_image, size, opset, apart, with_board
    )
    files["README.md"] = readme.encode()
    lint.raise_for(lint.lint_files({k: v for k, v in files.items() if isinstance(v, bytes)}), "package")
    return files, manifest, report["warnings"]


def write_bundle(dest: Path, files: dict, manifest: dict, warnings: list[str], log: Callable[[str], None]) -> Packaged:
    """``files`` with ``manifest.json`` (its ``files`` table: every other file's sha256) as the archive ``dest``."""
    from torch2ms.bundle.archive import write_archive

    manifest["files"] = {
        name: (sha256_file(src) if isinstance(src, Path) else _sha(src)) for name, src in sorted(files.items())
    }
    files["manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    log(f"writing {dest}")
    write_archive(dest, files)
    sizes = {name: (src.stat().st_size if isinstance(src, Path) else len(src)) for name, src in sorted(files.items())}
    return Packaged(dest, manifest["model"]["version"], manifest, sizes, warnings)


def _checked_version(recipe: Recipe, precision: str, version: str | None) -> str:
    """The bundle's version (``default_version`` unless given), once the options are valid."""
    if precision not in targets.PRECISION:
        raise Torch2msError(f"--precision {precision!r} is not one of {', '.join(targets.PRECISION)}")
    version = version or default_version(recipe)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", version):
        raise Torch2msError(
            f"--version {version!r}: use letters, digits and . _ + - only (it becomes part of the file name)"
        )
    return version


def _passed_records(result: RunResult) -> dict[str, dict]:
    """Every enabled stage's record; refused unless the MindIR is enabled and every stage passed."""
    if not result.recipe.mindir.enabled:
        raise RecipeError(
            "mindir.enabled is false in the recipe: a bundle needs the MindIR",
            hint="set mindir.enabled: true and run again",
        )
    records = {}
    for s in result.stages:
        if s.status == "disabled":
            continue
        if not s.ok or not s.record or s.record.get("status") != "passed":
            raise CheckFailed(
                f"stage {s.stage!r} in {result.root} is {s.status}{': ' + s.reason if s.reason else ''}",
                hint="a bundle is only made from a run whose every enabled stage passed",
            )
        records[s.stage] = s.record
    return records


def _run_files(recipe: Recipe, run_root: Path) -> tuple[Path, Path, Path]:
    """The run's network.mindir, model.onnx and reference.npz, each from the stage that writes it."""
    paths = tuple(
        run_root / writer_of(name, recipe) / name for name in ("network.mindir", "model.onnx", "reference.npz")
    )
    for p in paths:
        if not p.is_file():
            raise CheckFailed(f"{p} is missing", hint="run `torch2ms convert` for this recipe first")
    return paths


def _io_specs(recipe: Recipe, arrays: dict, out_names: list[str]) -> tuple[list[dict], list[dict]]:
    """The manifest's ``inputs`` (from the recipe) and ``outputs`` (from the reference)."""
    outputs = [
        {"name": n, "shape": list(arrays[f"output.{n}"].shape[1:]), "dtype": str(arrays[f"output.{n}"].dtype)}
        for n in out_names
    ]
    inputs = [
        {"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "layout": "NCHW" if len(i.shape) == 4 else "ND"}
        | ({"batch": list(i.batch_sizes())} if len(i.batch_sizes()) > 1 else {})
        | ({"sequence": list(i.sequence_lengths())} if i.sequence else {})
        for i in recipe.inputs
    ]
    return inputs, outputs


def _preprocess_spec(recipe: Recipe, is_image: bool, size) -> dict:
    """The manifest's ``preprocess``: what the board's caller does to an image before the model."""
    pre = recipe.preprocess
    preprocess = {
        "image_input": is_image,
        "size_hw": list(size) if size else None,
        "resize": (
            "Pillow Image.resize((W, H), Image.BILINEAR) after convert('RGB'); skipped when the image already has "
            "that size"
        )
        if is_image
        else None,
        "color": pre.color,
        "scale": pre.scale,
        "mean": list(pre.mean),
        "std": list(pre.std),
        "formula": (
            "x = (pixel * scale - mean) / std per channel, channels in the model's order (reversed from RGB for "
            "'bgr'), HWC -> NCHW"
        ),
    }
    if recipe.task == "detection":
        from torch2ms.bundle import detection

        preprocess.update(detection.preprocess(recipe))
    return preprocess


def _precision_plans(recipe, run_root, onnx_path, ref_path, precision, is_image, log):
    """(fp16 plan, int8 plan, calibration samples) for ``precision``; None / [] where not asked."""
    plan = int8_plan = None
    calib: list[dict] = []
    if precision == "fp16":
        log("fp16 plan: which layers to keep in fp32 (precision.fp16_rel_error)")
        plan = fp16_plan.cached_plan(recipe, run_root, onnx_path, ref_path, log=log)
    elif precision == "int8":
        log("int8 plan: which Cube layers to keep in float (precision.int8_task_agreement, int8_rel_error)")
        int8_plan, calib = int8.cached_plan(recipe, run_root, onnx_path, ref_path, log=log)
    return plan, int8_plan, calib


def _placement_and_aipp(report: dict, recipe, onnx_path, precision, target, preprocess, size, log) -> dict:
    """Adds the Ascend placement (and the AIPP check, for an image input) to ``report``; returns
    the AIPP configs by file name."""
    log("placing every op on AI Core / AI CPU (op lists of the Ascend 310)")
    shapes = {i.name: tuple(i.shape) for i in recipe.inputs}
    fuse, rewrites = recipe.rebuild.fuse_conv_bn_act, recipe.fold.ascend_rewrites
    report["ascend"] = compat.ascend_placement(onnx_path, shapes, precision, fuse, rewrites, target.soc_version)
    report["warnings"] += compat.placement_warnings(report["ascend"])
    aipp_configs = targets.aipp_configs(preprocess, *size) if preprocess["image_input"] else {}
    if aipp_configs:
        log("checking the AIPP configs against the recipe's preprocessing")
        report["aipp"] = aipp.check_bundle(aipp_configs, preprocess, size)
    return aipp_configs


def _payload(
    mindir, onnx_path, ref_path, recipe, target, inputs, precision, report, aipp_configs, plans, board_name
) -> dict:
    """The bundle's files by archive name (a path to copy, or bytes), in archive order, before the
    detection files, README.md and manifest.json; ``board_name``: the ONNX atc.sh compiles
    (``board_onnx``), in ``model/``."""
    plan, int8_plan, calib = plans
    tdir = f"targets/{target.name}"
    detecting = recipe.task == "detection"
    files: dict[str, Path | bytes] = {
        **mindir_layout.bundle_entries(mindir.parent),  # model/network.mindir (+ model/network_variables/)
        "model/model.onnx": onnx_path,
        "samples/reference.npz": ref_path,
        "infer.py": (TEMPLATES / "infer.py").read_bytes(),
        f"{tdir}/converter_lite.sh": targets.converter_lite_sh(target, recipe.name, inputs, precision).encode(),
        f"{tdir}/converter_lite.cfg": targets.converter_lite_cfg(
            precision,
            inputs,
            plan,
            # converter_lite quantizes every layer (no per-ONNX-node skip): only when all INT8 meets the gate
            int8.converter_lite_sections(int8_plan, inputs[0]["name"], len(calib))
            if int8_plan and int8_plan["before"]["ok"]
            else None,
            fp32_outputs=detecting,
        ).encode(),
        f"{tdir}/atc.sh": targets.atc_sh(
            target,
            recipe.name,
            inputs,
            precision,
            with_aipp=image_geometry(recipe)[0],
            fp32_outputs=detecting,
            keep_dtype=bool(plan and fp16_plan.keep_dtype_text(plan)),
            onnx_name=board_name,
        ).encode(),
        "compatibility.json": (json.dumps({"target": target.__dict__, **report}, indent=2) + "\n").encode(),
        "compatibility.md": compat.report_markdown(report, target, recipe.name).encode(),
    }
    files.update({f"{tdir}/{name}": text.encode() for name, (text, _) in aipp_configs.items()})
    files.update(_plan_files(tdir, recipe, inputs, precision, plan, int8_plan, calib))
    return files


def _plan_files(tdir: str, recipe, inputs, precision, plan, int8_plan, calib) -> dict[str, bytes]:
    """The precision plan's files: precision.md/.json and the converters' configs that apply it."""
    files = {}
    if plan is not None:
        files.update({f"{tdir}/{name}": text.encode() for name, text in fp16_plan.bundle_files(plan).items()})
        files["precision.md"] = fp16_plan.plan_markdown(plan, recipe.name).encode()
        files["precision.json"] = (
            json.dumps({k: v for k, v in plan.items() if k not in ("key", "seconds")}, indent=2) + "\n"
        ).encode()
    if int8_plan is not None:
        files[f"{tdir}/amct_quant.cfg"] = int8.amct_config(int8_plan, len(calib)).encode()
        sections = int8.converter_lite_sections(int8_plan, inputs[0]["name"], len(calib))
        files[f"{tdir}/converter_lite_int8.cfg"] = (
            int8.LITE_HEADER
            + targets.converter_lite_cfg(precision, inputs, None, sections, fp32_outputs=recipe.task == "detection")
        ).encode()
        files.update(int8.calibration_files(calib))
        files["precision.md"] = int8.plan_markdown(int8_plan, recipe.name).encode()
        files["precision.json"] = int8.precision_json(int8_plan).encode()
    return files


def _manifest(recipe, version, target, precision, specs, records, report) -> dict:
    """manifest.json up to ``aipp_check``: the plans' summaries and ``files`` come after.
    ``specs``: (inputs, outputs, preprocess, tolerance)."""
    inputs, outputs, preprocess, tolerance = specs
    if recipe.task == "detection":
        from torch2ms.bundle import detection

        postprocess = detection.manifest_postprocess(recipe, outputs, records)
    else:
        postprocess = postprocess_spec(recipe, outputs[0]["name"], tuple(outputs[0]["shape"]))
    mindir_versions = records[writer_of("network.mindir", recipe)].get("fingerprint_of", {}).get("versions", {})
    return {
        "format": FORMAT,
        "model": {"name": recipe.name, "version": version, "task": recipe.task},
        "target": {
            "name": target.name,
            "board": target.board,
            "soc_version": target.soc_version,
            "precision": precision,
            "precision_means": targets.PRECISION_MEANING[precision],
            "mindspore_lite": "documented" if target.lite_verified else targets.LITE_UNVERIFIED_NOTE,
        },
        "inputs": inputs,
        "outputs": outputs,
        "preprocess": preprocess,
        "postprocess": postprocess,
        "tolerance": tolerance,
        "stages": stage_figures(records),
        "versions": mindir_versions,
        "recipe": recipe.model_dump(mode="json"),
        "recipe_sha256": recipe.sha256(),
        "warnings": report["warnings"],
        "aipp_check": report.get("aipp"),
    }


def _plan_summaries(plan, int8_plan) -> dict:
    """The manifest's ``fp16_plan`` (None without one) and, with an INT8 plan, ``int8_plan``."""
    out = {"fp16_plan": fp16_plan.summary(plan) if plan is not None else None}
    if int8_plan is not None:
        out["int8_plan"] = int8.summary(int8_plan)
    return out


def _add_detection_files(files: dict, recipe, manifest: dict) -> None:
    """A detection bundle's postprocessing files, and its section of compatibility.md."""
    if recipe.task != "detection":
        return
    from torch2ms.bundle import detection

    files.update(detection.bundle_files())
    files["compatibility.md"] += ("\n" + detection.compat_markdown(manifest)).encode()


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
