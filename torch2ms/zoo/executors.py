"""Where the zoo's workers run: a local pool of ``--jobs`` threads, each waiting on one worker
process (forked by the batch's fork server, ``zoo.forkserver``), or Ray tasks (one per model,
``num_cpus=1``, no retries) that each run the same launcher on whichever node Ray picks, with a
fresh worker process. Either way ``launch.run_one`` makes the row, so the summaries are the same.
Ray is optional and imported only when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from torch2ms.errors import Torch2msError
from torch2ms.stages import stage_names
from torch2ms.zoo.forkserver import ForkServer
from torch2ms.zoo.launch import kill_all, run_one, worker_env
from torch2ms.zoo.row import ModelRow

OnDone = Callable[[ModelRow], None]


def failed_row(job: dict, reason: str) -> ModelRow:
    """The row of a model whose task never produced one (the executor itself failed)."""
    return ModelRow(job["name"], "crashed", dict.fromkeys(stage_names(), "not run"), reason)


def run_local(jobs: list[dict], parallel: int, on_done: OnDone) -> None:
    server = _fork_server(jobs)
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="zoo")
    futures = {pool.submit(run_one, job, server): job for job in jobs}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for f in done:
                try:
                    on_done(f.result())
                except Exception as err:  # the launcher itself failed (e.g. disk full)
                    on_done(failed_row(futures[f], f"launcher error: {type(err).__name__}: {err}"))
    except BaseException:
        for f in futures:
            f.cancel()
        kill_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if server is not None:
            server.close()


def _fork_server(jobs: list[dict]) -> ForkServer | None:
    """The batch's fork server (``zoo.forkserver``), started here in the main thread (it dies with
    the thread that started it). None for a batch of one model, whose fresh worker imports only what
    it needs (an up-to-date model imports far less than the server), or when the server
    cannot start: fresh workers then."""
    if len(jobs) < 2:
        return None
    out_root = Path(jobs[0]["out_root"])
    out_root.mkdir(parents=True, exist_ok=True)
    try:
        return ForkServer(jobs[0], worker_env(jobs[0]), out_root)
    except OSError as err:
        print(f"[zoo] no fork server ({err}): every worker starts as a fresh process", file=sys.stderr)
        return None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise Torch2msError(
            "--executor ray needs the `ray` package, which is not installed",
            hint="pip install 'torch2ms[ray]', or use --executor local",
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` nothing listens on (ray.init would retry for minutes)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray's own resolution
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as err:
        raise Torch2msError(
            f"--address {address}: nothing answers there ({err})",
            hint=(
                "start the cluster with `ray start --head`, check host and port, or drop --address to start a local Ray"
            ),
        ) from None


def run_ray(
    jobs: list[dict], parallel: int | None, address: str | None, on_done: OnDone, log: Callable[[str], None] = print
) -> int:
    """Run every job as a Ray task; at most ``parallel`` in flight (default: the cluster's CPUs; a
    local Ray gets ``parallel`` CPUs, default all).
    Connects to ``address`` or, without one, to a running ``ray.init`` or a new local Ray
    (shut down at the end). Returns the parallelism used."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        try:
            if address:
                _check_reachable(address)
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(num_cpus=parallel or os.cpu_count(), include_dashboard=False, log_to_driver=False)
        except Torch2msError:
            raise
        except Exception as err:
            raise Torch2msError(
                f"--executor ray: cannot start or reach Ray{f' at {address}' if address else ''}: "
                f"{type(err).__name__}: {err}",
                hint="check --address (e.g. ray://host:10001 or auto), or drop it to start a local Ray",
            ) from None
        started = True
        log(f"Ray {'at ' + address if address else 'started locally'}: {ray.cluster_resources().get('CPU', 0):g} CPUs")
    parallel = parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
    task = ray.remote(num_cpus=1, max_retries=0)(run_one)
    queue = list(jobs)
    in_flight: dict = {}
    try:
        while queue or in_flight:
            while queue and len(in_flight) < parallel:
                job = queue.pop(0)
                in_flight[task.remote(job)] = job
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                job = in_flight.pop(ref)
                try:
                    on_done(ray.get(ref))
                except Exception as err:  # the Ray worker died or the task could not run
                    on_done(
                        failed_row(
                            job,
                            f"Ray task failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                        )
                    )
    except BaseException:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
    return parallel
