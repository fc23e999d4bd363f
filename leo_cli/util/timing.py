"""Set-up and wall time of a run: what happens before the first training step, and in all.

`setup_s` runs from the start of `leo train` to the first training step of the slowest worker,
`setup_parts_s` splits it by stage and worker step, `setup_reused_s` lists what reused outputs
cost when they were made, and `wall_s` is the whole run. The parent (`leo train`, `leo bench`)
keeps a `RunTimer` and writes `.setup.json`; rank 0 puts it, with the workers' own parts, into
summary.json; the parent adds `wall_s` once the workers have exited.

Specification: docs/design/run-files.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER_PARTS = (
    "process_group_s",
    "read_part_s",
    "choose_s",
    "graph_s",
    "levels_s",
    "aggregator_s",
    "model_s",
)


# Set by the `leo` command as it starts: this process runs one command, so a run's clock starts
# with the process (interpreter start and imports count); unset in a longer-lived process (a
# user's Python, a test) that calls the API, where a run's clock starts with the call.
_COMMAND_PROCESS = False


def started_as_command() -> None:
    """This process runs one `leo` command: runs count from the process's start."""
    global _COMMAND_PROCESS
    _COMMAND_PROCESS = True


def run_start_time() -> float:
    """When a run started: the process's start for the `leo` command, else now."""
    return process_start_time() if _COMMAND_PROCESS else time.time()


def process_start_time() -> float:
    """When this process started (wall clock), so interpreter start and imports count;
    now where /proc is missing."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime: clock ticks after boot (field 22 of stat)
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class Laps:
    """Seconds between named points, summed per name; `on_lap` sees the sums after each."""

    def __init__(self, on_lap: Callable[[dict[str, float]], None] | None = None) -> None:
        self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.on_lap = on_lap

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now
        if self.on_lap is not None:
            self.on_lap(self.seconds)


@dataclass
class RunTimer:
    """The parent's clock of one run: its start, the stages it ran, what it reused."""

    started_at: float = field(default_factory=time.time)
    parts: dict[str, float] = field(default_factory=dict)
    reused: dict[str, float] = field(default_factory=dict)
    launched_at: float | None = None

    def add(self, name: str, seconds: float, ran: bool) -> None:
        """A stage's cost: spent now (`ran`; a stage run twice counts both, as the plan made
        again for the mode `auto` chose), or spent when its reused output was made (not when
        this run ran it already: a probe made for the part weights, reused by the plan)."""
        if ran:
            self.parts[name] = round(self.parts.get(name, 0.0) + seconds, 4)
        elif name not in self.parts:
            self.reused[name] = round(seconds, 4)

    def stamp(self) -> dict[str, Any]:
        """What `.setup.json` holds for rank 0, stamped with this launch (RunDir.write_setup;
        a stale file is ignored)."""
        self.launched_at = time.time()
        return {
            "started_at": self.started_at,
            "launched_at": self.launched_at,
            "parts": self.parts,
            "reused": self.reused,
        }


def setup_summary(
    parent: dict[str, Any], worker: dict[str, float], first_step_at: float
) -> dict[str, Any]:
    """summary.json's set-up fields from the parent's stages and the workers' (max over
    ranks; `first_step_at` is the wall time the slowest rank started its first step)."""
    parts = {**parent.get("parts", {}), **worker}
    started = parent.get("started_at")
    if started is None:  # plain torchrun: only the workers' own set-up is known
        total = worker.get("worker_setup_s", 0.0)
    else:
        total = first_step_at - float(started)
        # Top-level parts (the worker parts are inside worker_setup_s); the rest is the
        # parent's own work: interpreter, imports, config, checks.
        top = sum(parent.get("parts", {}).values())
        top += worker.get("launch_s", 0.0) + worker.get("worker_setup_s", 0.0)
        parts["other_s"] = max(0.0, total - top)
    return {
        "setup_s": round(total, 4),
        "setup_parts_s": {k: round(v, 4) for k, v in parts.items()},
        "setup_reused_s": parent.get("reused", {}),
    }
