"""Ascend 310 placement over the zoos: CANN ops off AI Core per model, before and after the rewrites.

    PYTHONPATH=. python benchmarks/ascend_zoo.py [--zoos torchvision,smp,yolo,timm] [--only a,b]
        [--out runs/ascend_zoo] [--timeout 1200] [--retry-failed] [--replace] [--full-export]
        [--md benchmarks/results/ascend_zoo.md] [--json benchmarks/results/ascend_zoo.json]

The cheapest route to the deployed graph's placement, without the five-stage conversion: each
model exported by the export stage's own exporter chain (``export_model``: the exporter path and
opset ``torch2ms convert`` would use, without the stage's PyTorch / onnxruntime reference runs;
``--full-export`` runs the stage itself), then ``ascend_report`` on its ONNX, which applies the fold stage's
passes and the Ascend rewrites in-process and places every op, exactly as
``torch2ms check --recipe R --target ascend310`` does. No MindSpore network is built or run.

One model at a time, each in a subprocess of its own (a crash or a hang costs that model only,
killed after ``--timeout``). Each model's result is ``OUT/<zoo>/<name>.json``; a model with a result
is skipped on the next run (resumable; ``--retry-failed`` runs the failed ones again). ``--replace``
places again, from its stored ``export/model.onnx`` and without exporting, every model whose
result was made under other rules (a hash of the passes, the lowering/placement code and the
table, ``rules`` in each result). The tables are written from whatever results exist, and name the
models that have none.

Nothing is run on a board: placement is what CANN's op-info and MindSpore's AI CPU list say
(docs/ascend310.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOOS = ("torchvision", "smp", "yolo", "timm")
PRECISION = "fp16"
WHERE_KEPT = 6  # module paths kept per op group


def rules_hash() -> str:
    """sha256 (12 hex digits) of what decides a placement once the ONNX exists: the passes, the
    lowering and placement code and the derived table. A result made under another hash is stale."""
    h = hashlib.sha256()
    pkg = ROOT / "torch2ms"
    for f in sorted(
        [*(pkg / "passes").glob("*.py"), *(pkg / "ascend").glob("*.py"), pkg / "ascend" / "ascend310.json"]
    ):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def zoo_models(zoo: str):
    from torch2ms.zoo.spec import load_zoo

    return load_zoo(ROOT / "recipes" / "zoo" / f"{zoo}.yaml")


def result_path(out: Path, zoo: str, name: str) -> Path:
    return out / zoo / f"{name}.json"


def _groups(groups: list[dict]) -> list[dict]:
    return [{**g, "where": g["where"][:WHERE_KEPT]} for g in groups]


def export_only(recipe, onnx_path: Path) -> dict:
    """The export stage's ONNX without its reference runs: the recipe's model built and exported by
    the stage's own exporter chain (``export_model``: TorchScript then dynamo, each opset in turn,
    names without the wrapper's prefix); no PyTorch/onnxruntime comparison, which placement does
    not need."""
    import torch

    from torch2ms.export.exporters import export_model
    from torch2ms.graph.validate import model_opset
    from torch2ms.model_loader import build_model, flatten_outputs
    from torch2ms.samples import sample_inputs

    model = build_model(recipe)
    example = tuple(torch.from_numpy(v) for v in sample_inputs(recipe)[0].values())
    with torch.no_grad():
        names = list(flatten_outputs(model(*example)))
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    produced, _, _ = export_model(model, example, onnx_path, [i.name for i in recipe.inputs], names, recipe, log)
    import onnx

    opset = model_opset(onnx.load(str(onnx_path), load_external_data=False))
    return {"status": "exported (unchecked)", "extra": {"export_path": {"exporter": produced.exporter, "opset": opset}}}


def place_one(zoo: str, name: str, out: Path, from_onnx: bool, full_export: bool = False) -> dict:
    """Export ``name`` of ``zoo`` and place its deployed graph. The export is the export stage's
    exporter chain alone, or with ``full_export`` the stage itself (its checks against PyTorch)."""
    from torch2ms.ascend.report import ascend_report
    from torch2ms.graph import load_onnx
    from torch2ms.stages import pipeline_runner

    model = next((m for m in zoo_models(zoo) if m.name == name), None)
    if model is None:
        raise SystemExit(f"{zoo}: no model {name!r}")
    recipe = model.recipe
    runner = pipeline_runner(recipe, out / zoo, log=lambda m: print(m, file=sys.stderr))
    onnx_path = runner.ctx.artifact("model.onnx")
    t0 = time.perf_counter()
    kept = out / zoo / f"{name}.export.json"  # how the kept ONNX was made, for --replace
    record = json.loads(kept.read_text()) if kept.is_file() else runner.run_dir.read_record("export") or {}
    if not (from_onnx and onnx_path.is_file()):
        if full_export:
            result = runner.run(until="export")
            st = next(s for s in result.stages if s.stage == "export")
            record = st.record or {}
            if not onnx_path.is_file():
                raise RuntimeError(f"export {st.status}: {st.reason}")
        else:
            record = export_only(recipe, onnx_path)
        write_json(
            kept, {"status": record.get("status"), "extra": {"export_path": record.get("extra", {}).get("export_path")}}
        )
    export_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    shapes = {i.name: tuple(i.shape) for i in recipe.inputs}
    graph = load_onnx(onnx_path, shapes)
    rep = ascend_report(
        graph, PRECISION, fuse=recipe.rebuild.fuse_conv_bn_act, rewrites=recipe.fold.ascend_rewrites, inplace=True
    )
    extra = record.get("extra", {})
    p, u, c = rep["placement"], rep["placement_unrewritten"], rep["channels"]
    return {
        "zoo": zoo,
        "model": name,
        "status": "placed",
        "rules": rules_hash(),
        "export_status": record.get("status", "?"),
        "export_path": extra.get("export_path"),
        "export_seconds": round(export_s, 1),
        "place_seconds": round(time.perf_counter() - t1, 1),
        "precision": PRECISION,
        "counts": p["counts"],
        "ai_cpu_ops": p["ai_cpu_ops"],
        "off_ai_core_ops": p["off_ai_core_ops"],
        "off_ai_core": _groups(p["off_ai_core"]),
        "ai_cpu_ops_unrewritten": u["ai_cpu_ops"],
        "off_ai_core_ops_unrewritten": u["off_ai_core_ops"],
        "off_ai_core_unrewritten": _groups(u.get("off_ai_core", [])),
        "rewrites": rep["rewrites"],
        "channel_waste_pct": c["waste_pct"],
        "channel_waste_macs": c["waste_macs"],
        "conv_macs": c["conv_macs"],
        "convs": c["convs"],
        "padded_convs": c["padded_convs"],
        "worst_conv": c["worst"][0] if c["worst"] else None,
        "resizes": len(rep["resize"]),
        "resizes_aligned": sum(r["aligned"] for r in rep["resize"]),
    }


def run_worker(zoo: str, names: list[str], out: Path, timeout: float, from_onnx: bool, full_export: bool) -> list[dict]:
    """One subprocess for ``names`` (one model when exporting; a chunk of stale ones when placing
    again from kept ONNX, which costs seconds each), one model at a time inside it."""
    cmd = [sys.executable, __file__, "--worker", zoo, *names, "--out", str(out)]
    cmd += (["--replace"] if from_onnx else []) + (["--full-export"] if full_export else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "YOLO_OFFLINE": "1"}
    t0 = time.perf_counter()
    rules = rules_hash()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(names), env=env, cwd=ROOT)
        tail = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
        reason = (tail[-1] if tail else f"exit {proc.returncode}")[:300]
    except subprocess.TimeoutExpired:
        reason = f"killed after {timeout * len(names):g} s"
    rows = []
    for name in names:
        path = result_path(out, zoo, name)
        row = json.loads(path.read_text()) if path.is_file() else None
        if row and row["status"] == "placed" and row.get("rules") == rules:
            rows.append(row)
        else:
            rows.append(
                {
                    "zoo": zoo,
                    "model": name,
                    "status": "failed",
                    "reason": reason,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
    return rows


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


REPLACE_CHUNK = 12  # stale models placed again per subprocess


def run_all(zoos, only, out: Path, timeout: float, retry_failed: bool, replace: bool, full_export: bool) -> None:
    rules = rules_hash()
    for zoo in zoos:
        todo = []
        for m in zoo_models(zoo):
            if only and m.name not in only:
                continue
            path = result_path(out, zoo, m.name)
            old = json.loads(path.read_text()) if path.is_file() else None
            if replace:  # stale results only: placed under other rules, with the ONNX kept
                if not (out / zoo / m.name / "export" / "model.onnx").is_file() or (old or {}).get("rules") == rules:
                    continue
            elif old and (old["status"] == "placed" or not retry_failed):
                continue
            todo.append(m.name)
        step = REPLACE_CHUNK if replace else 1
        for i in range(0, len(todo), step):
            for row in run_worker(zoo, todo[i : i + step], out, timeout, replace, full_export):
                path = result_path(out, zoo, row["model"])
                if row["status"] != "placed" and not (replace and path.is_file()):  # a stale result stays
                    write_json(path, row)
                took = row.get("export_seconds", 0) + row.get("place_seconds", row.get("seconds", 0))
                what = (
                    f"off AI Core {row['off_ai_core_ops_unrewritten']} -> {row['off_ai_core_ops']}"
                    if row["status"] == "placed"
                    else row["reason"]
                )
                print(f"{zoo}/{row['model']}: {row['status']} ({took:.0f} s) {what}", flush=True)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def collect(zoos, out: Path) -> dict:
    rules = rules_hash()
    data = {"precision": PRECISION, "rules": rules, "zoos": {}}
    for zoo in zoos:
        rows, missing = [], []
        for m in zoo_models(zoo):
            path = result_path(out, zoo, m.name)
            if path.is_file():
                rows.append(json.loads(path.read_text()))
            else:
                missing.append(m.name)
        placed = [r for r in rows if r["status"] == "placed"]
        data["zoos"][zoo] = {
            "models": len(rows) + len(missing),
            "placed": len(placed),
            "not_placed": [
                {"model": r["model"], "status": r["status"], "reason": r["reason"]} for r in rows if r not in placed
            ],
            "missing": missing,
            "stale": [r["model"] for r in placed if r.get("rules") != rules],
            "zero_ai_cpu": sum(r["ai_cpu_ops"] == 0 for r in placed),
            "zero_off_ai_core": sum(r["off_ai_core_ops"] == 0 for r in placed),
            "zero_off_ai_core_unrewritten": sum(r["off_ai_core_ops_unrewritten"] == 0 for r in placed),
            "ai_cpu_ops_before": sum(r["ai_cpu_ops_unrewritten"] for r in placed),
            "ai_cpu_ops_after": sum(r["ai_cpu_ops"] for r in placed),
            "off_ai_core_ops_before": sum(r["off_ai_core_ops_unrewritten"] for r in placed),
            "off_ai_core_ops_after": sum(r["off_ai_core_ops"] for r in placed),
            "worst_channel_waste": max(
                ((r["channel_waste_pct"], r["model"]) for r in placed), default=(None, None), key=lambda t: t[0] or 0
            ),
            "rows": rows,
        }
    return data


def markdown(data: dict) -> str:
    z = data["zoos"]
    lines = [
        "# Ascend 310 placement over the zoos",
        "",
        "`benchmarks/ascend_zoo.py`: each model's export stage, then the fold stage's passes and the Ascend",
        "rewrites in-process (`torch2ms.ascend.report.ascend_report`, as `torch2ms check --target ascend310`),",
        f"placed at {data['precision']}. Nothing ran on a board: the placement is what CANN's 310 op-info and",
        "MindSpore's AI CPU kernel list say (sources in docs/ascend310.md). *Off AI Core* = CANN ops on AI CPU,",
        "with no kernel in either list (unsupported), or that the lowering table does not know.",
        "",
        "| zoo | models | placed | zero AI CPU | zero off AI Core: before -> after the rewrites |"
        " AI CPU ops: before -> after | off AI Core ops: before -> after | worst channel waste |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summed = [k for k in next(iter(z.values()), {}) if isinstance(next(iter(z.values()))[k], int)]
    total = {k: sum(s[k] for s in z.values()) for k in summed}
    worst_all = max((s["worst_channel_waste"] for s in z.values()), key=lambda t: t[0] or 0, default=(None, None))
    for zoo, s in [*z.items(), ("all", {**total, "worst_channel_waste": worst_all})]:
        w, placed = s["worst_channel_waste"], s["placed"]
        cells = [
            zoo,
            s["models"],
            placed,
            f"{s['zero_ai_cpu']} ({_pct(s['zero_ai_cpu'], placed)})",
            f"{s['zero_off_ai_core_unrewritten']} -> {s['zero_off_ai_core']} ({_pct(s['zero_off_ai_core'], placed)})",
            f"{s['ai_cpu_ops_before']} -> {s['ai_cpu_ops_after']}",
            f"{s['off_ai_core_ops_before']} -> {s['off_ai_core_ops_after']}",
            f"{w[0]}% ({w[1]})" if w[1] else "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
    stale = [f"{zoo}/{n}" for zoo, s in z.items() for n in s["stale"]]
    if stale:
        lines += [f"Placed under older rules (re-run with `--replace`): {', '.join(stale)}.", ""]
    gaps = [(zoo, n, "no result") for zoo, s in z.items() for n in s["missing"]]
    gaps += [(zoo, r["model"], f"{r['status']}: {r['reason']}") for zoo, s in z.items() for r in s["not_placed"]]
    if gaps:
        lines += ["## Models without a placement", "", "| zoo | model | why |", "|---|---|---|"]
        lines += [f"| {zoo} | {n} | {why} |" for zoo, n, why in gaps] + [""]
    remaining = [
        (zoo, r, g) for zoo, s in z.items() for r in s["rows"] if r["status"] == "placed" for g in r["off_ai_core"]
    ]
    lines += ["## Every op left off AI Core after the rewrites", ""]
    if remaining:
        lines += [
            "| zoo | model | placement | CANN op | count | dtype | MindSpore call | reason | where |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for zoo, r, g in remaining:
            lines.append(
                f"| {zoo} | {r['model']} | {g['placement']} | {g['op']} | {g['count']} | {g['dtype']} | "
                f"{', '.join(g['calls'])} | {g['reason']} | {', '.join(g['where'][:3])} |"
            )
    else:
        lines.append("None.")
    lines += [
        "",
        "## Per model",
        "",
        "| zoo | model | export | CANN ops (AI Core / AI CPU / unsupported / shape-only) | AI CPU before -> after |"
        " off AI Core before -> after | rewrites | channel waste | worst conv | resizes aligned |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for zoo, s in z.items():
        for r in s["rows"]:
            if r["status"] != "placed":
                continue
            c = r["counts"]
            counts = " / ".join(str(c.get(k, 0)) for k in ("AI Core", "AI CPU", "unsupported", "none"))
            if c.get("unknown"):
                counts += f" (+{c['unknown']} unknown)"
            rw = ", ".join(f"{k.removeprefix('ascend_')} {v}" for k, v in r["rewrites"].items()) or "-"
            wc = r["worst_conv"]
            worst = f"{wc['module']} {wc['c_in']}->{wc['c_out']}" if wc else "-"
            ep = r["export_path"] or {}
            export = f"{ep.get('exporter', '?')} {ep.get('opset', '')}".strip()
            lines.append(
                f"| {zoo} | {r['model']} | {export} ({r['export_status']}) | {counts} | "
                f"{r['ai_cpu_ops_unrewritten']} -> {r['ai_cpu_ops']} | "
                f"{r['off_ai_core_ops_unrewritten']} -> {r['off_ai_core_ops']} | {rw} | {r['channel_waste_pct']}% | "
                f"{worst} | {r['resizes_aligned']} of {r['resizes']} |"
            )
    before = [
        (zoo, r, g)
        for zoo, s in z.items()
        for r in s["rows"]
        if r["status"] == "placed"
        for g in r["off_ai_core_unrewritten"]
    ]
    if before:
        lines += [
            "",
            "## Off AI Core before the rewrites (what they moved)",
            "",
            "| zoo | model | placement | CANN op | count | reason |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {zoo} | {r['model']} | {g['placement']} | {g['op']} | {g['count']} | {g['reason']} |"
            for zoo, r, g in before
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoos", default=",".join(ZOOS))
    ap.add_argument("--only", default="", help="model names, comma-separated")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "ascend_zoo")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--retry-failed", action="store_true")
    ap.add_argument("--replace", action="store_true", help="place again from the stored ONNX, no export")
    ap.add_argument(
        "--full-export", action="store_true", help="run the export stage itself (its checks against PyTorch): slower"
    )
    ap.add_argument("--report-only", action="store_true", help="write the tables from the stored results")
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "results" / "ascend_zoo.md")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "ascend_zoo.json")
    ap.add_argument("--worker", nargs="+", metavar="ZOO MODEL", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        zoo, *names = a.worker
        for name in names:  # one at a time; a failure is reported and the next one placed
            try:
                write_json(result_path(a.out, zoo, name), place_one(zoo, name, a.out, a.replace, a.full_export))
            except Exception as err:  # noqa: BLE001 - the parent records it as this model's failure
                print(f"{zoo}/{name}: {type(err).__name__}: {err}", file=sys.stderr)
                if len(names) == 1:
                    raise SystemExit(1) from None
        return
    zoos = [z for z in a.zoos.split(",") if z]
    bad = [z for z in zoos if z not in ZOOS]
    if bad:
        raise SystemExit(f"--zoos: {', '.join(bad)} not among {', '.join(ZOOS)}")
    if not a.report_only:
        run_all(zoos, {n for n in a.only.split(",") if n}, a.out, a.timeout, a.retry_failed, a.replace, a.full_export)
    data = collect(zoos, a.out)
    write_json(a.json, data)
    a.md.write_text(markdown(data))
    print(f"wrote {a.md} and {a.json}")


if __name__ == "__main__":
    main()
