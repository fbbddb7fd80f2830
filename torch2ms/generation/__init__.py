"""Text generation with a static KV cache: a transformers causal LM as a prefill and a decode graph
of static shapes (what an Ascend 310 runs), greedy decoding with them, and the token-for-token
comparison with transformers' own ``generate``.

* ``cache``: ``GraphCache``, transformers' cache interface over graph tensors, and the cache writes;
* ``graphs``: the ``Prefill`` and ``Decode`` wrappers around the model (``geometry``: the cache ``Geometry``);
* ``plan``: a ``text_generation`` recipe against its model (cache interface, positions, vocabulary), and
  ``read_plan`` / ``write_plan`` of a run's ``generation/plan.json``;
* ``loop``: greedy decoding with any runner of the two graphs (PyTorch here; onnxruntime in ``export``);
* ``reference``: transformers' ``generate(do_sample=False, cache_implementation="static")``;
* ``compare``: first differing token, per-step logits errors, top-2 gaps;
* ``export``: both graphs to ONNX through the export stage's exporters, and onnxruntime running them;
* ``convert``: ``torch2ms convert`` on a generation recipe, both graphs through the five stages;
* ``check``: each stage's generation check (its own graphs' greedy decoding against ``reference``);
* ``bundle``: ``torch2ms package`` on a generation recipe, both graphs and the board's generation loop.

``check`` analyses and places both graphs' ONNX and ``package`` writes a bundle that generates;
``precision`` refuses a ``text_generation`` recipe (``refuse_unconverted``) but for ``--plan w8a16``
(``bundle.w8a16``).
"""

from __future__ import annotations

from torch2ms.errors import RecipeError

NOT_CONVERTED = (
    "it takes one graph, and a generation recipe has two (prefill and decode); `torch2ms convert` converts "
    "and checks them as generation, and the runs' prefill/ and decode/ folders hold each graph's stages"
)


def refuse_unconverted(recipe, command: str) -> None:
    """RecipeError (exit 2) for a ``text_generation`` recipe: ``command`` does not take its two graphs yet."""
    if recipe.task == "text_generation":
        raise RecipeError(f"task: text_generation: torch2ms {command} cannot run it yet: {NOT_CONVERTED}")
