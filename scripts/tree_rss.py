"""Run a command and report the peak memory of its whole process tree.

Usage: python scripts/tree_rss.py CMD [ARGS ...]

Every 0.2 s sums, over the command and all its descendants, the resident set (Rss) and its
anonymous part (RssAnon: memory no file backs, what the OOM killer weighs; mapped files such
as memory-mapped partition files count in Rss but not here) from /proc/<pid>/status, and
prints the peaks of both sums after the command ends. Sampling can miss spikes under 0.2 s.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += children(p)
    return pids


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    proc = subprocess.Popen(sys.argv[1:])
    peak_rss = peak_anon = 0
    t0 = time.perf_counter()
    while proc.poll() is None:
        pids = tree(proc.pid)
        peak_rss = max(peak_rss, sum(status_kb(p, "VmRSS") for p in pids))
        peak_anon = max(peak_anon, sum(status_kb(p, "RssAnon") for p in pids))
        time.sleep(0.2)
    print(
        f"exit {proc.returncode}; {time.perf_counter() - t0:.1f} s; peak tree RSS "
        f"{peak_rss * 1024 / 1e9:.2f} GB; peak tree RssAnon {peak_anon * 1024 / 1e9:.2f} GB",
        file=sys.stderr,
    )
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
