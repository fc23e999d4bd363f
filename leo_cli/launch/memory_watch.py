"""The memory of a job's processes together: the launcher and every process below it (the
elastic agent's workers), sampled while they run.

Each sample sums the processes' proportional set size (`Pss` of /proc/<pid>/smaps_rollup: a
page shared by k processes counts 1/k in each, so part files mapped by every worker and
shared-memory segments count once), or their resident size where the kernel has no
smaps_rollup. The peak of the samples is `peak_rss_total_bytes` in summary.json: a sample every
`interval` seconds can miss a shorter peak. Reading a large process's smaps_rollup walks its
page tables (about 20 ms for a products-size worker), so the watch waits long enough after
each sample to spend at most 1/`COST_RATIO` of one core on sampling (at most `MAX_WAIT_S`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from leo_cli.util.procs import descendants

_PROC = Path("/proc")
COST_RATIO = 20  # seconds of waiting after a sample, at least, per CPU second it took
MAX_WAIT_S = 5.0  # but never longer than this between samples


def resident_bytes(pid: int) -> int:
    """A process's Pss (else Rss) in bytes; 0 once it is gone."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        with contextlib.suppress(OSError, ValueError):
            for line in (_PROC / str(pid) / name).read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) * 1024  # kB
    return 0


class MemoryWatch:
    """`with MemoryWatch() as watch: ...` samples this process's tree every `interval` seconds
    (or longer, see `COST_RATIO`) on a daemon thread; `watch.peak_bytes` is the largest sum
    seen (0 where /proc is absent)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leo-memory-watch", daemon=True)

    def sample(self) -> int:
        total = sum(resident_bytes(pid) for pid in descendants(os.getpid()))
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def _run(self) -> None:
        while True:
            start = time.thread_time()  # the CPU a sample costs, the kernel's reads included
            self.sample()
            took = time.thread_time() - start
            if self._stop.wait(max(self.interval, min(COST_RATIO * took, MAX_WAIT_S))):
                return

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
