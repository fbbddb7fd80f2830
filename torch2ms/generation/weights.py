"""``torch2ms load-weights`` on a generation recipe: a transformers ``state_dict`` into both converted
graphs, checked as generation.

The graphs' models are the wrappers around the causal LM (``convert.graph_module``), whose state_dict
keys are the LM's under ``model.``: the user's keys (``model.layers.0...``, ``lm_head.weight``, as
``LlamaForCausalLM.state_dict()`` gives them) get that prefix, and each graph's run takes them as any
run does (``tools.load_weights``: keys and shapes checked, the code regenerated and required identical,
the outputs checked against PyTorch's with the same weights). Then the new checkpoints generate: the
rebuild and fold stages' prefill and decode cells, greedy over the recipe's prompts, against
transformers' ``generate`` with the same weights (``check.judge``, the stage's recorded logits bound).
A graph's checkpoints are written once its load-weights check passes (the prefill's first); the
generation check runs on the written checkpoints and fails the command (exit 1) when a stage does not
generate transformers' tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from torch2ms.errors import CheckFailed

PREFIX = "model."  # the causal LM inside graphs.Prefill / graphs.Decode


def load_generation_weights(recipe, root: Path, state_path: Path, log=print) -> dict:
    """Both graphs' checkpoints from ``state_path`` (see the module docstring); returns, per graph,
    ``tools.load_weights``' written stages, and the generation records per stage under "generation"."""
    import torch

    from torch2ms.generation.convert import GRAPHS, graph_recipe
    from torch2ms.generation.plan import generation_plan
    from torch2ms.model_loader import build_model, load_checkpoint
    from torch2ms.pipeline.workspace import RunDir
    from torch2ms.tools.load_weights import load_weights, read_state_dict

    state = read_state_dict(state_path)
    model = build_model(recipe)
    plan = generation_plan(recipe, model)
    load_checkpoint(model, state_path)  # the transformers model with the user's weights: the reference
    written = {}
    with tempfile.TemporaryDirectory(prefix="torch2ms-generation-weights-") as tmp:
        prefixed = Path(tmp) / state_path.name  # the same stem: the checkpoints are network.<stem>.ckpt
        torch.save({PREFIX + k: torch.from_numpy(v) for k, v in state.items()}, prefixed)
        runs = {g: RunDir(root / g) for g in GRAPHS}
        for g in GRAPHS:  # each graph's keys, shapes, code and outputs, before its checkpoints are written
            written[g] = load_weights(graph_recipe(recipe, plan, g), runs[g], prefixed, log=log)
    written["generation"] = _generate(model, plan, runs, written, recipe.check.noise_factor, log)
    return written


def _generate(model, plan, runs: dict, written: dict, noise_factor: float, log) -> dict:
    """Each stage's new checkpoints, greedy, against transformers' ``generate`` with the same weights;
    the near-tie bound as ``check.GenerationCheck.noise``, from the conversion's export record."""
    from torch2ms.generation.check import judge, stage_generation
    from torch2ms.generation.reference import transformers_generate

    gears = tuple(getattr(plan, "gears", None) or ()) or None
    reference = transformers_generate(model, plan.prompts, plan.max_new_tokens, plan.cache_length, plan.batch, gears)
    records, failures = {}, []
    for weights in written["decode"]:
        stage = weights.stage
        folders = {g: runs[g].stage_dir(stage) for g in runs}
        checkpoints = {g: next(w.checkpoint for w in written[g] if w.stage == stage) for g in runs}
        run = (plan.prompts, plan.batch, plan.max_new_tokens, plan.cache_length)
        free, forced = stage_generation(stage, folders, {}, None, *run, reference.tokens, gears, checkpoints)
        record = runs["decode"].read_record(stage) or {}
        bound = (record.get("bounds") or {}).get("logits") or {"rel_error": 1e-4, "cosine": 0.99999}
        export = ((runs["decode"].read_record("export") or {}).get("extra") or {}).get("generation", {})
        noise = max(noise_factor, 1.0) * export.get("max_abs_logit_diff", 0.0)
        violations, records[stage] = judge(reference, free, forced, bound, noise)
        log(f"load-weights: {stage} generates {records[stage]['tokens_equal']} of transformers' tokens")
        failures += [f"{stage}: {v}" for v in violations]
    if failures:
        raise CheckFailed("the new weights do not generate as transformers does: " + "; ".join(failures))
    return records
