"""W8A16 figures for benchmarks/results/w8a16.md: per generation run (converted up to the fold stage,
e.g. by ``torch2ms precision --plan w8a16``), the prefill + decode MindIRs' bytes in fp32 and with
the Linear weights int8 (every Linear, and every Linear but the lm_head), each reloaded and checked
as generation against transformers' tokens (free-running and teacher-forced), and the Linear
weights' share of the fp32 bytes.

    python benchmarks/w8a16_sizes.py runs/llama_tiny_generate runs/qwen2_tiny_generate \\
        runs/gpt2_tiny_generate --out /tmp/w8a16 --json /tmp/w8a16/sizes.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torch2ms.bundle import w8a16


def variants(root: Path, out: Path) -> dict:
    """fp32, all Linear int8, all but the lm_head int8: bytes and the reloaded MindIRs' generation."""
    plan, reference = w8a16.generation_setup(root)
    emu = w8a16.W8A16Emulator(root, plan, reference)
    row = {"fp32_bytes": sum(w8a16.fp32_mindirs(root, out / "fp32", emu).values())}
    row["linear_fp32_bytes"] = len(w8a16.GRAPHS) * sum(w.nbytes for w in emu.float)
    row["embedding_and_rest_bytes"] = row["fp32_bytes"] - row["linear_fp32_bytes"]
    for name, lm_head in (("all_linear", True), ("no_lm_head", False)):
        if name != "all_linear":
            emu = w8a16.W8A16Emulator(root, plan, reference)
        int8 = [n for n in emu.names if lm_head or not w8a16.is_lm_head(n)]
        written = w8a16.export_mindirs(emu, out / name, int8)
        _, generation = w8a16.check_mindirs(out / name, plan, reference)
        size = sum(p.stat().st_size for files in written.values() for p in files)
        row[name] = {"bytes": size, "ratio": round(size / row["fp32_bytes"], 4), "layers_int8": len(int8), **generation}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="<output>/<recipe name> of converted generation recipes")
    ap.add_argument("--out", type=Path, required=True, help="folder for the MindIRs")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    rows = {root.name: variants(root, args.out / root.name) for root in args.runs}
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
