"""Names of the shared-memory segments in /dev/shm, and removing the ones no job uses.

A segment a killed worker leaves behind holds its RAM until reboot, so every name says whose it
is (`leo-<creator pid>-<creator start time>-<job>-<random>`): the launcher removes its job's
segments when the job ends, and `sweep_stale` (at every `leo train` start) those whose creator
is gone. Only regular files owned by this user are ever removed.

Specification: docs/design/published-rows.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
JOB_ENV = "LEO_JOB"
NO_JOB = "x"  # workers started by plain torchrun, without a launcher of ours
_NAME = re.compile(
    r"^leo-(?P<pid>\d+)-(?:(?P<start>\d+)-(?P<job>[0-9a-z]+)-)?(?P<random>[0-9a-f]+)$"
)


@dataclass(frozen=True)
class Freed:
    """What a clean-up removed: files and the bytes of memory they held."""

    count: int = 0
    num_bytes: int = 0


def new_job() -> str:
    """A token naming one launch's segments (lower-case hex)."""
    return uuid.uuid4().hex[:12]


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of the whole line


def free_bytes(root: Path | None = None) -> int | None:
    """Bytes a new segment can still take in /dev/shm (None where it cannot be asked)."""
    try:
        st = os.statvfs(root or SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def segment_name(root: Path | None = None) -> Path:
    """A new, unique segment path for this process, in the current job (in /dev/shm)."""
    pid = os.getpid()
    job = os.environ.get(JOB_ENV, NO_JOB)
    if not re.fullmatch(r"[0-9a-z]+", job):
        job = NO_JOB
    name = f"leo-{pid}-{start_time(pid) or 0}-{job}-{uuid.uuid4().hex[:12]}"
    return (root or SHM_DIR) / name


def create_segment(num_bytes: int) -> str:
    """A new file of num_bytes reserved (zero-filled) bytes in /dev/shm, named by
    `segment_name`; "!reason" when that fails (callers gather every worker's answer)."""
    path = str(segment_name())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(num_bytes, 1))
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return f"!{exc.strerror or exc}"
    return path


def creator_gone(name: str) -> bool:
    """Whether the process that created segment `name` has ended (False: not a LEO name)."""
    m = _NAME.match(name)
    if m is None:
        return False
    pid = int(m.group("pid"))
    started = start_time(pid)
    if started is None:
        return True
    recorded = m.group("start")
    return recorded is not None and recorded != "0" and int(recorded) != started


def job_of(name: str) -> str | None:
    """The job token in a segment's name (None for other files and older names)."""
    m = _NAME.match(name)
    return None if m is None else m.group("job")


def _remove(path: Path) -> int:
    """Unlink a regular file of ours; the bytes of memory it held (0 when not removed)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return -1
        path.unlink()
    except OSError:
        return -1
    return st.st_blocks * 512


def _sweep(root: Path | None, wanted: str | None) -> Freed:
    count = total = 0
    with contextlib.suppress(OSError):
        for path in (root or SHM_DIR).glob("leo-*"):
            name = path.name
            match = job_of(name) == wanted if wanted is not None else creator_gone(name)
            if not match:
                continue
            freed = _remove(path)
            if freed >= 0:
                count, total = count + 1, total + freed
    return Freed(count, total)


def sweep_stale(root: Path | None = None) -> Freed:
    """Remove every LEO segment whose creator has ended (any job, any earlier run)."""
    return _sweep(root, None)


def remove_job(job: str, root: Path | None = None) -> Freed:
    """Remove every segment of one job (its workers have all ended)."""
    return _sweep(root, job)


def describe(freed: Freed, root: Path | None = None) -> str:
    """One sentence for the terminal."""
    plural = "s" if freed.count != 1 else ""
    return (
        f"removed {freed.count} shared-memory segment{plural} left in {root or SHM_DIR} by "
        f"ended LEO jobs ({freed.num_bytes / 2**20:.1f} MiB freed)."
    )
