"""Ports for the tests' launches (`launch.master_port`, the rank harness's MASTER_PORT) that no
other process is handed between the test choosing one and its launch binding it.

A port the kernel hands out to `bind(0)` is free when it is handed out, then released; before
the launch binds it, another pytest process (xdist runs two; other suites may run on the
machine) could get the same one, and any process's outgoing connection (gloo's, between ranks)
could take it as its own end. So a port comes from outside the kernel's ephemeral range
(`ip_local_port_range`), where no outgoing connection gets one, and is claimed with a lock on
a file named after it (`flock`, released by the kernel when the claiming process ends) that
every process taking ports here honours; it must also be bindable when claimed. A process keeps
its claims for its life: the ports it was given are never handed to another process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

CLAIMS = Path(tempfile.gettempdir()) / "leo-test-ports"
LOWEST = 10000  # below: ports services commonly listen on
_MIN_SPAN = 2000  # fewer ports than this outside the ephemeral range: use the whole range

_held: list[int] = []  # this process's claims (open, locked files)
_order: list[int] = []  # the ports still to try, in this process's order


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral ports (first, last), Linux's default where it cannot be read."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def candidates() -> range:
    """The ports handed out: below the ephemeral range, else above it, else (a machine whose
    ephemeral range covers nearly every port) all of them, the claims alone protecting them."""
    low, high = ephemeral_range()
    if low - LOWEST >= _MIN_SPAN:
        return range(LOWEST, low)
    if 65536 - (high + 1) >= _MIN_SPAN:
        return range(high + 1, 65536)
    return range(LOWEST, 65536)


def _claim(port: int) -> bool:
    """Lock `port`'s claim file for this process and check nobody listens on it."""
    if not CLAIMS.is_dir():
        CLAIMS.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # its owner's process does it
            CLAIMS.chmod(0o1777)  # every user's test runs claim here (sticky, as /tmp)
    fd = os.open(CLAIMS / str(port), os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another process holds it
        os.close(fd)
        return False
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every address: what a launch's store binds
        except OSError:  # in use by something that takes no claims
            os.close(fd)
            return False
    _held.append(fd)
    return True


def free_port() -> int:
    """A port no other process is handed (see the module's docstring), for this process's
    life."""
    if not _order:
        ports = list(candidates())
        random.Random(os.getpid()).shuffle(ports)  # two processes rarely try the same ones
        _order.extend(ports)
    while _order:
        port = _order.pop()
        if _claim(port):
            return port
    raise RuntimeError(f"no free port left in {candidates()} (claims under {CLAIMS})")
