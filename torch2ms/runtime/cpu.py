"""CPU runtime settings that must be chosen before MindSpore is imported.

Why: MindSpore 2.10 bundles oneDNN 3.10 and asks it for convolutions on plain NCHW tensors. On
a CPU with AVX-512, oneDNN then picks its ``jit_uni_ncsp`` implementation, which runs every
convolution that is not a stride-1 1x1 through ``ref:any``, its reference C++ loops
(ONEDNN_VERBOSE shows ``jit_uni_ncsp:conv+ref:any``), tens of times slower. Capped at AVX2
(``ONEDNN_MAX_CPU_ISA=AVX2``) it uses ``gemm:jit``
(im2col + AVX2 sgemm) for every convolution. PyTorch and onnxruntime are not affected.
Measurements: benchmarks/README.md. oneDNN reads the variable once, so it has to be in the
environment before ``import mindspore``. ``configure_cpu()`` does that:

* the user's own ``ONEDNN_MAX_CPU_ISA`` always wins (source ``env``);
* else ``--cpu-isa``/``TORCH2MS_CPU_ISA`` (source ``option``; ``default`` leaves oneDNN alone);
* else, on a CPU with AVX-512/AMX, the faster of oneDNN's default and AVX2, *measured* once per
  machine and MindSpore version: a small convolution probe runs under each in a fresh
  subprocess, is checked against numpy, and the result is cached in
  ``~/.cache/torch2ms/cpu_isa.json`` (source ``auto``). If the probe cannot run, or
  ``TORCH2MS_CPU_CALIBRATE=0``, AVX2 is chosen from the CPU flags alone (the measured winner);
* else oneDNN is left alone (source ``none``).

The choice is recorded in every stage record and printed by the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

VALID_ISAS = (
    "default",
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX512_CORE_AMX",
    "ALL",
)
# Tried on AVX-512/AMX CPUs; the AVX-512 caps below ``default`` behave like it (benchmarks/README.md).
CANDIDATES = ("AVX2", "default")


@dataclass(frozen=True)
class CpuChoice:
    isa: str  # value of ONEDNN_MAX_CPU_ISA, or "default"
    source: str  # env | option | auto | none
    reason: str

    def to_dict(self) -> dict:
        from torch2ms.runtime.threads import budget

        return {**asdict(self), "threads": budget()}


_choice: CpuChoice | None = None


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# A 3x3 and a 1x1 convolution (the two oneDNN paths that matter), checked against numpy.
_PROBE = r"""
import json, os, sys, time
os.environ["GLOG_v"] = "3"
import numpy as np
import mindspore as ms
from mindspore import ops
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
w3 = rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1
w1 = rng.standard_normal((128, 64, 1, 1)).astype(np.float32) * 0.1
def ref():
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[0, :, i:i + 56, j:j + 56] for i in range(3) for j in range(3)], 1)  # C,9,H,W
    y = np.einsum("ock,ckhw->ohw", w3.reshape(64, 64, 9), cols)
    return np.einsum("oc,chw->ohw", w1[:, :, 0, 0], y)[None]
xt, w3t, w1t = ms.Tensor(x), ms.Tensor(w3), ms.Tensor(w1)
def run():
    return ops.conv2d(ops.conv2d(xt, w3t, pad_mode="pad", padding=1), w1t).asnumpy()
out = run()
times = []
for _ in range(3):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
r = ref()
err = float(np.abs(out - r).max() / np.abs(r).max())
print("@@PROBE " + json.dumps({"ms": sorted(times)[1] * 1e3, "rel_error": err}))
"""


def _cache_path() -> Path:
    root = os.environ.get("TORCH2MS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch2ms"
    )
    return Path(root) / "cpu_isa.json"


def _cache_key() -> str:
    try:
        from importlib.metadata import version

        ms_version = version("mindspore")
    except Exception:  # no mindspore installed: nothing to calibrate, key still stable
        ms_version = "absent"
    raw = json.dumps([cpu_model(), sorted(cpu_flags()), ms_version, CANDIDATES])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def probe(isa: str, timeout: float = 120) -> dict:
    """Time the convolution probe under one ISA cap in a fresh process: {ms, rel_error} or {error}."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if isa != "default":
        env["ONEDNN_MAX_CPU_ISA"] = isa
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    for line in proc.stdout.splitlines():
        if line.startswith("@@PROBE "):
            return json.loads(line[len("@@PROBE ") :])
    tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return {"error": tail[0][:200]}


def calibrate(candidates=CANDIDATES, use_cache: bool = True) -> dict:
    """Probe each candidate (cached per CPU + MindSpore version); returns the cache entry."""
    path, key = _cache_path(), _cache_key()
    if use_cache:
        try:
            entry = json.loads(path.read_text()).get(key)
            if entry and entry.get("best"):
                return entry
        except (OSError, ValueError):
            pass
    results = {isa: probe(isa) for isa in candidates}
    correct = {isa: r["ms"] for isa, r in results.items() if "ms" in r and r.get("rel_error", 1) < 1e-4}
    entry = {"best": min(correct, key=correct.get) if correct else None, "results": results, "cpu": cpu_model()}
    if entry["best"]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = json.loads(path.read_text()) if path.exists() else {}
            data[key] = entry
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu_isa.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2)
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass  # an unwritable cache only costs a re-probe next time
    return entry


def _auto(flags: set[str]) -> CpuChoice:
    wide = sorted(f for f in flags if f in {"avx512f", "amx_tile", "amx_bf16"})
    if not (wide and "avx2" in flags):
        return CpuChoice("default", "none", "no AVX-512/AMX on this CPU")
    fallback = CpuChoice(
        "AVX2",
        "auto",
        f"CPU has {', '.join(wide)}: MindSpore's oneDNN convolutions fall back to reference code above AVX2 (measured "
        "40-80x slower)",
    )
    if os.environ.get("TORCH2MS_CPU_CALIBRATE", "1") == "0" or "mindspore" in sys.modules:
        return fallback
    entry = calibrate()
    best = entry.get("best")
    if not best:
        return fallback
    res = entry["results"]
    timing = ", ".join(f"{isa} {r['ms']:.1f} ms" if "ms" in r else f"{isa} failed" for isa, r in res.items())
    return CpuChoice(
        best,
        "auto",
        f"fastest correct on this CPU ({', '.join(wide)}) by a conv probe: {timing} (cached in {_cache_path()})",
    )


def configure_cpu(isa: str | None = None) -> CpuChoice:
    """Pick the oneDNN ISA cap for MindSpore, and put the thread budget (``runtime.threads``) in the
    environment; call before mindspore and torch are imported."""
    from torch2ms.runtime.threads import configure_environment

    global _choice
    configure_environment()
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
        _choice = _auto(cpu_flags())
        if _choice.isa != "default":
            os.environ["ONEDNN_MAX_CPU_ISA"] = _choice.isa
    if "mindspore" in sys.modules and _choice.source == "auto":
        _choice = CpuChoice(
            _choice.isa, _choice.source, _choice.reason + " (warning: mindspore was already imported; may not apply)"
        )
    return _choice


def cpu_choice() -> CpuChoice | None:
    return _choice


def adopt(choice: CpuChoice) -> None:
    """Take over a parent process's choice (its environment came with ours): a stage in its own
    process (``pipeline.own_process``) records and applies the same one."""
    from torch2ms.runtime.threads import configure_environment

    global _choice
    configure_environment()
    _choice = choice
