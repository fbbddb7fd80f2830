"""``torch2ms package`` on a ``text_generation`` recipe: one archive that generates on the board.

Each graph is packaged as any converted model (``bundle.build.bundle_payload``: its MindIR, ONNX,
board ONNX, reference samples, compatibility report and the ATC and converter_lite scripts and
configs, linted against ``bundle.vendor_flags``) into its own folder of the archive, ``prefill/``
and ``decode/``, laid out as a one-model bundle, so that each folder's ``targets/<board>/atc.sh``
compiles its own graph. The prefill graph's inputs are a sequence-length profile at more than one
prompt gear, so its ``atc.sh`` carries ``--dynamic_dims`` with one profile per gear. Beside them:

* ``infer.py``: the generation loop (``bundle/templates/generate.py``), numpy and MindSpore
  (Lite) only;
* ``samples/generation.npz``: the recipe's prompts (``prompt_ids`` right-padded with -1,
  ``prompt_lengths``) and transformers' greedy tokens for them (``tokens``) with the top-2 logit
  gap of each step (``gaps``), what ``verify`` and ``infer.py --self-check`` hold the bundle to;
* ``manifest.json``: the graphs' manifests (``graphs``) and the ``generation`` section the loop
  reads: batch, gears, padding, the static cache (cache_length, layers, kv heads, head_dim, dtype).

``--precision w8a16``: the graphs packaged as fp32, their MindIRs then replaced by the W8A16 plan's
(``bundle.w8a16``: Linear weights and token embeddings int8 per row, the layers that break
generation kept float; reloaded and checked as generation), and the ONNX models by ones holding the
same int8 weights (``bundle.w8a16_onnx``: Cast and Mul before their readers; checked generating on
onnxruntime), with ``precision/w8a16_plan.json`` and ``.md`` and a ``w8a16`` section in the
manifest. The board scripts (ATC) run at fp32. Refused, nothing written, when the plan's reloaded
MindIRs or the int8 ONNX models do not generate transformers' tokens free-running (the bundle's
``verify`` and ``infer.py --self-check`` hold it to them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.errors import Torch2msError
from torch2ms.generation.loop import DECODE_INPUTS, OUTPUTS, PREFILL_INPUTS
from torch2ms.generation.plan import read_plan
from torch2ms.runtime import mindir_layout

GRAPHS = ("prefill", "decode")  # as generation.convert.GRAPHS (that module imports torch)
SAMPLES = "samples/generation.npz"
PRECISIONS = ("fp16", "cube-fp16", "fp32", "w8a16")
W8A16 = "w8a16"
W8A16_FOLDER = "precision/w8a16"  # in the run folder: where `torch2ms precision --plan w8a16` writes its plan


def graph_precisions(recipe, precision: str) -> dict[str, str]:
    """The precision each graph's board scripts are packaged at: the one place where it is chosen
    (``--precision`` for both graphs; ``w8a16``: fp32 scripts, the MindIRs the W8A16 plan's). INT8 of
    the Cube layers is refused: it needs calibration images and a task gate, which generation has not."""
    if precision not in PRECISIONS:
        raise Torch2msError(
            f"--precision {precision!r}: a text_generation bundle takes {', '.join(PRECISIONS)}",
            hint="int8 quantizes activations from calibration images; package the generation graphs in fp16 or fp32, "
            "or their weights in int8 with w8a16",
        )
    return {graph: "fp32" if precision == W8A16 else precision for graph in GRAPHS}


def build_generation_bundle(results: dict, recipe, out_dir: Path, target: str, version, precision: str, log: Callable):
    """Write ``<out_dir>/<name>-<version>.tar.gz`` from the two graphs' runs (``results``: graph ->
    ``RunResult``, every enabled stage passed); see the module docstring."""
    from torch2ms.bundle import build

    precisions = graph_precisions(recipe, precision)
    version = build._checked_version(recipe, precisions["decode"], version)
    run_root = Path(results["prefill"].root).parent
    w8 = _w8a16_plan(recipe, run_root, log) if precision == W8A16 else None
    if w8 and not version.endswith("-w8a16"):
        version += "-w8a16"
    files: dict = {}
    graphs, warnings = {}, []
    for graph in GRAPHS:
        log(f"{graph} graph")
        payload, manifest, notes = build.bundle_payload(results[graph], target, version, precisions[graph], log)
        files.update({f"{graph}/{name}": src for name, src in payload.items() if name not in ("README.md", "infer.py")})
        if w8:  # the fp32 MindIR's files out, the plan's in
            files = {k: v for k, v in files.items() if not _is_mindir(k, graph)}
            files.update(mindir_layout.bundle_entries(w8["folder"] / graph, prefix=f"{graph}/model"))
        graphs[graph] = manifest
        warnings += [f"{graph}: {note}" for note in notes]
    if w8:
        w8["onnx"] = _w8a16_onnx(files, w8, run_root, log)
    plan = read_plan(run_root)
    files[SAMPLES] = _samples(plan, run_root / "generation")
    files["infer.py"] = (build.TEMPLATES / "generate.py").read_bytes()
    manifest = _manifest(recipe, version, plan, graphs, precisions, warnings)
    if w8:
        files.update(w8["files"])
        manifest["target"]["precision"] = {graph: f"{W8A16} (board scripts: fp32)" for graph in GRAPHS}
        manifest[W8A16] = {**_w8a16_section(w8["plan"]), "onnx": w8["onnx"]}
    files["README.md"] = _readme(recipe.name, version, manifest).encode()
    return build.write_bundle(out_dir / f"{recipe.name}-{version}.tar.gz", files, manifest, warnings, log)


def _is_mindir(name: str, graph: str) -> bool:
    model = f"{graph}/model/"
    return name == model + mindir_layout.GRAPH or name.startswith(f"{model}{mindir_layout.VARIABLES}/")


def _w8a16_plan(recipe, run_root: Path, log: Callable) -> dict:
    """The W8A16 plan of the run (made, or reused from ``<run>/precision/w8a16``): its folder, plan and
    bundle files; ``CheckFailed`` when its reloaded MindIRs do not generate transformers' tokens."""
    from torch2ms.bundle import w8a16, w8a16_report
    from torch2ms.errors import CheckFailed

    folder = run_root / W8A16_FOLDER
    paths = w8a16.w8a16_mindirs(recipe, run_root, folder, log=log)
    plan = json.loads(paths["plan"].read_text())
    g = plan["generation"]
    total = g["tokens_equal"].split("/")[1]
    if g["tokens_equal"] != f"{total}/{total}" or plan["violations"]:
        raise CheckFailed(
            f"--precision w8a16: the W8A16 plan's MindIRs ({folder}) do not generate transformers' tokens: "
            f"{g['tokens_equal']} equal free-running, first difference {g['first_difference'] or 'none'}"
            + "".join(f"; {v}" for v in plan["violations"]),
            hint="a bundle's verify holds it to transformers' tokens: package fp32 or fp16, or see the plan's "
            "precision.md (near-ties, the layers kept float)",
        )
    markdown = w8a16_report.plan_markdown(plan, recipe.name).encode()
    files = {"precision/w8a16_plan.json": paths["plan"], "precision/w8a16_plan.md": markdown}
    return {"folder": folder, "plan": plan, "files": files}


