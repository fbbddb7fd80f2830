"""The exporter fallback chain: a PyTorch model -> ``model.onnx`` by the first path that works.

The export does not give up at the first exporter error. It tries these paths in order
(``export.exporter`` pins one; ``auto`` tries both):

1. the TorchScript exporter (``training=PRESERVE`` in eval mode, so BatchNorm stays a node and
   the rebuild makes ``nn.Conv2dBnAct`` blocks) at ``export.opset``, then at each newer opset up to
   ``TORCHSCRIPT_NEWEST`` when the error is the exporter's own (a symbolic missing or refusing at
   that opset: ``aten::col2im`` needs 18). An operator with no symbolic at any opset, or an error
   of the tracing itself, ends this path at once;
2. the dynamo exporter (``torch.export`` + onnxscript's torchlib) at ``max(export.opset, 18)``.
   It needs the onnxscript package. It decomposes what TorchScript has no symbolic for, and it
   folds BatchNorm into the conv before it in eval mode: the record says so.

When no path exports the model, the error lists every path's reason and nothing is written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from torch2ms.errors import ModelError
from torch2ms.graph.validate import SUPPORTED_OPSETS

# The newest opset the TorchScript exporter has symbolics for (torch.onnx declares 20 its highest;
# it writes 21-23 with a warning but no new symbolic, so they cannot export anything 20 cannot),
# within what the loader takes. onnxruntime 1.32 runs every opset up to 23 (tests check it).
TORCHSCRIPT_NEWEST = 20
# The dynamo exporter's torchlib is written for opset 18; a lower one goes through a version
# converter, which torch warns "may not be successful".
DYNAMO_OLDEST = 18
_NEEDS_OPSET = re.compile(r"Support for this operator was added in version (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY_LINE = re.compile(r"<class '([\w.]+)'>: (.*)")


@dataclass
class Attempt:
    """One try of an exporter at an opset; ``error`` says why it failed (None: it wrote model.onnx)."""

    exporter: str
    opset: int
    error: str | None = None


def export_plan(spec) -> list[tuple[str, list[int]]]:
    """The exporters ``export`` tries for the recipe's export section, each with its opsets in order."""
    newest = min(max(TORCHSCRIPT_NEWEST, spec.opset), SUPPORTED_OPSETS.stop - 1)
    torchscript = ("torchscript", list(range(spec.opset, newest + 1)))
    dynamo = ("dynamo", [max(spec.opset, DYNAMO_OLDEST)])
    return {"torchscript": [torchscript], "dynamo": [dynamo], "auto": [torchscript, dynamo]}[spec.exporter]


def export_onnx(wrapped, example, onnx_path: Path, names_io, recipe) -> tuple[list[Attempt], list[str]]:
    """Export ``wrapped`` to ``onnx_path`` by the first path of ``export_plan`` that works.

    Returns every attempt (the last one wrote the file) and the TracerWarnings of the TorchScript
    trace that did. Raises ``ModelError`` listing each path's reason when none works."""
    attempts: list[Attempt] = []
    for exporter, opsets in export_plan(recipe.export):
        queue = list(opsets)
        while queue:
            opset = queue.pop(0)
            try:
                if exporter == "torchscript":
                    tracer = _torchscript(wrapped, example, onnx_path, names_io, opset)
                else:
                    tracer = _dynamo(wrapped, example, onnx_path, names_io, opset)
                embed_references_file(onnx_path)  # a plugin's custom op, as onnxruntime can run it (graph.custom)
                _loadable(onnx_path)
            except _PathFailed as failed:
                attempts.append(Attempt(exporter, opset, failed.reason))
                if failed.final:
                    queue = []
                    if opset != opsets[-1]:
                        attempts[-1].error += f" ({_span(opset + 1, opsets[-1])} not tried: {failed.final})"
                elif failed.needs and failed.needs > opset:
                    later = [o for o in queue if o >= failed.needs]
                    if len(later) != len(queue):
                        attempts[-1].error += f" ({_span(opset + 1, failed.needs - 1)} skipped)"
                    queue = later
                continue
            attempts.append(Attempt(exporter, opset))
            return attempts, tracer
    onnx_path.unlink(missing_ok=True)
    lines = "\n".join(f"  {line}" for line in describe_attempts(attempts))
    pinned = recipe.export.exporter != "auto"
    raise ModelError(
        f"torch.onnx.export failed for {recipe.model.factory} on every path "
        f"(export.exporter: {recipe.export.exporter}):\n{lines}",
        hint=(
            "export.exporter: auto also tries the other exporter; " if pinned else "the exporters' reasons are above; "
        )
        + "a model must be traceable with fixed input shapes",
    )


