"""Writing run files safely: a fresh temporary file in the destination folder, then a rename.

Every file LEO writes into a run folder (or the shared hardware cache) goes through here: the
temporary file is never a planted file or symlink, the rename replaces the destination itself,
an error or interruption leaves nothing half-written under the real name, and JSON never holds
NaN or infinities. `private_dir` makes folders the same way; `sweep_temporaries` removes the
temporary files a killed process left behind.

Specification: docs/design/run-files.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\..+\.(\d+)-[A-Za-z0-9_]+\.tmp$")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once at import (changing the umask is process-wide, so not in the middle of a run).
_UMASK = _umask()
_FILE_MODE = 0o666 & ~_UMASK


def temp_prefix(path: Path) -> str:
    """`.<name>.<pid>-`: hidden, names what it will become and which process writes it."""
    return f".{path.name}.{os.getpid()}-"


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", fsync: bool = False) -> Iterator[IO[Any]]:
    """A file object whose content replaces `path` when the block ends without an error.

    Args:
        path: the destination; its folder must exist.
        mode: "wb" (bytes) or "w" (UTF-8 text).
        fsync: flush to disk before the rename, and the folder after it (checkpoints: a crash
            right after the rename must leave neither an empty file under the real name nor
            the folder without the new name).

    Raises:
        OSError: the folder cannot hold the file, or `path` is a folder; the temporary file
            is removed first.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=TEMP_SUFFIX)
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600; a run file is as readable as any other
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            fd = -1  # owned by f now
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so the names renamed into it are on disk (where the file system allows
    opening a folder for it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    """Replace `path` with `data` (see `atomic_file`)."""
    with atomic_file(path, "wb", fsync=fsync) as f:
        f.write(data)


def write_text(path: Path, text: str) -> None:
    """Replace `path` with UTF-8 `text` (see `atomic_file`)."""
    write_bytes(path, text.encode())


def json_text(obj: Any, indent: int | None = None) -> str:
    """`obj` as strict JSON.

    Raises:
        ValueError: `obj` holds NaN or an infinity (a bug upstream: inputs are validated so
            that none can arise).
    """
    return json.dumps(obj, indent=indent, allow_nan=False)


def write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Replace `path` with `obj` as strict JSON (no NaN, no infinities)."""
    write_text(path, json_text(obj, indent))


def append_line(path: Path, line: str, fsync: bool = False) -> None:
    """Append one line to `path`, never through a symlink (`O_APPEND | O_NOFOLLOW`); `fsync`:
    on disk (and its name in the folder) before returning, for a line a later file relies
    on."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, _FILE_MODE)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    if fsync:
        sync_folder(path.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OverflowError:
        return True  # not a pid this host can have: not ours to remove
    return True


def private_dir(target: Path) -> Path:
    """A new, empty folder beside `target`, ours alone: made by `mkdtemp` under a unique name
    (never an existing folder or a symlink planted under a predictable one), then opened to
    the usual permissions. Named like a temporary file, so `sweep_temporaries` knows it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target), suffix=TEMP_SUFFIX)
    os.chmod(folder, 0o777 & ~_UMASK)  # mkdtemp makes 0700
    return Path(folder)


def sweep_temporaries(folder: Path) -> int:
    """Remove the temporary files and folders in `folder` whose writer is gone (killed before
    its rename, SIGKILL: nothing ran); returns how many. Only names made by `atomic_file` or
    `private_dir` whose pid no longer exists on this host are touched; never symlinks."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = _TEMP_NAME.match(entry.name)
            if m is None or entry.is_symlink() or pid_alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
    return removed


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed in 4 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    """What changes whenever a file's content may have: size, mtime, inode and ctime (which no
    `touch -r`, `cp -p` or tar can set back)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def stored_sha256(paths: list[Path], store: Path) -> list[str]:
    """The sha256 of each file, hashed once and kept in the JSON file `store` by path and
    stamp (size, mtime, ctime, inode): a file is hashed again only once its stamp changes. An
    unreadable or foreign store is ignored and rewritten.

    Raises:
        OSError: a file cannot be read (the store is left as it was).
    """
    try:
        known = json.loads(store.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    digests, changed = [], False
    for path in paths:
        key, stamp = str(path.resolve()), _stamp(path)
        entry = known.get(key)
        if not (isinstance(entry, dict) and entry.get("stamp") == stamp):
            entry, changed = {"stamp": stamp, "sha256": sha256_file(path)}, True
            known[key] = entry
        digests.append(str(entry["sha256"]))
    if changed:
        with contextlib.suppress(OSError):  # a read-only cache hashes again next time
            store.parent.mkdir(parents=True, exist_ok=True)
            write_json(store, known)
    return digests
