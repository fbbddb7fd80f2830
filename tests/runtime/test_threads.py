"""The thread budget (torch2ms.runtime.threads): TORCH2MS_THREADS reaches torch, MindSpore and
onnxruntime, a zoo gives each worker its share, and a bad value is refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from torch2ms.errors import Torch2msError
from torch2ms.graph import onnxrt
from torch2ms.runtime import threads


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5"])
def test_a_bad_budget_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(threads.ENV, raw)
    with pytest.raises(Torch2msError, match=f"TORCH2MS_THREADS={raw!r} is not a whole number"):
        threads.budget()


def test_the_cli_refuses_a_bad_budget_before_writing_anything(monkeypatch, tmp_path, capsys):
    from conftest import run_cli, write_recipe

    monkeypatch.setenv(threads.ENV, "two")
    out = tmp_path / "runs"
    assert run_cli("convert", "--recipe", str(write_recipe(tmp_path / "r.yaml")), "--out", str(out)) == 2
    assert "TORCH2MS_THREADS='two' is not a whole number" in capsys.readouterr().err
    assert not out.exists()


def test_shares_divide_the_budget_and_never_reach_zero(monkeypatch):
    monkeypatch.setenv(threads.ENV, "5")
    assert [threads.share(p) for p in (1, 2, 3, 5, 8)] == [5, 2, 1, 1, 1]
    monkeypatch.delenv(threads.ENV)
    assert threads.budget() is None and threads.cores() >= 1


def test_onnxruntime_sessions_take_the_budget_unless_they_choose(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    assert onnxrt.session_options(onnxrt.VALIDATE).intra_op_num_threads == 0  # onnxruntime's default
    monkeypatch.setenv(threads.ENV, "3")
    assert onnxrt.session_options(onnxrt.VALIDATE).intra_op_num_threads == 3
    assert onnxrt.session_options(onnxrt.EMULATION).intra_op_num_threads == 1  # its own choice
    assert onnxrt.session_options(onnxrt.BENCHMARK, threads=2).intra_op_num_threads == 2


_PROBE = """
import json, os
from torch2ms.runtime.cpu import configure_cpu, cpu_choice
configure_cpu()
import torch
seen = {"torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
        "record": cpu_choice().to_dict()["threads"]}
if os.environ.get("PROBE_MINDSPORE"):
    from torch2ms.runtime import msutil
    seen["mindspore"] = msutil.mindspore().get_context("runtime_num_threads")
print(json.dumps(seen))
"""


def _probe(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", threads.ENV)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**base, **env}, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_budget_reaches_torch_and_mindspore_in_a_fresh_process():
    assert _probe(TORCH2MS_THREADS="1", PROBE_MINDSPORE="1") == {"torch": 1, "mindspore": 1, "omp": "1", "record": 1}
    # the user's own OpenMP setting wins for torch
    assert _probe(TORCH2MS_THREADS="1", OMP_NUM_THREADS="2") == {"torch": 2, "omp": "2", "record": 1}


def test_pynative_runs_each_op_to_its_end():
    """runtime.msutil.mindspore() turns MindSpore's asynchronous PyNative dispatch off: its queue
    threads spin beside the ops on a CPU (msutil._synchronous_pynative)."""
    from mindspore._c_expression import RuntimeConf

    from torch2ms.runtime import msutil

    msutil.mindspore()
    assert RuntimeConf.get_instance().is_launch_blocking()


def test_without_a_budget_nothing_changes():
    unset = _probe()
    assert unset["omp"] is None and unset["record"] is None
    assert unset["torch"] == len(os.sched_getaffinity(0))  # torch's default: one thread per core


def test_a_zoo_gives_each_local_worker_its_share_and_a_ray_task_one(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from torch2ms.zoo import ZooOptions
    from torch2ms.zoo.batch import make_jobs
    from torch2ms.zoo.launch import worker_env

    model = SimpleNamespace(
        name="m",
        data={},
        source="zoo.yaml: models[0]",
        recipe=SimpleNamespace(base_dir=tmp_path),
        timeout=None,
        max_memory_mb=None,
    )

    def job_threads(**opts) -> int:
        return make_jobs([model], ZooOptions(out_root=tmp_path, **opts), "batch")[0]["threads"]

    monkeypatch.setenv(threads.ENV, "4")
    assert [job_threads(jobs=j) for j in (None, 1, 2, 3, 8)] == [4, 4, 2, 1, 1]
    assert job_threads(jobs=2, executor="ray") == 1  # a Ray task holds one CPU
    assert worker_env({"threads": 2})[threads.ENV] == "2"
    monkeypatch.delenv(threads.ENV)
    assert threads.ENV not in worker_env({})
