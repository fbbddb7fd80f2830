"""A zoo batch: one job per selected model, run by an executor, rows collected in zoo order,
summaries written. Progress (which models run, at which stage) is read from the workers'
``zoo-status.json`` files, which works the same for local processes and Ray tasks."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch2ms.runtime.threads import share
from torch2ms.zoo.files import STATUS, read_json
from torch2ms.zoo.row import ModelRow
from torch2ms.zoo.spec import ZooModel
from torch2ms.zoo.summary import build, write_summaries


@dataclass
class ZooOptions:
    out_root: Path
    jobs: int | None = None  # None: 1 locally, the cluster's CPUs with Ray
    timeout: float = 1800.0
    max_memory_mb: float | None = None  # None: no limit of ours (the kernel's OOM killer still applies)
    executor: str = "local"  # local | ray
    address: str | None = None
    cpu_isa: str | None = None
    keep: str = "needed"  # needed: a passed model's intermediate weights go (torch2ms.zoo.disk); all
    profile_calls: int = 0  # > 0: each passed model is profiled with this many calls (torch2ms.zoo.profile)


@dataclass
class BatchState:
    """What the progress display shows; updated by the executor's callbacks."""

    names: list[str]
    out_root: Path
    batch: str
    rows: dict[str, ModelRow] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, row: ModelRow) -> None:
        with self.lock:
            self.rows[row.name] = row

    def counts(self) -> tuple[int, int]:
        with self.lock:
            ok = sum(r.passed for r in self.rows.values())
            return ok, len(self.rows) - ok

    def running(self) -> list[tuple[str, str, float]]:
        """(name, stage, seconds) of the models whose worker is alive in this batch."""
        out = []
        with self.lock:
            todo = [n for n in self.names if n not in self.rows]
        for name in todo:
            st = read_json(self.out_root / name / STATUS)
            if st and st.get("batch") == self.batch and st.get("state") in ("starting", "running"):
                out.append((name, st.get("stage") or "starting", time.time() - st.get("started", time.time())))
        return out


def make_jobs(models: list[ZooModel], opts: ZooOptions, batch: str) -> list[dict]:
    pythonpath = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [
        {
            "name": m.name,
            "recipe": m.data,
            "source": m.source,
            "base_dir": str(Path(m.recipe.base_dir).resolve()),
            "out_root": str(opts.out_root.resolve()),
            "timeout": m.timeout or opts.timeout,
            "max_memory_mb": m.max_memory_mb or opts.max_memory_mb,
            "cpu_isa": opts.cpu_isa,
            # a Ray task holds one CPU; local workers split this machine's cores (runtime.threads)
            "threads": 1 if opts.executor == "ray" else share(opts.jobs or 1),
            "keep": opts.keep,
            "profile_calls": opts.profile_calls,
            "cwd": os.getcwd(),
            "pythonpath": pythonpath,
            "batch": batch,
        }
        for m in models
    ]


def run_batch(
    models: list[ZooModel],
    opts: ZooOptions,
    zoo_source: str,
    on_row: Callable[[ModelRow], None] = lambda r: None,
    on_start: Callable[[BatchState], None] = lambda s: None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run every model; write the summaries; return the summary data (``models`` in zoo order)."""
    from torch2ms.zoo.executors import run_local, run_ray

    batch = uuid.uuid4().hex
    jobs = make_jobs(models, opts, batch)
    state = BatchState([m.name for m in models], opts.out_root, batch)

    def done(row: ModelRow) -> None:
        state.add(row)
        on_row(row)

    on_start(state)
    t0 = time.perf_counter()
    if opts.executor == "ray":
        parallel = run_ray(jobs, opts.jobs, opts.address, done, log=log)
    else:
        parallel = opts.jobs or 1
        run_local(jobs, parallel, done)
    rows = [state.rows[m.name] for m in models]
    meta = {
        "zoo": zoo_source,
        "executor": opts.executor,
        "jobs": parallel,
        "timeout": opts.timeout,
        "max_memory_mb": opts.max_memory_mb,
        "keep": opts.keep,
        "seconds": round(time.perf_counter() - t0, 1),
        "out": str(opts.out_root),
    }
    data = build(rows, meta)
    data["paths"] = {k: str(v) for k, v in write_summaries(opts.out_root, data).items()}
    return data
