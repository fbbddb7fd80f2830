"""Zoo workers forked from a process that has already imported torch, MindSpore and onnxruntime.

Why: a fresh worker process spends seconds of CPU importing torch, torchvision, MindSpore, onnx,
onnxruntime and torch2ms before its first stage, the same for every model
(benchmarks/results/design_measurements.md). The local executor therefore starts one server per batch,
``python -m torch2ms.zoo.forkserver``, that imports them once and forks a worker per model.

A forked worker is the worker a fresh process would be:

* the server is started with the batch's environment (thread budget, ``PYTHONPATH``), working
  folder and CPU choice (``configure_cpu`` runs before anything imports MindSpore or torch), which
  every job of a batch shares (``batch.make_jobs``); a job that differs gets a fresh process;
* the child gets the job's own environment on top, the ``sys.path`` the server started with
  (what ``python -m torch2ms.zoo.worker`` in that folder would have), its own process group (the
  launcher kills the group at a timeout), and its stdout and stderr in the model's log;
* nothing runs in the server but imports: no torch or MindSpore thread pool exists when it forks.

The server dies with the launcher (``PR_SET_PDEATHSIG``), and each child with the server, so a
killed batch leaves no orphans. The launcher talks to it over two pipes, one JSON object a line:
``{"id", "job", "log", "env"}`` asks for a worker; ``{"id", "pid"}`` answers; ``{"pid",
"returncode"}`` says a worker ended (negative: the signal that killed it, as ``subprocess``).
When the server cannot start, dies, or does not answer within the job's timeout, ``launch.run_one``
starts the worker as a fresh process (and a worker the server forks for that job later is killed).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

# What every worker imports before its first stage, heaviest first (torchvision imports torch._dynamo).
PRELOAD = (
    "torch",
    "torchvision",
    "onnx",
    "onnxruntime",
    "mindspore",
    "torch.onnx",
    "torch2ms.zoo.worker",
    "torch2ms.pipeline.runner",
    "torch2ms.pipeline.report",
    "torch2ms.recipe",
    "torch2ms.stages",
    "torch2ms.codegen.convert",
    "torch2ms.zoo.disk",
    "torch2ms.zoo.failures",
)
LOG_NAME = "zoo-forkserver.log"
START_TIMEOUT_S = 600.0  # the first answer waits for the imports


class ForkServerGone(RuntimeError):
    """The server exited, or never started: start the worker as a fresh process instead."""


def server_key(job: dict) -> tuple:
    """What a forked worker shares with the server: a job with another key needs its own process."""
    return (job.get("cpu_isa"), job.get("threads"), tuple(job.get("pythonpath", [])), job.get("cwd"))


# ---------------------------------------------------------------------------------------------
# The launcher's side


class Forked:
    """A worker forked by the server, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            rc = self.server.wait_for(self.pid, timeout)
            if rc is None:
                raise subprocess.TimeoutExpired(f"zoo worker {self.pid}", timeout)
            self.returncode = rc
        return self.returncode