def _w8a16_onnx(files: dict, w8: dict, run_root: Path, log: Callable) -> dict:
    """The graphs' ONNX models in ``files`` (model.onnx and the board's) replaced by ones holding the
    plan's int8 weights (``bundle.w8a16_onnx``, written under the plan's folder), then checked generating
    on onnxruntime against transformers as the plan's MindIRs are: each graph's model.onnx, and each
    graph's board ONNX where one is packaged. ``CheckFailed`` on a differing token; returns the
    manifest's record (the layers int8 in each file, the bytes, the agreement)."""
    from torch2ms.bundle import w8a16, w8a16_onnx
    from torch2ms.bundle.board_onnx import NAME as BOARD
    from torch2ms.errors import CheckFailed

    plan = w8["plan"]
    setup, reference = w8a16.generation_setup(run_root)
    record: dict = {"files": {}, "generation": {}}
    for graph in GRAPHS:
        fold = run_root / graph / "fold" / "network.ckpt"
        weights = w8a16_onnx.layer_weights(fold, plan["int8"], set(plan["embedding"]))
        for name in sorted(k for k in files if k.startswith(f"{graph}/model/") and k.endswith(".onnx")):
            dest = w8["folder"] / "onnx" / graph / Path(name).name
            figures = w8a16_onnx.quantize_onnx(Path(files[name]), dest, weights)
            files[name] = dest
            record["files"][name] = {
                "int8_layers": len(figures["layers"]),
                "float_layers": sorted(set(plan["int8"]) - set(figures["layers"])),
                "bytes": {"fp32": figures["float_bytes"], "w8a16": figures["int8_bytes"]},
            }
    models = {g: files[f"{g}/model/model.onnx"] for g in GRAPHS}
    boards = {g: files.get(f"{g}/model/{BOARD}", models[g]) for g in GRAPHS}
    for kind, paths in (("model.onnx", models), ("board", boards)):
        if kind == "board" and paths == models:
            continue
        log(f"w8a16: the int8 ONNX models ({kind}) generating on onnxruntime")
        violations, checked = w8a16_onnx.check_onnx(paths, setup, reference, plan["near_tie"]["bound"])
        if violations:
            raise CheckFailed(
                f"--precision w8a16: the int8 ONNX models ({', '.join(str(p) for p in paths.values())}) do not "
                f"generate transformers' tokens on onnxruntime: {'; '.join(violations)}",
                hint="the MindIRs of the plan passed: package fp32, or report the model (the ONNX rewrite is "
                "torch2ms.bundle.w8a16_onnx)",
            )
        record["generation"][kind] = {k: checked[k] for k in ("tokens_equal", "teacher_forced_equal", "near_ties")}
    return record


