"""Profile outputs in ``<run>/profile/``: ``profile.json`` (every figure and kernel), ``profile.md``
(the tables, through ``torch2ms.pipeline.markdown.table``) and ``modules.png`` (time per module
path, one bar per variant)."""

from __future__ import annotations

from pathlib import Path

from torch2ms.pipeline.markdown import cell, table
from torch2ms.pipeline.workspace import atomic_write_text, write_json

TOP_TYPES = 12  # op types shown per variant; profile.json holds all
TOP_MODULES = 16


def _ok(data: dict) -> dict[str, dict]:
    return {k: v for k, v in data["variants"].items() if "error" not in v}


def _f(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def summary_lines(data: dict) -> list[str]:
    rows = []
    for key, v in data["variants"].items():
        if "error" in v:
            rows.append((key, cell(v["error"], 100), "-", "-", "-", "-", "-"))
            continue
        share = v["small_op_share"]
        rows.append(
            (
                key,
                v["label"],
                _f(v["wall_ms_per_call"]),
                _f(v["kernel_ms_per_call"]),
                _f(v["kernels_per_call"], ".0f"),
                _f(v["small_kernels_per_call"], ".0f"),
                "-" if share is None else f"{share:.1%}",
            )
        )
    header = ("variant", "what", "wall ms/call", "kernel ms/call", "kernels/call", "small kernels/call")
    return table((*header, f"small-op share (< {data['small_ms']:g} ms)"), rows, right=(2, 3, 4, 5, 6))


def op_type_lines(data: dict) -> list[str]:
    lines = []
    for key, v in _ok(data).items():
        rows = [
            (t, _f(x["kernels_per_call"], ".0f"), _f(x["ms_per_call"], ".3f"), f"{x['share']:.1%}")
            for t, x in list(v["op_types"].items())[:TOP_TYPES]
        ]
        lines += ["", f"**{key}** ({v['label']}):", "", *table(("op type", "kernels/call", "ms/call", "share"), rows)]
    return lines


def module_rows(data: dict) -> tuple[list[str], list[tuple]]:
    """The per-module table: the modules of the slowest-summed variants first, one column per
    variant (ms per call), and the worst MindSpore variant's ratio to PyTorch."""
    ok = {k: v for k, v in _ok(data).items() if v["modules"]}
    totals: dict[str, float] = {}
    for v in ok.values():
        for m, ms in v["modules"].items():
            totals[m] = max(totals.get(m, 0.0), ms)
    keys = list(ok)
    rows = []
    for m in sorted(totals, key=lambda m: -totals[m])[:TOP_MODULES]:
        values = [ok[k]["modules"].get(m) for k in keys]
        torch_ms = ok.get("torch", {}).get("modules", {}).get(m) if "torch" in ok else None
        ms_values = [x for k, x in zip(keys, values) if k != "torch" and x is not None]
        ratio = f"{max(ms_values) / torch_ms:.2f}x" if torch_ms and ms_values else "-"
        rows.append((m, *(_f(x, ".3f") for x in values), ratio))
    return keys, rows


def module_lines(data: dict) -> list[str]:
    keys, rows = module_rows(data)
    if not rows:
        return []
    note = [f"- {k}: {v['modules_note']}" for k, v in _ok(data).items() if v.get("modules_note")]  # PyNative: no scopes
    return [
        f"Kernel time per PyTorch module (ms per call), module paths cut at depth {data['depth']}. A MindSpore "
        "scope is counted under the PyTorch module it lies in; a Conv2dBnAct holds the time of the BatchNorm and "
        "activation fused into it, under the convolution's name. The last column is the slowest MindSpore "
        "variant over PyTorch:",
        "",
        *table(("module", *keys, "MindSpore / PyTorch"), rows, right=tuple(range(1, len(keys) + 2))),
        *([""] + note if note else []),
    ]


def markdown(data: dict, png: str) -> str:
    head = (
        f"{data['machine']['cpu']}, {data['threads']} threads, {data['calls']} profiled calls per variant on "
        f"{data['sample']}. A small kernel is one whose mean time per occurrence is under {data['small_ms']:g} ms."
    )
    lines = [
        head,
        "",
        *summary_lines(data),
        "",
        "## Per module",
        "",
        *module_lines(data),
        "",
        f"![time per module]({png})",
        "",
        "## Per op type",
        *op_type_lines(data),
    ]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys, rows = module_rows(data)
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(len(rows), 4) + 1.5))
    width = 0.8 / max(len(keys), 1)
    for i, k in enumerate(keys):
        values = [float(r[1 + i]) if r[1 + i] != "-" else 0.0 for r in rows]
        ax.barh([j + i * width for j in range(len(rows))], values, height=width, label=k)
    ax.set_yticks([j + 0.4 - width / 2 for j in range(len(rows))], [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("kernel ms per call")
    ax.set_title(f"{data['recipe']}: time per module (depth {data['depth']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_all(data: dict, run_root: Path) -> dict[str, Path]:
    out = run_root / "profile"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "profile.json", "md": out / "profile.md", "png": out / "modules.png"}
    write_json(paths["json"], data)
    plot(data, paths["png"])
    atomic_write_text(paths["md"], f"# torch2ms profile: {data['recipe']}\n\n{markdown(data, paths['png'].name)}")
    return paths