class ForkServer:
    """One server for the jobs of a batch that share ``server_key``."""

    def __init__(self, job: dict, env: dict[str, str], log_dir: Path):
        self.key = server_key(job)
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        cwd = job.get("cwd")
        try:
            with open(Path(log_dir) / LOG_NAME, "wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "torch2ms.zoo.forkserver", str(req_r), str(rep_w), job.get("cpu_isa") or ""],
                    pass_fds=(req_r, rep_w),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=cwd if cwd and os.path.isdir(cwd) else None,
                    env=env,
                    start_new_session=True,
                )
        except BaseException:
            os.close(self._req_w)
            os.close(self._rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}  # request id -> pid
        self._exits: dict[int, int] = {}  # pid -> returncode
        self._abandoned: set[int] = set()  # request ids that stopped waiting: their worker, if forked, is killed
        self._alive = True
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="zoo-forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        with open(self._rep_r, "rb", buffering=0) as rep:
            while True:
                chunk = rep.read(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                with self._cond:
                    for line in lines:
                        msg = json.loads(line)
                        if "returncode" in msg:
                            self._exits[msg["pid"]] = msg["returncode"]
                        elif msg["id"] in self._abandoned:  # its job went to a fresh process meanwhile
                            _kill_quietly(msg["pid"])
                        else:
                            self._pids[msg["id"]] = msg["pid"]
                    self._cond.notify_all()
        with self._cond:  # the server is gone: so are its workers (each dies with it)
            self._alive = False
            self._cond.notify_all()

    def start(self, job_path: Path, log_path: Path, env: dict[str, str], wait_s: float = START_TIMEOUT_S) -> Forked:
        """Fork a worker for the job; raises ForkServerGone when the server cannot, or has not
        answered within ``wait_s`` (a worker it forks later is killed at once: the job is elsewhere)."""
        rid = next(self._ids)
        line = json.dumps({"id": rid, "job": str(job_path), "log": str(log_path), "env": env}) + "\n"
        try:
            with self._write_lock:
                os.write(self._req_w, line.encode())
        except OSError as err:
            raise ForkServerGone(f"the zoo's fork server is gone ({err})") from None
        with self._cond:
            if not self._cond.wait_for(lambda: rid in self._pids or not self._alive, wait_s):
                self._abandoned.add(rid)
                raise ForkServerGone(f"the zoo's fork server did not answer within {wait_s:g} s")
            if rid not in self._pids:
                raise ForkServerGone(f"the zoo's fork server exited with code {self.proc.poll()}")
            return Forked(self, self._pids.pop(rid))

    def returncode_of(self, pid: int) -> int | None:
        with self._cond:
            return self._returncode(pid)

    def _returncode(self, pid: int) -> int | None:
        if pid in self._exits:
            return self._exits[pid]
        if not self._alive:  # its worker got SIGKILL when the server died (PR_SET_PDEATHSIG)
            return -signal.SIGKILL
        return None

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: self._returncode(pid) is not None, timeout)
            return self._returncode(pid)

    def close(self) -> None:
        """End the server (closing its request pipe); a worker still running is killed with it."""
        try:
            os.close(self._req_w)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)


# ---------------------------------------------------------------------------------------------
# The server's side


def _kill_quietly(pid: int) -> None:
    """SIGKILL the worker's process group (it leads one), or the process if it has not made it yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except OSError:
            continue


def _send(fd: int, msg: dict) -> None:
    os.write(fd, (json.dumps(msg) + "\n").encode())


def _preload(names=PRELOAD) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a module it cannot import, the worker imports itself (or fails there)
            print(f"[forkserver] not preloaded: {name}: {type(err).__name__}: {err}", flush=True)


def _child(req: dict, fds: tuple[int, int], initial_path: list[str]) -> None:
    """The forked worker: never returns."""
    code = 1
    try:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass  # the server already made it a group leader
        for fd in fds:
            os.close(fd)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.update(req["env"])
        os.environ["TORCH2MS_ZOO_PARENT"] = str(os.getppid())  # its parent is this server
        sys.path[:] = initial_path
        sys.argv = [sys.argv[0], req["job"]]
        from torch2ms.zoo.worker import main

        code = main(req["job"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) else 1)


def serve(req_fd: int, rep_fd: int, cpu_isa: str | None) -> None:
    from torch2ms.runtime.cpu import configure_cpu
    from torch2ms.zoo.worker import _die_with_parent

    _die_with_parent()
    initial_path = list(sys.path)
    choice = configure_cpu(cpu_isa or None)  # before anything imports MindSpore or torch
    os.environ.setdefault("GLOG_v", "3")
    print(f"[forkserver] pid {os.getpid()}; CPU ONEDNN_MAX_CPU_ISA={choice.isa} ({choice.source})", flush=True)
    _preload()
    print("[forkserver] preloaded", flush=True)
    children: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([req_fd], [], [], 0.2)
        if ready:
            chunk = os.read(req_fd, 65536)
            if not chunk:
                break  # the launcher closed the pipe, or died
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                req = json.loads(line)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req, (req_fd, rep_fd), initial_path)
                try:
                    os.setpgid(pid, pid)
                except OSError:
                    pass  # the child did it first
                children.add(pid)
                _send(rep_fd, {"id": req["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(rep_fd, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
    for pid in children:
        _kill_quietly(pid)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
