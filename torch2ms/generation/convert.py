"""``torch2ms convert`` on a ``text_generation`` recipe: the prefill and the decode graph through the
five stages, each stage checked as generation.

Each graph is a recipe of its own (``graph_recipe``): its model is ``graph_module``, the recipe's
transformers model inside ``graphs.Prefill`` / ``graphs.Decode``, its inputs the graph's at the plan's
static shapes (seeded token ids, a full mask, a standard-normal cache), and every stage section the
generation recipe's. So the pipeline's own stages, records, fingerprints and bounds convert and check
each graph as any model (export from PyTorch with its float32 floor; the rebuild's module classes
named after transformers' classes, from the wrapper's module tree). They run in
``<output>/<name>/prefill`` and ``<output>/<name>/decode``, stage by stage in turn (prefill's
export, decode's export, prefill's rebuild, ...), so that when the decode graph's stage is checked,
the prefill graph's same stage is there: the decode graph's stages carry the generation check
(``check.GenerationCheck``), whose reference is transformers' ``generate`` on the recipe's prompts
(``reference``), computed once per run and kept in ``<output>/<name>/generation/reference.npz``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from torch2ms.generation.cache import UPDATES
from torch2ms.generation.check import REFERENCE, GenerationCheck
from torch2ms.generation.graphs import OUTPUTS, Decode, Prefill

GRAPHS = ("prefill", "decode")
FACTORY = "torch2ms.generation.convert:graph_module"
# Weights from which every stage of both graphs runs in a process of its own (when the runner is asked
# for own processes, as ``torch2ms convert`` does): MindSpore's memory pool keeps what a stage's cells
# and their generation check held, so in one process each stage starts above the last one's peak
# (benchmarks/results/generation_scale.md); a stage's process starts at MindSpore's import instead.
OWN_PROCESS_BYTES = 100 * 2**20


class PrefillGraph(Prefill):
    """``Prefill`` with its outputs named (``graphs.OUTPUTS``): the pipeline's records and bounds name them."""

    def forward(self, input_ids, attention_mask):
        return dict(zip(OUTPUTS, super().forward(input_ids, attention_mask)))


class DecodeGraph(Decode):
    """``Decode`` with its outputs named (``graphs.OUTPUTS``)."""

    def forward(self, input_ids, position, cache_position, attention_mask, keys, values):
        return dict(zip(OUTPUTS, super().forward(input_ids, position, cache_position, attention_mask, keys, values)))


def graph_module(graph: str, cache_length: int, source: dict, write: str = "blend", generate: dict | None = None):
    """The ``graph`` ("prefill" or "decode") of the model ``source`` names (its factory, kwargs,
    checkpoint and base folder, as the generation recipe's ``model``); ``write``: the decode graph's
    cache write (``cache.UPDATES``). ``generate``: the recipe's generate section, unused here but part
    of the model's kwargs, so that the graphs' stages (and their generation check) run again when it
    changes. The caller (``model_loader.build_model``) has seeded torch, as for the recipe's model."""
    from torch2ms.generation.plan import causal_lm
    from torch2ms.model_loader import import_factory, load_checkpoint

    factory = import_factory(source["factory"], [Path.cwd(), Path(source["base_dir"])])
    model = factory(**source["kwargs"])
    if source.get("checkpoint"):
        load_checkpoint(model, Path(source["checkpoint"]))
    model = causal_lm(model).eval()
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    if graph == "prefill":
        return PrefillGraph(model, layers, cache_length)
    return DecodeGraph(model, layers, cache_length, UPDATES[write])


def graph_inputs(graph: str, plan) -> list[dict]:
    """The graph's inputs at the plan's static shapes, with seeded values of the right kind."""
    g, batch, prompt, cache = plan.geometry, plan.batch, plan.prompt_length, plan.cache_length
    ids = {"name": "input_ids", "dtype": "int32", "range": [0, g.vocab]}
    if graph == "prefill":  # one graph for every gear: a sequence-length profile, checked at each in every stage
        gears = {"sequence": list(plan.gears)} if len(plan.gears) > 1 else {}
        mask = {"name": "attention_mask", "shape": [batch, prompt], "dtype": "int32", "lengths": [min(plan.gears)]}
        return [{**ids, "shape": [batch, prompt], **gears}, {**mask, **gears}]
    kv = list(g.cache_shape(batch, cache))
    return [
        {**ids, "shape": [batch, 1]},
        {"name": "position", "shape": [batch], "dtype": "int32", "range": [0, prompt + 1]},
        {"name": "cache_position", "shape": [1], "dtype": "int32", "range": [prompt, prompt + 1]},
        {"name": "attention_mask", "shape": [batch, cache], "dtype": "int32", "lengths": [prompt + 1]},
        {"name": "keys", "shape": kv, "dtype": "float32"},
        {"name": "values", "shape": kv, "dtype": "float32"},
    ]


