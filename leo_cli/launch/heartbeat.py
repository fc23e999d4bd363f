"""Heartbeats: every worker touches `.heartbeat/rank_<r>` (holding its pid) each second; the
launcher kills its own workers whose file stops changing, and names them.

A stalled worker (SIGSTOP, a debugger, a hang holding the GIL) otherwise ends a job late: its
peers' collectives time out after `launch.timeout_s`, then the elastic agent sends it SIGTERM
and waits 30 s before SIGKILL, and a stopped process never handles SIGTERM.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from pathlib import Path
from types import TracebackType

from leo_cli.harness.process import BEAT_S, HEARTBEATS
from leo_cli.launch.preload import server_pid

MIN_STALL_S = 5.0  # a few missed beats, so that scheduling jitter never kills a live worker


def beats(run_dir: Path) -> dict[Path, float]:
    """Heartbeat file -> modification time (files may vanish while we look)."""
    out = {}
    for path in (run_dir / HEARTBEATS).glob("rank_*"):
        with contextlib.suppress(FileNotFoundError):
            out[path] = path.stat().st_mtime
    return out


def rank_of(path: Path) -> int:
    return int(path.name.split("_")[1])


def is_own_child(pid: int) -> bool:
    """Only this process's workers may be killed: the folder may be shared between nodes, and
    a file of an earlier attempt holds a pid that may now belong to anything. Workers forked
    from this process's server (launch/preload.py) are its children."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    parent = int(stat.rsplit(")", 1)[1].split()[1])  # field 4
    return parent in (os.getpid(), server_pid())


class HeartbeatWatch:
    """While open, SIGKILL this node's workers whose heartbeat stops for `timeout_s`.

    Staleness is measured on this process's clock (when a file last changed as seen here), so
    clocks of other hosts sharing the folder do not matter. Files present before the watch
    starts (an earlier attempt's) count only once they change.
    """

    def __init__(self, run_dir: Path, timeout_s: float) -> None:
        self.run_dir = run_dir
        self.timeout_s = max(timeout_s, MIN_STALL_S)
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="leo-watch")

    def __enter__(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        # path -> (mtime, monotonic time it was last seen changing); inf: never stale.
        seen = {path: (mtime, math.inf) for path, mtime in beats(self.run_dir).items()}
        while not self._stop.wait(BEAT_S / 2):
            now = time.monotonic()
            for path, mtime in beats(self.run_dir).items():
                last = seen.get(path)
                if last is None or last[0] != mtime:
                    seen[path] = (mtime, now)
                elif now - last[1] > self.timeout_s and self._kill(path):
                    seen[path] = (mtime, math.inf)

    def _kill(self, path: Path) -> bool:
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False  # being rewritten by a restarted worker
        if not is_own_child(pid):
            return False
        os.kill(pid, signal.SIGKILL)  # a stopped process cannot handle SIGTERM
        self.killed.append(rank_of(path))
        return True


def stalled_ranks(run_dir: Path, timeout_s: float) -> list[int]:
    """Ranks whose heartbeat stopped well before the others' (stopped, not crashed); catches
    a stall on another node, whose own launcher killed the worker."""
    found = beats(run_dir)
    if not found:
        return []
    newest = max(found.values())
    return sorted(rank_of(p) for p, t in found.items() if newest - t > min(timeout_s / 2, 10.0))
