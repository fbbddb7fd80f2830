"""``torch2ms verify``: is this bundle intact, and does its MindIR still match PyTorch here?

1. unpack safely into a temporary folder (``archive.safe_extract`` rejects absolute paths,
   ``..``, links, special files and duplicates before writing anything);
2. compare every file with ``manifest.json``: wrong hash, missing, or not listed (extra) files
   are all reported at once;
3. load ``model/network.mindir`` (its weights in ``model/network_variables/`` over 1 GB, checked in 2)
   with MindSpore (``nn.GraphCell``), run ``samples/reference.npz``
   and compare with PyTorch's outputs within the manifest's tolerance, and by the recipe's task
   metric (top-1 agreement, pixel agreement, ...), gated like a stage; a bundle serving several
   batch sizes (``inputs[].batch``) is also run on its PyTorch sample at every other size;
   a text_generation bundle instead runs its own ``infer.py`` loop on the recorded prompts against
   transformers' tokens (``generation.bundle.verify_generation``).

The hashes detect corruption and edits of the payload; they are not a signature (whoever can
rewrite the archive can rewrite the manifest): pin the archive's own sha256 for that.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch2ms.bundle import lint
from torch2ms.bundle.archive import BundleTampered, BundleUnreadable, safe_extract
from torch2ms.bundle.build import FORMAT
from torch2ms.compare import OutputMetrics, Tolerance, compare_outputs
from torch2ms.errors import CheckFailed
from torch2ms.pipeline.report import task_summary


@dataclass
class Verified:
    manifest: dict
    files: int
    metrics: list[OutputMetrics] = field(default_factory=list)
    samples: int = 0
    task: dict | None = None  # the recipe task's agreement of the MindIR with PyTorch (tasks.TaskResult)
    batches: dict[int, list[OutputMetrics]] = field(default_factory=dict)  # per extra inputs[].batch size
    lengths: dict[int, list[OutputMetrics]] = field(default_factory=dict)  # per extra inputs[].sequence length
    generation: dict | None = None  # a text_generation bundle: its loop's tokens (generation.bundle.verify_generation)


def check_files(hashes: dict[str, str], manifest: dict) -> list[str]:
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise BundleUnreadable("manifest.json has no 'files' table", hint="not a torch2ms bundle, or a damaged one")
    problems = []
    for name in sorted(listed):
        if name not in hashes:
            problems.append(f"{name}: missing (listed in manifest.json)")
        elif hashes[name] != listed[name]:
            problems.append(
                f"{name}: sha256 {hashes[name][:16]}... differs from the manifest's {listed[name][:16]}... (file "
                "changed)"
            )
    for name in sorted(set(hashes) - set(listed) - {"manifest.json"}):
        problems.append(f"{name}: extra file, not listed in manifest.json")
    return problems


def verify_bundle(archive: Path, log: Callable[[str], None] = print) -> Verified:
    with tempfile.TemporaryDirectory(prefix="torch2ms-verify-") as tmp:
        root = Path(tmp)
        hashes = safe_extract(archive, root)
        if "manifest.json" not in hashes:
            raise BundleUnreadable(
                f"{archive}: no manifest.json", hint="not a torch2ms bundle; make one with `torch2ms package`"
            )
        try:
            manifest = json.loads((root / "manifest.json").read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise BundleUnreadable(f"{archive}: manifest.json is not valid JSON ({err})") from None
        if manifest.get("format") != FORMAT:
            raise BundleUnreadable(
                f"{archive}: manifest format {manifest.get('format')!r}, this torch2ms reads {FORMAT!r}"
            )
        problems = check_files(hashes, manifest)
        if problems:
            raise BundleTampered(
                f"{archive}: {len(problems)} entr{'y does' if len(problems) == 1 else 'ies do'} not match "
                "manifest.json:\n  " + "\n  ".join(problems),
                hint="the bundle was modified or damaged after packaging; do not deploy it, package again",
            )
        log(f"{len(hashes) - 1} files match manifest.json; unpacked safely")
        lint.raise_for(
            lint.lint_files({n: (root / n).read_bytes() for n in hashes if lint.board_file(n)}), str(archive)
        )
        log("board-tool settings: every flag and key as documented (bundle/vendor_flags.py)")
        if manifest["model"].get("task") == "text_generation":  # two graphs and the board's loop
            from torch2ms.generation.bundle import verify_generation

            return Verified(manifest, len(hashes) - 1, generation=verify_generation(archive, root, manifest, log))
        outputs, reference, batches, lengths = _run_mindir(root, manifest)
    metrics, n = compare_outputs(outputs, reference), len(outputs)
    tol = Tolerance(manifest["tolerance"]["rel_error"], manifest["tolerance"]["cosine"], 0.0)
    bad = [f"output {m.name!r}: {v}" for m in metrics for v in tol.violations(m)]
    batch_metrics = {}
    for size, (outs, ref) in batches.items():
        batch_metrics[size] = compare_outputs([outs], [ref])
        worst_rel = max(m.rel_error for m in batch_metrics[size])
        log(f"batch {size}: max rel error {worst_rel:.3g} against PyTorch")
        bad += [f"at batch {size}, output {m.name!r}: {v}" for m in batch_metrics[size] for v in tol.violations(m)]
    length_metrics = {}
    for length, (outs, ref) in lengths.items():
        length_metrics[length] = compare_outputs([outs], [ref])
        worst_rel = max(m.rel_error for m in length_metrics[length])
        log(f"sequence length {length}: max rel error {worst_rel:.3g} against PyTorch")
        bad += [
            f"at sequence length {length}, output {m.name!r}: {v}"
            for m in length_metrics[length]
            for v in tol.violations(m)
        ]
    task, violation = _task(manifest, outputs, reference)
    if task is not None:
        log(f"task: {task_summary(task)}")
    if violation:
        bad.append(violation + "".join(f"\n  {note}" for note in task.get("notes", [])))
    if bad:
        raise CheckFailed(
            f"{archive}: model/network.mindir no longer matches PyTorch on samples/reference.npz: {'; '.join(bad)}",
            hint="package again from a passing run",
        )
    return Verified(manifest, len(hashes) - 1, metrics, n, task, batch_metrics, length_metrics)


def _task(manifest: dict, outputs, reference) -> tuple[dict | None, str | None]:
    """The recipe task's metrics on the MindIR's outputs, gated like a stage (``check.task_agreement``
    or the task's default)."""
    from torch2ms.recipe import parse_recipe
    from torch2ms.tasks import gate, task_for

    recipe = parse_recipe(manifest["recipe"], "manifest.json recipe")
    t = task_for(recipe)
    result = t.measure(recipe, outputs, reference) if t else None
    if result is None:
        return None, None
    need = manifest["tolerance"].get("task_agreement", gate(recipe, t))
    violation = f"{result.metric} {result.agreement:.4f} < {need}" if result.agreement < need else None
    return result.to_dict(), violation


def _run_mindir(root: Path, manifest: dict):
    from torch2ms.custom.aot import running_in
    from torch2ms.runtime import msutil

    ms = msutil.mindspore()
    ms.set_context(mode=ms.GRAPH_MODE)
    root = root.resolve()
    # a Custom op's library is kernels/x.so, found from the MindIR's folder (torch2ms.custom.aot)
    with running_in(root / "model" if (root / "model" / "kernels").is_dir() else None):
        return _run_graph(ms, msutil, root, manifest)


def _run_graph(ms, msutil, root: Path, manifest: dict):
    from torch2ms.pipeline.workspace import load_npz, split_batches, split_lengths, split_reference

    try:
        cell = ms.nn.GraphCell(ms.load(str(root / "model" / "network.mindir")))
        inputs, reference = split_reference(load_npz(root / "samples" / "reference.npz"))
        order = [i["name"] for i in manifest["inputs"]]
        inputs = [{k: s[k] for k in order} for s in inputs]
        names = [o["name"] for o in manifest["outputs"]]
        outputs = msutil.run_cell(cell, inputs, names)
        # one PyTorch sample per other size of inputs[].batch: the MindIR serves them all
        batches = {
            size: (msutil.run_cell(cell, [{k: ins[k] for k in order}], names)[0], outs)
            for size, (ins, outs) in split_batches(load_npz(root / "samples" / "reference.npz")).items()
        }
        # and one per other length of inputs[].sequence
        lengths = {
            n: (msutil.run_cell(cell, [{k: ins[k] for k in order}], names)[0], outs)
            for n, (ins, outs) in split_lengths(load_npz(root / "samples" / "reference.npz")).items()
        }
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return outputs, reference, batches, lengths
