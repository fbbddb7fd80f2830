"""Reproducible ``.tar.gz`` writing and defensive reading.

Writing: entries sorted by path, regular files only, mtime ``SOURCE_DATE_EPOCH`` (default 0),
uid/gid 0 with empty owner names, mode 0755 for scripts and 0644 otherwise, GNU tar format
(no PAX headers carrying times), gzip with mtime 0 and no file name in its header. The archive
is written to a temporary name beside the target and renamed, so a reader never sees half of it.

Reading: nothing is extracted by ``tarfile``; each member is checked first (no absolute paths,
no ``..``, no links, devices or FIFOs, no duplicates) and regular files are copied into the
destination by our own code while hashing them.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from torch2ms.errors import Torch2msError

EXECUTABLE_SUFFIXES = (".sh",)
EXECUTABLES = ("infer.py",)


class BundleTampered(Torch2msError):
    """The bundle's content does not match its manifest, or an entry is unsafe."""

    exit_code = 1


class BundleUnreadable(Torch2msError):
    """The file is missing, not a gzip'd tar, or has no readable manifest."""

    exit_code = 2


def _mtime() -> int:
    try:
        return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    except ValueError:
        return 0


def mode_for(path: str) -> int:
    return 0o755 if path.endswith(EXECUTABLE_SUFFIXES) or path in EXECUTABLES else 0o644


def write_archive(dest: Path, files: dict[str, Path | bytes]) -> None:
    """``files``: bundle path -> source file or content."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; a bundle is meant to be shared
    mtime = _mtime()
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        ):
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for name in sorted(files):
                    src = files[name]
                    info = tarfile.TarInfo(name)
                    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
                    info.mode = mode_for(name)
                    if isinstance(src, bytes):
                        import io

                        info.size = len(src)
                        tar.addfile(info, io.BytesIO(src))
                    else:
                        info.size = src.stat().st_size
                        with open(src, "rb") as f:
                            tar.addfile(info, f)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_name(name: str) -> str:
    if not name or name.startswith("/") or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise BundleTampered(
            f"entry {name!r}: absolute path", hint="a bundle only holds relative paths; do not install this archive"
        )
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise BundleTampered(
            f"entry {name!r}: path traversal ('..')",
            hint="a bundle never points outside itself; do not install this archive",
        )
    return str(PurePosixPath(*[p for p in parts if p != "."]))


def _link_target_outside(member: tarfile.TarInfo) -> bool:
    target = PurePosixPath(member.linkname)
    if target.is_absolute():
        return True
    base = PurePosixPath(member.name).parent if member.issym() else PurePosixPath(".")
    depth = 0
    for part in (base / target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def safe_extract(archive: Path, dest: Path) -> dict[str, str]:
    """Extract regular files into ``dest``; return path -> sha256. Raises on any unsafe entry."""
    if not archive.is_file():
        raise BundleUnreadable(f"{archive}: no such file", hint="pass the .tar.gz written by `torch2ms package`")
    hashes: dict[str, str] = {}
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:
                name = _check_name(member.name)
                if member.issym() or member.islnk():
                    kind = "symlink" if member.issym() else "hardlink"
                    where = (
                        "pointing outside the bundle"
                        if _link_target_outside(member)
                        else "(links are not allowed in a bundle)"
                    )
                    raise BundleTampered(
                        f"entry {name!r}: {kind} to {member.linkname!r} {where}", hint="do not install this archive"
                    )
                if member.isdir():
                    continue
                if not member.isreg():
                    raise BundleTampered(
                        f"entry {name!r}: not a regular file (device, FIFO or other special file)",
                        hint="do not install this archive",
                    )
                if name in hashes:
                    raise BundleTampered(
                        f"entry {name!r} appears twice",
                        hint="the second copy would silently replace the first; do not install this archive",
                    )
                out = dest / name
                if dest.resolve() not in out.resolve().parents:
                    raise BundleTampered(f"entry {name!r} resolves outside the destination")
                out.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                src = tar.extractfile(member)
                with open(out, "wb") as f:
                    while block := src.read(1 << 22):
                        h.update(block)
                        f.write(block)
                os.chmod(out, 0o755 if member.mode & 0o100 else 0o644)
                hashes[name] = h.hexdigest()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        if isinstance(err, OSError) and not isinstance(err, gzip.BadGzipFile) and err.errno is not None:
            raise
        raise BundleUnreadable(
            f"{archive}: not a readable .tar.gz ({type(err).__name__}: {err})",
            hint="the file is truncated or not a torch2ms bundle; download it again",
        ) from None
    return hashes