def describe_attempts(attempts: list[Attempt]) -> list[str]:
    """One line per failed path, consecutive opsets of one exporter failing alike merged:
    ``torchscript opsets 17-20: SymbolicValueError: ...``."""
    groups: list[list[Attempt]] = []
    for a in attempts:
        if a.error is None:
            continue
        last = groups[-1][-1] if groups else None
        same = last and last.exporter == a.exporter and _strip_opset(last) == _strip_opset(a)
        if same and a.opset == last.opset + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    lines = []
    for g in groups:
        lines.append(f"{g[0].exporter} {_span(g[0].opset, g[-1].opset)}: {g[0].error}")
    return lines


def _span(first: int, last: int) -> str:
    return f"opset {first}" if first == last else f"opsets {first}-{last}"


def _strip_opset(a: Attempt) -> str:
    return (a.error or "").replace(f"opset version {a.opset}", "opset version N")


class _PathFailed(Exception):
    """An exporter failed: ``reason`` for the record; ``final`` (why) when newer opsets cannot help,
    ``needs`` when the exporter names the opset that can."""

    def __init__(self, reason: str, final: str | None = None, needs: int | None = None):
        super().__init__(reason)
        self.reason, self.final, self.needs = reason, final, needs


def _reason(err: BaseException) -> str:
    """The first line of an exporter's error, or for the dynamo exporter the root cause from its
    "Exception summary" (its first line only says which of its three steps failed)."""
    text = _ANSI.sub("", str(err)).strip()
    lines = [line.strip() for line in text.splitlines()]
    if "## Exception summary" in lines:
        rest = [line for line in lines[lines.index("## Exception summary") + 1 :] if line]
        cause = _SUMMARY_LINE.match(rest[0]) if rest else None
        if cause:
            return f"{cause.group(1).rsplit('.', 1)[-1]}: {cause.group(2)}"
    if not lines or not lines[0]:
        return type(err).__name__
    # the TorchScript exporter's first line goes on with a plea for a pull request and IR dumps
    first = re.split(r"\s+Please feel free to request support|\s+\[Caused by", lines[0])[0]
    return f"{type(err).__name__}: {first}"


def _torchscript(wrapped, example, onnx_path: Path, names_io, opset: int) -> list[str]:
    import torch

    log = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(log), _native_stdout_dropped():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            torch.onnx.export(
                wrapped,
                example,
                str(onnx_path),
                dynamo=False,
                opset_version=opset,
                training=torch.onnx.TrainingMode.PRESERVE,
                do_constant_folding=True,
                input_names=names_io[0],
                output_names=names_io[1],
                dynamic_axes=names_io[2],
            )
    except Exception as err:
        reason = _reason(err)
        if not isinstance(err, torch.onnx.errors.OnnxExporterError):
            raise _PathFailed(reason, final="the error is the trace's, not an opset's") from None
        needs = _NEEDS_OPSET.search(str(err))
        if needs:
            raise _PathFailed(reason, needs=int(needs.group(1))) from None
        if isinstance(err, torch.onnx.errors.UnsupportedOperatorError):
            raise _PathFailed(reason, final="no opset has a symbolic for it") from None
        raise _PathFailed(reason) from None
    # A TracerWarning means the trace may only hold for these inputs (a Python branch on a
    # tensor value, a tensor turned into a number): say so, the check may pass by luck.
    return sorted(
        {
            f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)
        }
    )


