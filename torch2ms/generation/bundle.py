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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.errors import Torch2msError
from torch2ms.generation.loop import DECODE_INPUTS, OUTPUTS, PREFILL_INPUTS

GRAPHS = ("prefill", "decode")  # as generation.convert.GRAPHS (that module imports torch)
SAMPLES = "samples/generation.npz"
PRECISIONS = ("fp16", "cube-fp16", "fp32")


def graph_precisions(recipe, precision: str) -> dict[str, str]:
    """The precision each graph's MindIR and board scripts are packaged at: the one place where it is
    chosen (``--precision`` for both graphs). INT8 of the Cube layers is refused: it needs calibration
    images and a task gate, which generation has not; a weight-only plan belongs here."""
    if precision not in PRECISIONS:
        raise Torch2msError(
            f"--precision {precision!r}: a text_generation bundle takes {', '.join(PRECISIONS)}",
            hint="int8 quantizes activations from calibration images; package the generation graphs in fp16 or fp32",
        )
    return {graph: precision for graph in GRAPHS}


def build_generation_bundle(results: dict, recipe, out_dir: Path, target: str, version, precision: str, log: Callable):
    """Write ``<out_dir>/<name>-<version>.tar.gz`` from the two graphs' runs (``results``: graph ->
    ``RunResult``, every enabled stage passed); see the module docstring."""
    from torch2ms.bundle import build

    version = build._checked_version(recipe, precision, version)
    precisions = graph_precisions(recipe, precision)
    files: dict = {}
    graphs, warnings = {}, []
    for graph in GRAPHS:
        log(f"{graph} graph")
        payload, manifest, notes = build.bundle_payload(results[graph], target, version, precisions[graph], log)
        files.update({f"{graph}/{name}": src for name, src in payload.items() if name not in ("README.md", "infer.py")})
        graphs[graph] = manifest
        warnings += [f"{graph}: {note}" for note in notes]
    folder = Path(results["prefill"].root).parent / "generation"
    plan = json.loads((folder / "plan.json").read_text())  # convert.PLAN
    files[SAMPLES] = _samples(plan, folder)
    files["infer.py"] = (build.TEMPLATES / "generate.py").read_bytes()
    manifest = _manifest(recipe, version, plan, graphs, precisions, warnings)
    files["README.md"] = _readme(recipe.name, version, manifest).encode()
    return build.write_bundle(out_dir / f"{recipe.name}-{version}.tar.gz", files, manifest, warnings, log)


def _samples(plan: dict, folder: Path) -> Path:
    """``SAMPLES`` written into the run's generation folder (byte-identical for the same run)."""
    from torch2ms.generation.compare import top2_gaps
    from torch2ms.pipeline.workspace import load_npz, save_npz

    prompts = plan["prompts"]
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


def _manifest(recipe, version: str, plan: dict, graphs: dict, precisions: dict, warnings: list[str]) -> dict:
    from torch2ms.bundle.build import FORMAT

    g = plan["geometry"]
    cache = [g["layers"], plan["batch"], g["kv_heads"], plan["cache_length"], g["head_dim"]]
    return {
        "format": FORMAT,
        "model": {"name": recipe.name, "version": version, "task": recipe.task},
        "target": {**graphs["prefill"]["target"], "precision": precisions},
        "generation": {
            "batch": plan["batch"],
            "prompt_gears": list(plan["gears"]),
            "padding": "left: a batch's prompts end at its gear's last column, pads (id 0, mask 0) before them",
            "pad_id": 0,
            "max_new_tokens": plan["max_new_tokens"],
            "vocab": g["vocab"],
            "positions": g["positions"],
            "cache": {
                "cache_length": plan["cache_length"],
                "layers": g["layers"],
                "kv_heads": g["kv_heads"],
                "head_dim": g["head_dim"],
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