def _w8a16_section(plan: dict) -> dict:
    """The manifest's ``w8a16`` section: what is int8, the sizes, the agreement."""
    m, g, t = plan["mindir"], plan["generation"], plan["near_tie"]
    return {
        "weights": "int8 per row (symmetric, scale max|w|/127, one float32 scale per row), dequantized in the graph",
        "int8": plan["int8"],
        "float": plan["keep_float"],
        "lm_head": plan["lm_head"],
        "embedding": plan["embedding"],
        "mindir_bytes": {"fp32": sum(m["fp32_bytes"].values()), "w8a16": sum(m["w8a16_bytes"].values())},
        "ratio": m["ratio"],
        "tokens_equal": g["tokens_equal"],
        "teacher_forced_equal": g["teacher_forced_equal"],
        "near_ties": g["near_ties"],
        "near_tie_bound": t["bound"],
        "worst_step_rel_error": g["worst_step"]["rel_error"],
        "plan": "precision/w8a16_plan.json",
    }


def _samples(plan, folder: Path) -> Path:
    """``SAMPLES`` written into the run's generation folder (byte-identical for the same run)."""
    from torch2ms.generation.compare import top2_gaps
    from torch2ms.pipeline.workspace import load_npz, save_npz

    prompts = plan.prompts
    ids = np.full((len(prompts), max(len(p) for p in prompts)), -1, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    reference = load_npz(folder / "reference.npz")  # check.REFERENCE
    path = folder / Path(SAMPLES).name
    save_npz(
        path,
        {
            "prompt_ids": ids,
            "prompt_lengths": np.array([len(p) for p in prompts], dtype=np.int32),
            "tokens": reference["tokens"].astype(np.int64),
            "gaps": top2_gaps(reference["logits"]).astype(np.float32),
        },
    )
    return path


def _manifest(recipe, version: str, plan, graphs: dict, precisions: dict, warnings: list[str]) -> dict:
    from torch2ms.bundle.build import FORMAT

    g = plan.geometry
    cache = list(g.cache_shape(plan.batch, plan.cache_length))
    return {
        "format": FORMAT,
        "model": {"name": recipe.name, "version": version, "task": recipe.task},
        "target": {**graphs["prefill"]["target"], "precision": precisions},
        "generation": {
            "batch": plan.batch,
            "prompt_gears": list(plan.gears),
            "padding": "left: a batch's prompts end at its gear's last column, pads (id 0, mask 0) before them",
            "pad_id": 0,
            "max_new_tokens": plan.max_new_tokens,
            "vocab": g.vocab,
            "positions": g.positions,
            "cache": {
                "cache_length": plan.cache_length,
                "layers": g.layers,
                "kv_heads": g.kv_heads,
                "head_dim": g.head_dim,
                "dtype": "float32",
                "shape": cache,
            },
            "graphs": {
                "prefill": {"mindir": "prefill/model/network.mindir", "inputs": PREFILL_INPUTS, "outputs": OUTPUTS},
                "decode": {"mindir": "decode/model/network.mindir", "inputs": DECODE_INPUTS, "outputs": OUTPUTS},
            },
            "samples": SAMPLES,
            "reference": "transformers generate(do_sample=False, cache_implementation='static'), greedy",
        },
        "graphs": graphs,
        "stages": {graph: m["stages"] for graph, m in graphs.items()},
        "versions": graphs["decode"]["versions"],
        "recipe": recipe.model_dump(mode="json"),
        "recipe_sha256": recipe.sha256(),
        "warnings": warnings,
    }


def _readme(name: str, version: str, manifest: dict) -> str:
    gen = manifest["generation"]
    board = manifest["target"]["board"]
    gears = ", ".join(map(str, gen["prompt_gears"]))
    return f"""# {name} {version}: greedy text generation for {board}

Two graphs of static shapes: `prefill/` (the prompt, at one of the gears {gears}) and `decode/`
(one token per row with the KV cache [{", ".join(map(str, gen["cache"]["shape"]))}] fed back), each a
folder with its MindIR, ONNX, compatibility report and board scripts (`targets/*/atc.sh`,
`converter_lite.sh`).

    python3 infer.py --prompt-ids "1 2 3" --max-new-tokens 20
    python3 infer.py --prompt "Hello" --tokenizer tokenizer.json   # needs the tokenizers package
    python3 infer.py --self-check     # the recorded prompts against transformers' tokens

`torch2ms verify` on this archive checks every file's hash and runs `infer.py`'s loop on the
prompts of `{gen["samples"]}` against the tokens transformers generated for them.
{_w8a16_readme(manifest.get(W8A16))}"""


def _w8a16_readme(section: dict | None) -> str:
    if not section:
        return ""
    b = section["mindir_bytes"]
    kept = ", ".join(section["float"]) or "none"
    tables = ", ".join(f"{k} {v}" for k, v in section["embedding"].items()) or "none"
    layers = len(section["int8"]) + len(section["float"])
    return f"""
## W8A16

The MindIRs hold {len(section["int8"])} of their {layers} Linear weights and gathered tables in int8
({section["weights"]}); lm_head {section["lm_head"]}; tables: {tables}; kept float: {kept}.
Activations stay float32. Both MindIRs: {b["w8a16"]:,} bytes against fp32's {b["fp32"]:,}
({section["ratio"]:.3f}x). Reloaded and checked against transformers: {section["tokens_equal"]} tokens
equal free-running, {section["teacher_forced_equal"]} teacher-forced, {len(section["near_ties"])} near-ties
(`{section["plan"]}`, `precision/w8a16_plan.md`).
{_w8a16_onnx_readme(section.get("onnx"))}"""


def _w8a16_onnx_readme(onnx: dict | None) -> str:
    if not onnx:
        return ""
    checked = "; ".join(
        f"{kind}: {g['tokens_equal']} tokens equal free-running, {g['teacher_forced_equal']} teacher-forced"
        for kind, g in onnx["generation"].items()
    )
    return f"""
The ONNX models (`*/model/*.onnx`, what `atc.sh` compiles) hold the same int8 weights, each dequantized
by a Cast to float and a Mul by its scales before the MatMul or Gather that reads it; the ATC scripts
run at fp32. On onnxruntime against transformers: {checked}.
"""


def verify_generation(archive: Path, root: Path, manifest: dict, log: Callable) -> dict:
    """The unpacked bundle ``root``'s own ``infer.py`` loop (imported from it, as the board runs it)
    on the recorded prompts of ``SAMPLES``: ``CheckFailed`` naming the first step and row whose token
    is not transformers'; else the counts."""
    import importlib.util

    from torch2ms.errors import CheckFailed
    from torch2ms.runtime import msutil

    spec = importlib.util.spec_from_file_location("torch2ms_bundle_generate", root / "infer.py")
    board = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(board)
    prompts, tokens, _ = board.recorded()
    try:
        problem = board.self_check(board.load_models(manifest, "cpu"), manifest)
    finally:
        ms = msutil.mindspore()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    if problem:
        raise CheckFailed(
            f"{archive}: the bundle's generation is not transformers' on {SAMPLES}: {problem}",
            hint="the graphs or the recorded tokens changed since packaging; package again from a passing run",
        )
    log(f"generation: {tokens.size}/{tokens.size} tokens of {len(prompts)} prompts are transformers'")
    return {"prompts": len(prompts), "tokens": int(tokens.size), "gears": manifest["generation"]["prompt_gears"]}