@contextlib.contextmanager
def _native_stdout_dropped():
    """Drop what C++ writes to stdout while the block runs. The TorchScript exporter dumps its whole
    IR graph there on every error (its ONNX log is always on: torch tests the function
    ``_jit_is_onnx_log_enabled`` for truth instead of calling it); the reason is in the exception."""
    import os
    import sys
    import tempfile

    sys.__stdout__.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _dynamo(wrapped, example, onnx_path: Path, names_io, opset: int) -> list[str]:
    import torch

    dynamic_shapes = None
    if names_io[2]:
        # torch.export specializes a dimension whose example size is 1 (0/1 specialisation)
        sizes = {n: a.shape[0] for n, a in zip(names_io[0], example) if n in names_io[2]}
        if 1 in sizes.values():
            raise _PathFailed(
                "inputs[].batch: the dynamo exporter cannot make dimension 0 dynamic when the example's is 1"
                " (torch.export specialises sizes 0 and 1): give shape[0] >= 2",
                final="the recipe's batch, not the opset",
            )
        batch = torch.export.Dim("batch", min=1, max=2048)  # ATC's range for a batch size
        # forward(*args) is one (variadic) parameter: a tuple holding one entry per input, in order
        dynamic_shapes = (tuple({0: batch} if n in names_io[2] else None for n in names_io[0]),)
    if importlib.util.find_spec("onnxscript") is None:
        raise _PathFailed("the dynamo exporter needs the onnxscript package, which is not installed")
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapped,
                example,
                str(onnx_path),
                dynamo=True,
                opset_version=opset,
                input_names=names_io[0],
                output_names=names_io[1],
                dynamic_shapes=dynamic_shapes,
                external_data=False,  # one self-contained model.onnx (the weights inline)
            )
    except Exception as err:
        raise _PathFailed(_reason(err)) from None
    return []


def embed_references_file(path: Path) -> None:
    from torch2ms.graph.custom import embed_references_file as embed

    embed(path)


def _loadable(path: Path) -> None:
    """An exporter can write a model that is not valid ONNX (torch.nn.functional.unfold of an
    unbatched 3-D input: a Pad with 8 pads on a 3-D tensor, from either exporter); then that path
    failed."""
    import onnx

    from torch2ms.graph.onnxrt import VALIDATE, session

    try:
        onnx.checker.check_model(str(path))
        session(path, VALIDATE)
    except Exception as err:
        reason = re.sub(r"Load model from \S+ failed:", "", _reason(err))
        raise _PathFailed(f"wrote a model that does not load: {reason}") from None


def export_model(model, example, onnx_path: Path, input_names, output_names, recipe, log):
    """Export ``model`` (its outputs flattened to ``output_names``) to ``onnx_path`` and check the
    file; node and weight names carry no wrapper prefix. Returns (the attempt that wrote it, the
    earlier ones that failed, the TracerWarnings)."""
    import onnx
    import torch

    from torch2ms.model_loader import flatten_outputs

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return tuple(flatten_outputs(self.inner(*args)).values())

    # the board tools serve inputs[].batch from one model whose dimension 0 is -1
    # and a sequence-length profile (inputs[].sequence) from one whose dimension 1 is -1
    dynamic = {
        i.name: {**({0: "batch"} if len(i.batch_sizes()) > 1 else {}), **({1: "sequence"} if i.sequence else {})}
        for i in recipe.inputs
        if len(i.batch_sizes()) > 1 or i.sequence
    } or None
    attempts, tracer = export_onnx(
        Wrapped(model).eval(), example, onnx_path, (input_names, output_names, dynamic), recipe
    )
    produced, failed = attempts[-1], attempts[:-1]
    for t in tracer:
        log(f"export: the trace may not generalize to other inputs: {t}")
    if failed:
        log(
            f"export: {produced.exporter} at opset {produced.opset} wrote model.onnx after "
            + "; ".join(describe_attempts(failed))
        )
    _tidy(onnx_path, model)
    onnx.checker.check_model(str(onnx_path))
    return produced, failed, tracer


