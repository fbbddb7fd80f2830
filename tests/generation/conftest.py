"""The tiny Llama generation recipe (``tiny.QUICK``) converted once for the tests that need a
converted run: ``test_convert`` checks its stages, ``test_bundle`` packages it."""

from __future__ import annotations

import pytest

from tests.generation.tiny import QUICK, recipe_file


@pytest.fixture(scope="session")
def converted_llama(tmp_path_factory):
    """(recipe, per graph ``RunResult``) of both graphs through the five stages, in this process."""
    from torch2ms.generation.convert import generation_runners, run_generation
    from torch2ms.recipe import load_recipe

    folder = tmp_path_factory.mktemp("llama")
    recipe = load_recipe(recipe_file(folder, "llama_tiny_generate", QUICK, graph_kernel="off"))
    return recipe, run_generation(generation_runners(recipe, None, lambda m: None, own_processes=False))
