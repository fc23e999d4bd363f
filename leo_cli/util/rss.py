"""This process's peak resident memory, as the partition stage, the workers and the bench's
peers report it."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")


def peak_rss_bytes() -> int:
    """Peak resident set of this process so far, its own: Linux's `VmHWM`, not `ru_maxrss`,
    which a process keeps from the one that exec'd it (a worker started by a launcher that
    partitioned would report the launcher's peak). `ru_maxrss` only where /proc is missing
    (macOS reports it in bytes, other systems in KiB)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