def _tidy(path: Path, model) -> None:
    """Drop the prefix the export wrapper adds to node names (``/inner/``) and weights (``inner.``),
    and give back each weight the exporter merged its own initializer (``unmerge``)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    # a model over protobuf's 2 GB keeps its weights in the exporter's external files: edited as
    # references to them, so the graph stays one small proto
    external = any(uses_external_data(t) for t in onnx.load(str(path), load_external_data=False).graph.initializer)
    m = onnx.load(str(path), load_external_data=not external)
    unmerge(m, set(model.state_dict()), base_dir=str(path.parent) if external else "")
    renamed = {t.name: t.name[len("inner.") :] for t in m.graph.initializer if t.name.startswith("inner.")}
    for t in m.graph.initializer:
        t.name = renamed.get(t.name, t.name)
    for n in m.graph.node:
        if n.name.startswith("/inner/"):
            n.name = n.name[len("/inner") :]
        n.input[:] = [renamed.get(i, i) for i in n.input]
        _unwrap_scopes(n)
    if m.graph.node:
        from torch2ms.pipeline.workspace import atomic_write_bytes

        atomic_write_bytes(path, m.SerializeToString())


def _unwrap_scopes(node) -> None:
    """The dynamo exporter's module metadata without the export wrapper: ``name_scopes``
    ``['', 'inner', 'inner.layer1', 'relu']`` -> ``['', 'layer1', 'relu']``, and the wrapper's class
    out of ``class_hierarchy`` (else every module path starts with ``inner`` and the module classes
    nest under a module the user's model does not have)."""
    import ast

    meta = {p.key: p for p in node.metadata_props}
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes is None:
        return
    try:
        paths = ast.literal_eval(scopes.value)
    except (ValueError, SyntaxError):
        return
    if not (isinstance(paths, list) and len(paths) > 1 and paths[1] == "inner"):
        return
    scopes.value = repr([paths[0], *(p[len("inner.") :] if p.startswith("inner.") else p for p in paths[2:])])
    classes = meta.get("pkg.torch.onnx.class_hierarchy")
    if classes is not None:
        try:
            names = ast.literal_eval(classes.value)
        except (ValueError, SyntaxError):
            return
        if isinstance(names, list) and len(names) > 1:
            classes.value = repr(names[1:])  # the wrapper was the root: the model's class is now


def unmerge(m, keys: set[str], base_dir: str = "") -> None:
    """The TorchScript exporter keeps one initializer for equal weights and reads the others through
    ``Identity`` nodes (every LayerNorm's default ones: ``inner.ln_2.weight = Identity(inner.ln_1.weight)``).
    Each such weight of the state_dict (``keys``) becomes an initializer of its own again, so that the
    weight map and ``load-weights`` tell ``ln_1.weight`` from ``ln_2.weight`` (weights trained apart
    are no longer equal). ``base_dir``: where external weights are, for a model loaded without them."""
    from onnx import numpy_helper

    inits = {t.name: t for t in m.graph.initializer}
    for n in list(m.graph.node):
        if n.op_type != "Identity" or n.input[0] not in inits or n.output[0] in inits:
            continue
        out = n.output[0]
        if out.removeprefix("inner.") not in keys:
            continue
        copy = numpy_helper.from_array(numpy_helper.to_array(inits[n.input[0]], base_dir), out)
        m.graph.initializer.append(copy)
        inits[out] = copy
        m.graph.node.remove(n)
