"""Converter plugins: a user's module whose ``@torch2ms.converter`` functions join the registry.

Two ways in, both without forking torch2ms:

* a recipe's ``converters: [my_package.t2ms_ops]``: modules importable from the current folder or
  the recipe's folder (as ``model.factory`` is, ``torch2ms.model_loader``), imported by every
  ``Runner`` built for the recipe, so by each process that converts (the export stage's own process,
  ``check``, the zoo's workers);
* the entry-point group ``torch2ms.converters`` of an installed package (``[project.entry-points.
  "torch2ms.converters"] my_ops = "my_package.t2ms_ops"``), imported with the built-in converters,
  for converters a team installs once.

A plugin that fails to import, or registers an op twice, is a ``PluginError`` (exit 2) naming the
plugin (and the op); a converter of a plugin that raises is one too (``torch2ms.converters.registry``).
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

from torch2ms.custom.loading import LOADING_PLUGIN
from torch2ms.errors import PluginError

ENTRY_POINT_GROUP = "torch2ms.converters"

# plugin module -> the ops it registered ("domain.op"), in the order imported
LOADED: dict[str, list[str]] = {}


def load(module: str, search_dirs: list[Path] = ()) -> list[str]:
    """Import the plugin ``module`` once; returns the ops it registers."""
    if module in LOADED:
        return LOADED[module]
    from torch2ms.converters.registry import registrations

    registrations()  # the built-in converters first: a plugin's clash with one is found at its registration
    for d in search_dirs:
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    before = {(r.domain, r.op_type, r.since, r.fn) for r in registrations(plugins=True)}
    LOADING_PLUGIN.append(module)
    try:
        importlib.import_module(module)
    except PluginError:
        raise
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise PluginError(
            f"converter plugin {module!r} failed to import: {type(err).__name__}: {first}",
            hint="it must be importable from the current folder or the recipe's folder (recipe field converters)",
        ) from None
    finally:
        LOADING_PLUGIN.pop()
    ops = sorted(
        {
            _op_name(r.domain, r.op_type)
            for r in registrations(plugins=True)
            if (r.domain, r.op_type, r.since, r.fn) not in before
        }
    )
    LOADED[module] = ops
    return ops


def load_for(recipe) -> dict[str, list[str]]:
    """The installed plugins (``load_entry_points``) and the recipe's ``converters``, each imported
    once; plugin -> the ops it covers."""
    dirs = [Path.cwd(), Path(recipe.base_dir).resolve()]
    installed = load_entry_points()
    return {**installed, **{m: load(m, dirs) for m in recipe.converters}}


def load_entry_points() -> dict[str, list[str]]:
    """Every plugin installed under the ``torch2ms.converters`` entry-point group; plugin -> its ops."""
    from importlib import metadata

    found = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    return {ep.value.partition(":")[0]: load(ep.value.partition(":")[0]) for ep in found}


def covered() -> dict[str, list[str]]:
    """Each loaded plugin and the ops it converts (what ``check`` and the refusal report say)."""
    return {m: ops for m, ops in LOADED.items()}


def describe() -> list[str]:
    """One line per loaded plugin: ``plugin my_ops: my.domain.SiluMul, ...``."""
    return [f"converter plugin {m}: {', '.join(ops) or 'no ops'}" for m, ops in covered().items()]


def refusal(message: str) -> str:
    """A refusal report (``registry.format_problems``) with the ops each loaded plugin covers."""
    return "\n".join([message, *describe()])


def fingerprint(modules, kernels: bool = True) -> dict[str, str]:
    """The sha256 of each plugin's source file (and, with ``kernels``, of the kernel sources it
    declares): editing a plugin converts again."""
    from torch2ms.custom.aot import KERNELS

    out = {}
    for m in modules:
        origin = getattr(sys.modules.get(m), "__file__", None)
        if origin:
            out[m] = hashlib.sha256(Path(origin).read_bytes()).hexdigest()
    for k in KERNELS.values() if kernels else ():
        if k.plugin in out and k.path.is_file():
            out[f"{k.plugin}:{k.source}"] = hashlib.sha256(k.path.read_bytes()).hexdigest()
    return out


def _op_name(domain: str, op: str) -> str:
    return f"{domain}.{op}" if domain else op
