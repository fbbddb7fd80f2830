"""What a generation recipe means for its model: the cache geometry and the prompts, checked.

``cache_geometry(model)`` finds the model's cache interface by running the prefill graph once on
one token: a transformers causal LM whose attention layers all call ``past_key_values.update``
(every full-attention decoder of transformers 5 does). It refuses, naming ``model.factory``, a
model that is not a transformers causal LM (no ``config`` or no ``generate``), one whose
``forward`` takes no cache or positions, one with sliding-window, linear or shared-cache layers
(their caches are not one [B, kv_heads, L, head_dim] tensor per layer), and one whose layers never
wrote the cache.

``generation_plan(recipe, model)`` adds what needs the model to the recipe's own checks
(``recipe.GenerateSpec``): every prompt within the model's positions, and with its new tokens too;
every token id within the vocabulary. The export stage calls it before writing anything.

``write_plan`` / ``read_plan``: the run's plan in ``<run>/generation/plan.json`` (``PLAN``), written by
``torch2ms convert`` and read back by everything that works on a converted run (``bench``, ``bundle``,
the W8A16 plan) without building the model. This module imports torch only to find the geometry.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch2ms.errors import RecipeError, Torch2msError
from torch2ms.generation.geometry import Geometry

PLAN = "plan.json"  # in the run's generation folder


def causal_lm(model):
    """The transformers model inside ``model`` (``models.hf.KeywordInputs`` passes its inputs by keyword)."""
    from torch2ms.models.hf import KeywordInputs

    return model.model if isinstance(model, KeywordInputs) else model


def _refuse(model, why: str) -> RecipeError:
    return RecipeError(
        f"model.factory: {type(model).__name__} has no cache interface for generation: {why}",
        hint="task: text_generation takes a transformers causal LM (e.g. LlamaForCausalLM, Qwen2ForCausalLM, "
        "GPT2LMHeadModel) whose layers are all full attention",
    )


def cache_geometry(model) -> Geometry:
    """The cache and vocabulary of ``model`` (see the module docstring); ``RecipeError`` if it has none."""
    import torch

    from torch2ms.generation.graphs import Prefill

    model = causal_lm(model)
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "generate", None)):
        raise _refuse(model, "it is not a transformers model with generate()")
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    kinds = sorted(set(get_layer_types_and_kwargs(text)[0]) - {"full_attention"})
    if kinds:
        raise _refuse(model, f"layers of type {', '.join(kinds)} (only full_attention layers keep a static cache here)")
    layers = text.num_hidden_layers
    probe = Prefill(model, layers, cache_length=2).eval()
    one = torch.ones(1, 1, dtype=torch.int32)
    try:
        with torch.no_grad():
            logits, keys, _ = probe(one, one)
    except (TypeError, AttributeError) as err:
        raise _refuse(model, f"its forward does not take past_key_values and position_ids ({err})") from None
    except RuntimeError as err:
        raise _refuse(model, f"its layers did not write the cache ({err})") from None
    return Geometry(
        layers=layers,
        kv_heads=int(keys.shape[2]),
        head_dim=int(keys.shape[4]),
        vocab=int(logits.shape[-1]),
        positions=int(getattr(text, "max_position_embeddings", 0) or 0),
    )


@dataclass(frozen=True)
class Plan:
    """A generation recipe against its model: the geometry and the prompts, every size checked."""

    geometry: Geometry
    prompts: tuple[tuple[int, ...], ...]
    batch: int
    max_new_tokens: int
    cache_length: int
    gears: tuple[int, ...]  # the prefill graph's prompt lengths (``loop.gear_for``)

    @property
    def prompt_length(self) -> int:
        """The prefill graph's reference length ``P``: the largest gear (shorter prompts are left-padded)."""
        return max(self.gears)


def prompt_ids(spec, vocab: int) -> tuple[tuple[int, ...], ...]:
    """The prompts' token ids: ``spec.prompts``, or ``spec.prompt_lengths`` drawn with ``spec.seed``
    uniformly from ``spec.range`` (default [0, vocab))."""
    if spec.prompts is not None:
        return tuple(tuple(p) for p in spec.prompts)
    low, high = spec.range or (0, vocab)
    rng = np.random.default_rng(spec.seed)
    return tuple(tuple(int(t) for t in rng.integers(low, high, n)) for n in spec.prompt_lengths)


def generation_plan(recipe, model) -> Plan:
    """The recipe's ``generate`` section checked against ``model`` (see the module docstring)."""
    spec = recipe.generate
    if spec is None:
        raise RecipeError("generate: a text_generation recipe needs a generate section")
    geometry = cache_geometry(model)
    prompts = prompt_ids(spec, geometry.vocab)
    field = "generate.prompts" if spec.prompts is not None else "generate.prompt_lengths"
    for i, prompt in enumerate(prompts):
        bad = [t for t in prompt if t >= geometry.vocab]
        if bad:
            raise RecipeError(f"{field}.{i}: token id {bad[0]} is outside the model's vocabulary [0, {geometry.vocab})")
        if geometry.positions and len(prompt) > geometry.positions:
            raise RecipeError(
                f"{field}.{i}: {len(prompt)} tokens, longer than the model's {geometry.positions} positions "
                "(max_position_embeddings)",
                hint="shorten the prompt, or build the model with more positions",
            )
    longest = max(len(p) for p in prompts)
    if geometry.positions and longest + spec.max_new_tokens > geometry.positions:
        raise RecipeError(
            f"generate.max_new_tokens: {spec.max_new_tokens} new tokens after a {longest}-token prompt go beyond "
            f"the model's {geometry.positions} positions (max_position_embeddings)",
            hint=f"give max_new_tokens <= {geometry.positions - longest}",
        )
    return Plan(geometry, prompts, spec.batch_size(), spec.max_new_tokens, spec.cache_length, spec.gears())


def plan_path(run_root: Path) -> Path:
    """``<run>/generation/plan.json`` of the run folder ``run_root`` (``<output>/<name>``)."""
    return Path(run_root) / "generation" / PLAN


def write_plan(run_root: Path, plan: Plan) -> Path:
    """The run's plan as JSON (``read_plan`` reads it back)."""
    from torch2ms.pipeline.workspace import write_json

    path = plan_path(run_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, dataclasses.asdict(plan))
    return path


def read_plan(run_root: Path) -> Plan:
    """The plan a conversion ran with, from ``plan_path(run_root)``; ``Torch2msError`` if the run has none."""
    path = plan_path(run_root)
    if not path.is_file():
        raise Torch2msError(f"{path}: not found", hint="run `torch2ms convert` on the recipe first")
    data = json.loads(path.read_text())
    prompts = tuple(tuple(p) for p in data["prompts"])
    return Plan(
        Geometry(**data["geometry"]),
        prompts,
        data["batch"],
        data["max_new_tokens"],
        data["cache_length"],
        tuple(data.get("gears") or [max(len(p) for p in prompts)]),  # a run from before the gears
    )
