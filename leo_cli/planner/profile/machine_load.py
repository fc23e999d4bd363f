"""How busy other processes kept the machine while a launch of ours ran (the hardware probe).

A probe taken while other jobs share the cores measures the machine under their load (rates
several times lower: docs/results.md); saved machine-wide, it
would price every later plan as if that load were always there. So the parent measures, over
the launch, the CPU time the whole machine spent busy (/proc/stat) less the CPU time of this
process, its reaped children and every living process below it (its workers, the server they
were forked from, launch/preload.py): what remains is other processes' work.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from types import TracebackType

from leo_cli.planner.profile.hardware import ProbeLoad
from leo_cli.util.procs import descendants

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (not idle, iowait)


def machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot, or None without /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    return sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process, of its children that have been waited for, and of every
    living process below it (workers forked from a server are its grandchildren) with the
    children each has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total + sum(process_cpu_s(pid) for pid in living_descendants())


def living_descendants() -> list[int]:
    """The processes below this one that have not been waited for."""
    return descendants(os.getpid())[1:]


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a process and of the children it has waited for (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime .. cstime


class LoadMeter:
    """`with LoadMeter() as m: <launch>`; then `m.result()` describes the other load."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), machine_busy_s(), own_cpu_s())
        self._end = self._start

    def __enter__(self) -> LoadMeter:
        self._start = (time.monotonic(), machine_busy_s(), own_cpu_s())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end = (time.monotonic(), machine_busy_s(), own_cpu_s())

    def result(self) -> ProbeLoad:
        """Cores other processes kept busy on average, and the 1-minute load average."""
        (t0, busy0, own0), (t1, busy1, own1) = self._start, self._end
        other = None
        if busy0 is not None and busy1 is not None and t1 > t0:
            other = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0), 3)
        return ProbeLoad(
            load_avg_1m=round(os.getloadavg()[0], 3),
            other_cpu=other,
            num_cpus=os.cpu_count() or 1,
        )
