"""CPU runtime settings that must be chosen before MindSpore is imported.

On CPUs with AVX-512/AMX, MindSpore 2.10's oneDNN kernels were measured ~80x slower than with
``ONEDNN_MAX_CPU_ISA=AVX2`` (ResNet18 GRAPH, 2 threads: 3.9 s vs 49 ms per image); PyTorch is
not affected. oneDNN reads the variable once, when it first dispatches, so it has to be in the
environment before ``import mindspore``. ``configure_cpu()`` does that:

* the user's own ``ONEDNN_MAX_CPU_ISA`` always wins (source ``env``);
* else ``--cpu-isa``/``TORCH2MS_CPU_ISA`` (source ``option``; ``default`` leaves oneDNN alone);
* else, when the CPU reports avx512f or amx, ``AVX2`` (source ``auto``).

The choice is recorded in every stage record and printed by the CLI.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

VALID_ISAS = ("default", "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL")


@dataclass(frozen=True)
class CpuChoice:
    isa: str  # value of ONEDNN_MAX_CPU_ISA, or "default"
    source: str  # env | option | auto | none
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


_choice: CpuChoice | None = None


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def configure_cpu(isa: str | None = None) -> CpuChoice:
    """Pick the oneDNN ISA cap for MindSpore; call before mindspore is imported."""
    global _choice
    if _choice is not None:
        return _choice
    requested = isa or os.environ.get("TORCH2MS_CPU_ISA")
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        _choice = CpuChoice(os.environ["ONEDNN_MAX_CPU_ISA"], "env", "ONEDNN_MAX_CPU_ISA was set by the user")
    elif requested:
        if requested not in VALID_ISAS:
            from torch2ms.errors import Torch2msError

            raise Torch2msError(f"--cpu-isa {requested!r} is not one of {', '.join(VALID_ISAS)}")
        if requested != "default":
            os.environ["ONEDNN_MAX_CPU_ISA"] = requested
        _choice = CpuChoice(requested, "option", "requested with --cpu-isa / TORCH2MS_CPU_ISA")
    else:
        flags = cpu_flags()
        wide = sorted(f for f in flags if f in {"avx512f", "amx_tile", "amx_bf16"})
        if wide and "avx2" in flags:
            os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
            _choice = CpuChoice(
                "AVX2", "auto", f"CPU has {', '.join(wide)}: MindSpore's oneDNN kernels measured ~80x slower there than capped at AVX2"
            )
        else:
            _choice = CpuChoice("default", "none", "no AVX-512/AMX on this CPU")
    if "mindspore" in sys.modules and _choice.source == "auto":
        _choice = CpuChoice(_choice.isa, _choice.source, _choice.reason + " (warning: mindspore was already imported; may not apply)")
    return _choice


def cpu_choice() -> CpuChoice | None:
    return _choice
