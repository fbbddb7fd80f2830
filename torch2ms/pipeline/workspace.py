"""The run folder: one sub-folder per stage, each with its artifacts and ``stage.json``.

A stage writes into ``.<stage>.partial/`` and is committed by renaming that folder into place
(the previous one is moved aside first, then deleted), so a killed run never leaves a folder
that looks complete. Small files are written to a temp name and renamed. A lock (``flock`` on
``.lock``, which holds the owner's pid) keeps two runs out of the same folder; the lock of a
process that is gone is free again and taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

from torch2ms.errors import LockedError

RECORD = "stage.json"
HELD = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT and SIGTERM back for the block: one that lands inside it is raised as
    ``KeyboardInterrupt`` when the block ends. Python's handlers are swapped, not the thread's
    signal mask: MindSpore's and torch's threads would take a masked signal for the process."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and only it receives their calls
        return
    caught: list[int] = []
    before: dict = {}
    try:
        for s in HELD:  # inside the try: a signal already pending is handled by signal.signal itself
            before[s] = signal.signal(s, lambda signum, frame: caught.append(signum))
        yield
    finally:
        for s, handler in before.items():
            # None: the handler was set outside Python (MindSpore's SIGINT handler); Python's own replaces it
            try:
                signal.signal(s, handler if handler is not None else HELD[s])
            except KeyboardInterrupt:  # a pending one, raised by the restore: held like the others
                caught.append(s)
        if caught:
            raise KeyboardInterrupt(signal.Signals(caught[0]).name)


# sha256 per file identity: a run hashes model.onnx and network.ckpt (each the model's weights)
# in several places. Any write to a file sets its ctime to the kernel's coarse clock, which nothing
# can set back, and a rename over it changes the inode; a file is remembered only once its ctime is
# older than a clock tick, so a later write within the same tick cannot keep the same key.
_HASHED: dict[tuple, str] = {}
_SETTLED_S = 0.05


def array_hash(array: np.ndarray) -> str:
    """A weight's identity by value, shape and dtype: what modules.json records for each PyTorch
    parameter (``export.modules``) and what matches it with an ONNX initializer or a checkpoint's
    tensor (``codegen.weight_map``, ``tools.load_weights``)."""
    a = np.ascontiguousarray(array)
    return hashlib.sha1(a.tobytes() + str(a.shape).encode() + str(a.dtype).encode()).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key in _HASHED:
            return _HASHED[key]
        settled = time.time_ns() - st.st_ctime_ns > _SETTLED_S * 1e9
        h = hashlib.sha256()
        while block := f.read(chunk):
            h.update(block)
        st = os.fstat(f.fileno())
    digest = h.hexdigest()
    if settled and key == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        if len(_HASHED) > 4096:
            _HASHED.clear()
        _HASHED[key] = digest
    return digest


def artifact_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file in a stage's folder but its record, by path relative to it: files in
    sub-folders too (the mindir stage's ``network_variables/data_0`` over 1 GB of weights)."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / RECORD)
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez`` but byte-identical for identical arrays (fixed zip timestamps)."""
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            arr_buf = io.BytesIO()
            np.lib.format.write_array(arr_buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            zf.writestr(info, arr_buf.getvalue())
    atomic_write_bytes(path, buf.getvalue())


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class RunDir:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock_fd: int | None = None
        self._created: list[Path] = []  # the folders lock() made, deepest first: unlock() removes them if empty

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def partial_dir(self, stage: str) -> Path:
        return self.root / f".{stage}.partial"

    def fresh_partial(self, stage: str) -> Path:
        d = self.partial_dir(stage)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def discard_partial(self, stage: str) -> None:
        """Remove the stage's partial folder. SIGINT and SIGTERM wait until it is gone: a second
        Ctrl-C (or MindSpore's SIGINT handler, which sends SIGTERM) would cut ``rmtree`` short."""
        with signals_held():
            shutil.rmtree(self.partial_dir(stage), ignore_errors=True)

    def commit(self, stage: str, partial: Path) -> Path:
        """Move the partial folder into place; a Ctrl-C waits until it is (it would leave the stage
        half swapped: the old folder moved aside, the new one still partial)."""
        final = self.stage_dir(stage)
        old = self.root / f".{stage}.old"
        with signals_held():
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old, ignore_errors=True)
        return final

    def read_record(self, stage: str) -> dict | None:
        path = self.stage_dir(stage) / RECORD
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def changed_artifacts(self, stage: str, record: dict) -> list[str]:
        """Artifacts whose bytes no longer match the record (deleted or edited)."""
        bad = []
        for name, digest in record.get("artifacts", {}).items():
            p = self.stage_dir(stage) / name
            if not p.is_file() or sha256_file(p) != digest:
                bad.append(name)
        return bad

    def cleanup_stale(self) -> list[str]:
        """Remove leftovers of an interrupted run; return their names."""
        gone = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(".") and (p.name.endswith(".partial") or p.name.endswith(".old")):
                    shutil.rmtree(p, ignore_errors=True)
                    gone.append(p.name)
        return gone

    # --- lock ---
    @property
    def lock_path(self) -> Path:
        return self.root / ".lock"

    def lock(self) -> int | None:
        """Take the folder's lock; return the pid of a dead previous owner it took over, if any.

        The lock is an ``flock`` on ``.lock`` (which also holds the owner's pid for messages):
        the kernel drops it when its process dies, even by SIGKILL, so a lock file left by a
        dead run is simply free. Deciding "stale" from the pid alone let several runs that
        found the same stale file all delete it and all go ahead.
        """
        self._created = list(itertools.takewhile(lambda d: not d.exists(), (self.root, *self.root.parents)))
        while True:
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
            except FileNotFoundError:  # a run that found the folder empty removed it (unlock): make it again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = _read_pid(self.lock_path)
                who = f"pid {owner}" if owner is not None else "pid not yet written"
                raise LockedError(
                    f"{self.root} is in use by another torch2ms process ({who})",
                    hint="wait for it to finish, or use another --out",
                ) from None
            try:  # its owner may have removed the file between our open() and flock()
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = _read_pid(self.lock_path)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            self._lock_fd = fd
            return previous if previous != os.getpid() else None

    def unlock(self) -> None:
        """Release the lock; a run folder this lock made and nothing filled (a recipe refused
        before its first stage wrote anything) is removed, with the parents made for it."""
        if self._lock_fd is not None:
            self.lock_path.unlink(missing_ok=True)  # while still holding it: see lock()
            os.close(self._lock_fd)
            self._lock_fd = None
        for d in self._created:
            try:
                d.rmdir()
            except OSError:  # not empty (or in use again): keep it and its parents
                break
        self._created = []


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _input_order(arrays: dict[str, np.ndarray], ins: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``ins`` in the model's input order (``meta.input_order``): ``save_npz`` sorts the keys, and
    the samples are passed to the network by position (``attention_mask`` must not come before
    ``input_ids``)."""
    order = [str(n) for n in arrays.get("meta.input_order", [])]
    return {k: ins[k] for k in order if k in ins} | ins if order else ins


def split_reference(arrays: dict[str, np.ndarray]):
    ins = _input_order(arrays, {k[len("input.") :]: v for k, v in arrays.items() if k.startswith("input.")})
    outs = {k[len("output.") :]: v for k, v in arrays.items() if k.startswith("output.")}
    order = arrays.get("meta.output_order")
    if order is not None:
        outs = {str(n): outs[str(n)] for n in order}
    n = len(next(iter(ins.values())))
    # v[s, ...]: an array even for a scalar input or output (v[s] would be a numpy scalar)
    return [{k: v[s, ...] for k, v in ins.items()} for s in range(n)], [
        {k: v[s, ...] for k, v in outs.items()} for s in range(n)
    ]


def pack_reference(inputs: list[dict[str, np.ndarray]], outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    arrays = {f"input.{k}": np.stack([s[k] for s in inputs]) for k in inputs[0]}
    arrays.update({f"output.{k}": np.stack([s[k] for s in outputs]) for k in outputs[0]})
    arrays["meta.output_order"] = np.array(list(outputs[0]))
    arrays["meta.input_order"] = np.array(list(inputs[0]))
    return arrays


def pack_batches(batches: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """One sample per extra batch size (``inputs[].batch``), as ``batch<N>.input.<name>`` /
    ``batch<N>.output.<name>`` keys beside ``pack_reference``'s (which ``split_reference`` ignores)."""
    arrays = {}
    for n, (ins, outs) in batches.items():
        arrays.update({f"batch{n}.input.{k}": v for k, v in ins.items()})
        arrays.update({f"batch{n}.output.{k}": v for k, v in outs.items()})
    return arrays


def pack_lengths(lengths: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """One sample per extra sequence length (``inputs[].sequence``), as ``seq<N>.input.<name>`` /
    ``seq<N>.output.<name>`` keys (``split_batches`` and ``split_reference`` ignore them)."""
    return {f"seq{k[len('batch') :]}": v for k, v in pack_batches(lengths).items()}


def split_lengths(arrays: dict[str, np.ndarray]) -> dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """``pack_lengths``'s samples: sequence length -> (inputs, outputs)."""
    renamed = {f"batch{k[len('seq') :]}": v for k, v in arrays.items() if k.startswith("seq")}
    for key in ("meta.output_order", "meta.input_order"):
        if key in arrays:
            renamed[key] = arrays[key]
    return split_batches(renamed)


def split_batches(arrays: dict[str, np.ndarray]) -> dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """``pack_batches``'s samples: batch size -> (inputs, outputs), outputs in the reference's order."""
    order = [str(n) for n in arrays.get("meta.output_order", [])]
    out: dict[int, tuple[dict, dict]] = {}
    for key, v in arrays.items():
        if not key.startswith("batch"):
            continue
        size, kind, name = key[len("batch") :].split(".", 2)
        ins, outs = out.setdefault(int(size), ({}, {}))
        (ins if kind == "input" else outs)[name] = v
    for n, (ins, outs) in out.items():
        out[n] = (_input_order(arrays, ins), {k: outs[k] for k in order if k in outs} or outs)
    return dict(sorted(out.items()))