def graph_recipe(recipe, plan, graph: str, write: str = "blend"):
    """The recipe of one graph of a generation recipe (see the module docstring)."""
    from torch2ms.recipe import parse_recipe

    spec = recipe.model
    source = {
        "factory": spec.factory,
        "kwargs": spec.kwargs,
        "checkpoint": str(recipe.resolve(spec.checkpoint).resolve()) if spec.checkpoint else None,
        "base_dir": str(Path(recipe.base_dir).resolve()),
    }
    kwargs = {"graph": graph, "cache_length": plan.cache_length, "source": source, "write": write}
    kwargs["generate"] = recipe.generate.model_dump(mode="json")
    sections = ("check", "export", "rebuild", "fold", "compile", "mindir")
    data = {
        "name": graph,
        "model": {"factory": FACTORY, "kwargs": kwargs, "seed": spec.seed, "init": "as_is"},
        "inputs": graph_inputs(graph, plan),
        **{s: getattr(recipe, s).model_dump(mode="json") for s in sections},
        "converters": list(recipe.converters),
    }
    return parse_recipe(data, f"{recipe.name} ({graph} graph)", recipe.base_dir)


def write_reference(model, plan, folder: Path) -> Path:
    """transformers' greedy ``generate`` by the recipe's ``model`` on the plan's prompts, saved as
    ``REFERENCE`` in ``folder``."""
    from torch2ms.generation.reference import transformers_generate
    from torch2ms.pipeline.workspace import save_npz

    ref = transformers_generate(model, plan.prompts, plan.max_new_tokens, plan.cache_length, plan.batch, plan.gears)
    folder.mkdir(parents=True, exist_ok=True)
    save_npz(folder / REFERENCE, {"tokens": ref.tokens.astype(np.int64), "logits": ref.logits})
    return folder / REFERENCE


def generation_runners(recipe, out_root: Path | None, log: Callable, own_processes: bool, write: str = "blend"):
    """The prefill and the decode graph's ``pipeline.runner.Runner``, the decode one's stages carrying
    the generation check, each stage in a process of its own from ``OWN_PROCESS_BYTES`` of weights;
    the reference is written first (torch, in this process)."""
    from torch2ms.generation.plan import generation_plan, write_plan
    from torch2ms.model_loader import build_model
    from torch2ms.stages import pipeline_runner

    root = Path(out_root or recipe.output) / recipe.name
    model = build_model(recipe)
    plan = generation_plan(recipe, model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    reference = write_reference(model, plan, root / "generation")
    del model
    write_plan(root, plan)
    runners = {
        g: pipeline_runner(graph_recipe(recipe, plan, g, write), root, log=log, own_processes=own_processes)
        for g in GRAPHS
    }
    check = GenerationCheck(
        runners["prefill"].run_dir.root,
        reference,
        plan.prompts,
        plan.batch,
        plan.max_new_tokens,
        plan.cache_length,
        recipe.check.noise_factor,
        plan.gears,
    )
    for stage in runners["decode"].stages:
        stage.checks = (check,)
    if weight_bytes >= OWN_PROCESS_BYTES:
        for stage in runners["prefill"].stages + runners["decode"].stages:
            stage.own_process = True
    return runners


def run_generation(runners: dict, from_stage: str | None = None, force: bool = False, until: str | None = None) -> dict:
    """Both graphs' stages in turn (see the module docstring) until one fails; returns each graph's
    ``RunResult``: every stage's result from the run that reached it, the rest "not run"."""
    from torch2ms.pipeline.evidence import NOT_CHECKABLE
    from torch2ms.pipeline.runner import RunResult, StageResult

    names = runners["prefill"].names
    last = names.index(until) if until else len(names) - 1
    start = names.index(from_stage) if from_stage else (0 if force else None)
    results = {
        g: RunResult(r.recipe, r.run_dir.root, task_note=r.checks.task_note(r.recipe)) for g, r in runners.items()
    }
    stopped = False
    for i, name in enumerate(names):
        for graph in GRAPHS:
            if stopped or i > last:
                results[graph].stages.append(StageResult(name, "not run", declared=runners[graph].stages[i]))
                continue
            again = name if start is not None and i >= start else None
            run = runners[graph].run(from_stage=again, until=name)
            results[graph].stages.append(run.stages[i])
            results[graph].seconds += run.seconds
            stopped = run.stages[i].status not in ("passed", "up to date", "disabled", NOT_CHECKABLE)
    return results
