"""The zoo's fork server (``torch2ms.zoo.forkserver``): a worker it forks sees what a fresh worker
process sees (folder, ``sys.path``, environment, thread budget, a process group of its own, its log),
torch is already imported in it, a server that is gone leaves the job to a fresh process, and a
server that dies takes its running worker with it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import yaml

from torch2ms.pipeline.workspace import write_json
from torch2ms.zoo import ZooOptions, load_zoo
from torch2ms.zoo.batch import make_jobs
from torch2ms.zoo.files import JOB, LOG, STATUS, read_json
from torch2ms.zoo.forkserver import ForkServer
from torch2ms.zoo.launch import run_one, worker_env

FACTS = """
import json, os, sys, time

def facts(out):
    import torch

    with open(out, "w") as f:
        json.dump({
            "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
            "sys_path": sys.path, "budget": os.environ.get("TORCH2MS_THREADS"),
            "parent": os.environ.get("TORCH2MS_ZOO_PARENT"), "torch_threads": torch.get_num_threads(),
            "marker": os.environ.get("ZOO_FORK_TEST"),
        }, f)
    raise RuntimeError("facts written")

def hangs():
    time.sleep(600)
"""


@pytest.fixture
def zoo_jobs(tmp_path, monkeypatch):
    """Jobs of a zoo whose factories live in its folder; the launcher's environment carries a marker."""
    folder = tmp_path / "zoo"
    folder.mkdir()
    (folder / "factsmod.py").write_text(FACTS)
    models = [
        {"name": "fresh", "model": {"factory": "factsmod:facts", "kwargs": {"out": str(tmp_path / "fresh.json")}}},
        {"name": "forked", "model": {"factory": "factsmod:facts", "kwargs": {"out": str(tmp_path / "forked.json")}}},
        {"name": "hangs", "model": {"factory": "factsmod:hangs"}},
    ]
    defaults = {"task": "classification", "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}]}
    path = folder / "zoo.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults, "models": models}))
    monkeypatch.setenv("ZOO_FORK_TEST", "from the launcher")
    monkeypatch.chdir(tmp_path)
    opts = ZooOptions(out_root=tmp_path / "runs", jobs=2)
    jobs = {j["name"]: j for j in make_jobs(load_zoo(path), opts, "batch-1")}
    return tmp_path, jobs


def _server(job: dict, out: Path) -> ForkServer:
    out.mkdir(parents=True, exist_ok=True)
    return ForkServer(job, worker_env(job), out)


def test_a_forked_worker_sees_what_a_fresh_worker_sees(zoo_jobs, monkeypatch):
    tmp, jobs = zoo_jobs
    server = _server(jobs["forked"], tmp / "runs")
    monkeypatch.setenv("ZOO_FORK_TEST", "set after the server started")  # the job's environment wins
    try:
        forked_row = run_one(jobs["forked"], server)
    finally:
        server.close()
    fresh_row = run_one(jobs["fresh"])
    for row in (forked_row, fresh_row):  # the factory ran, wrote its facts and raised
        assert row.status == "failed" and "facts written" in row.reason, row
    forked = json.loads((tmp / "forked.json").read_text())
    fresh = json.loads((tmp / "fresh.json").read_text())
    assert forked["ppid"] == server.proc.pid and fresh["ppid"] == os.getpid()  # who started each
    assert forked["parent"] == str(server.proc.pid) and fresh["parent"] == str(os.getpid())
    for facts in (forked, fresh):
        assert facts["pgid"] == facts["pid"]  # a group of its own: the launcher kills it whole
        assert facts["marker"] == "set after the server started"
        assert facts["budget"] == str(jobs["fresh"]["threads"])
        assert facts["torch_threads"] == jobs["fresh"]["threads"]
    assert forked["cwd"] == fresh["cwd"] == str(tmp)
    assert forked["sys_path"] == fresh["sys_path"]
    assert forked["sys_path"][:2] == [str(tmp / "zoo"), str(tmp)]  # the zoo file's folder (the loader's), the cwd
    log = (tmp / "runs" / "forked" / LOG).read_text()
    assert "facts written" in log and "[zoo] forked: export running" in log  # its own log, stdout and stderr
    assert "preloaded" in (tmp / "runs" / "zoo-forkserver.log").read_text()


def test_a_server_that_is_gone_leaves_the_job_to_a_fresh_process(zoo_jobs):
    tmp, jobs = zoo_jobs
    server = _server(jobs["forked"], tmp / "runs")
    server.proc.kill()
    server.proc.wait()
    try:
        row = run_one(jobs["forked"], server)
    finally:
        server.close()
    assert row.status == "failed" and "facts written" in row.reason, row
    assert json.loads((tmp / "forked.json").read_text())["ppid"] == os.getpid()


@pytest.mark.slow
def test_a_server_that_dies_takes_its_running_worker_with_it(zoo_jobs):
    tmp, jobs = zoo_jobs
    job = jobs["hangs"]
    run_dir = tmp / "runs" / "hangs"
    run_dir.mkdir(parents=True)
    write_json(run_dir / JOB, job)
    server = _server(job, tmp / "runs")
    try:
        worker = server.start(run_dir / JOB, run_dir / LOG, worker_env(job))
        deadline = time.monotonic() + 120
        while (read_json(run_dir / STATUS) or {}).get("stage") != "export":  # in the hanging factory
            assert time.monotonic() < deadline and worker.poll() is None, (run_dir / LOG).read_text()
            time.sleep(0.2)
        assert psutil.Process(worker.pid).ppid() == server.proc.pid
        os.kill(server.proc.pid, signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while psutil.pid_exists(worker.pid) and psutil.Process(worker.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the worker outlived its server"
            time.sleep(0.1)
    finally:
        server.close()


@pytest.mark.slow
def test_a_worker_forked_after_its_job_stopped_waiting_is_killed(zoo_jobs):
    """A job that gives up on the server (still importing) goes to a fresh process; the worker the
    server forks for it later must not run beside that one."""
    from torch2ms.zoo.forkserver import ForkServerGone

    tmp, jobs = zoo_jobs
    job = jobs["hangs"]  # never ends by itself
    run_dir = tmp / "runs" / "hangs"
    run_dir.mkdir(parents=True)
    write_json(run_dir / JOB, job)
    server = _server(job, tmp / "runs")
    try:
        with pytest.raises(ForkServerGone, match="did not answer within"):
            server.start(run_dir / JOB, run_dir / LOG, worker_env(job), wait_s=0.01)  # it is still importing
        deadline = time.monotonic() + 120
        while not server._exits:  # the server reports each worker's end
            assert time.monotonic() < deadline, "the late worker was not killed"
            time.sleep(0.2)
        assert list(server._exits.values()) == [-signal.SIGKILL]
    finally:
        server.close()
