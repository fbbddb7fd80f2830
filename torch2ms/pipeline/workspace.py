"""The run folder: one sub-folder per stage, each with its artifacts and ``stage.json``.

A stage writes into ``.<stage>.partial/`` and is committed by renaming that folder into place
(the previous one is moved aside first, then deleted), so a killed run never leaves a folder
that looks complete. Small files are written to a temp name and renamed. A lock file holding
the owner's pid keeps two runs out of the same folder; a lock whose process is gone is taken
over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from torch2ms.errors import LockedError

RECORD = "stage.json"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        self._locked = False

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
        shutil.rmtree(self.partial_dir(stage), ignore_errors=True)

    def commit(self, stage: str, partial: Path) -> Path:
        final = self.stage_dir(stage)
        old = self.root / f".{stage}.old"
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

    def lock(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = _read_pid(self.lock_path)
                if owner is not None and owner != os.getpid() and _alive(owner):
                    raise LockedError(
                        f"{self.root} is in use by another torch2ms process (pid {owner})",
                        hint=f"wait for it to finish, or use another --out; if pid {owner} is not torch2ms, delete {self.lock_path}",
                    ) from None
                self.lock_path.unlink(missing_ok=True)  # stale: its owner is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self._locked = True
            return
        raise LockedError(f"could not take the lock {self.lock_path}")

    def unlock(self) -> None:
        if self._locked and _read_pid(self.lock_path) == os.getpid():
            self.lock_path.unlink(missing_ok=True)
        self._locked = False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed child not yet reaped) is not a live owner
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
