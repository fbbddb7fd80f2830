"""W8A16 figures for benchmarks/results/w8a16.md: per generation run (converted up to the fold stage,
e.g. by ``torch2ms precision --plan w8a16``), the prefill + decode MindIRs' bytes in fp32 and with
every Linear weight and gathered table (token embedding) int8, and with the Linear weights only, each
reloaded and checked as generation against transformers' tokens (free-running and teacher-forced,
near-ties within the run's int8 noise floor), and the Linear weights' and tables' share of the fp32 bytes.

    python benchmarks/w8a16_sizes.py runs/llama_tiny_generate runs/qwen2_tiny_generate \\
        runs/gpt2_tiny_generate --recipes recipes/{llama,qwen2,gpt2}_tiny_generate.yaml \\
        --out /tmp/w8a16 --json /tmp/w8a16/sizes.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torch2ms.bundle import w8a16
from torch2ms.recipe import load_recipe


def variants(recipe, root: Path, out: Path) -> dict:
    """fp32, every layer int8, the Linear layers only: bytes and the reloaded MindIRs' generation."""
    plan, reference = w8a16.generation_setup(root)
    emu = w8a16.W8A16Emulator(root, plan, reference)
    ties = w8a16.near_tie_record(recipe, reference, emu.noise_floor())
    names, tables = emu.names, emu.tables()
    weights = {op: sum(w.nbytes for w, o in zip(emu.float, emu.op_types) if o == op) for op in ("Dense", "Gather")}
    del emu
    row = {"fp32_bytes": sum(w8a16.fp32_mindirs(root, out).values()), "near_tie": ties}
    for name, with_tables in (("every_layer", True), ("linear_only", False)):
        dense = [n for n in names if n not in tables]
        written = {
            g: w8a16.export_mindirs(root, g, out / name, dense, tables if with_tables else []) for g in w8a16.GRAPHS
        }
        _, generation = w8a16.check_mindirs(out / name, plan, reference, ties["bound"])
        sizes = w8a16.sizes({"all": row["fp32_bytes"]}, weights, written)
        size = sum(sizes["w8a16_bytes"].values())
        int8 = len(dense) + (len(tables) if with_tables else 0)
        row[name] = {"bytes": size, "ratio": round(size / row["fp32_bytes"], 4), "layers_int8": int8, **generation}
        row["linear_share"], row["tables_share"] = sizes["linear_share"], sizes["tables_share"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="<output>/<recipe name> of converted generation recipes")
    ap.add_argument("--recipes", nargs="+", type=Path, required=True, help="their recipes, in the same order")
    ap.add_argument("--out", type=Path, required=True, help="folder for the MindIRs")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    rows = {root.name: variants(load_recipe(r), root, args.out / root.name) for root, r in zip(args.runs, args.recipes)}
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
