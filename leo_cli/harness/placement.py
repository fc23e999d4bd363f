"""Where each worker computes: `launch.cpu_affinity`, one list of core ids per local worker.

The launcher checks the lists against this machine (`check_affinity`) and hands them to its
workers in one environment variable (`placement_env`); every rank process, training and
hardware probe alike, pins itself as its first act (`pin_rank`, from harness/process.py), before
the process group, the heartbeat or torch's thread pools start threads, which inherit the
mask. Threads already running (torch starts one at import) are pinned too. A pinned worker
gets as many intra-op threads as it has cores, unless the user set OMP_NUM_THREADS.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from leo_cli.errors import ConfigError

AFFINITY_ENV = "LEO_CPU_AFFINITY"
Affinity = list[list[int]]


def machine_cores() -> set[int]:
    """The core ids this process may run on (what the machine, or its container, offers);
    every core of the machine where the system cannot say (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def check_affinity(affinity: Affinity | None, nproc: int) -> None:
    """Refuse a placement this node cannot honour, in one sentence naming the key.

    Raises:
        ConfigError: not one core list per local worker, or a core id the machine lacks.
    """
    problem = affinity_problem(affinity, nproc)
    if problem is not None:
        raise ConfigError(problem)


def affinity_problem(affinity: Affinity | None, nproc: int) -> str | None:
    """Why this node cannot honour a placement (the sentence `check_affinity` raises), or
    None: not one core list per local worker, or a core id the machine lacks."""
    if affinity is None:
        return None
    if len(affinity) != nproc:
        return (
            f"launch.cpu_affinity lists {len(affinity)} core sets but this node starts {nproc} "
            "workers; give one list of core ids per worker."
        )
    cores = machine_cores()
    missing = sorted({c for worker in affinity for c in worker} - cores)
    if missing:
        return (
            f"launch.cpu_affinity names core {missing[0]}, which this machine does not offer "
            f"(cores {describe(cores)}); use those ids."
        )
    return None


def describe(cores: set[int]) -> str:
    """Core ids as ranges: `0-3, 6`."""
    spans: list[list[int]] = []
    for c in sorted(cores):
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def placement_env(affinity: Affinity | None, user_threads: str | None) -> str | None:
    """The value of LEO_CPU_AFFINITY for this node's workers (None: no pinning)."""
    if affinity is None:
        return None
    return json.dumps({"cores": affinity, "threads": user_threads})


def affinity_tag(affinity: Affinity | None) -> str:
    """A short name of a placement for file names ('' without one)."""
    if affinity is None:
        return ""
    return "-a" + hashlib.sha256(json.dumps(affinity).encode()).hexdigest()[:8]


def pin_rank(local_rank: int) -> list[int] | None:
    """Pin this process to its cores from LEO_CPU_AFFINITY; returns them (None: unpinned).

    Threads follow the cores (one per core) unless the user's OMP_NUM_THREADS came along.
    """
    raw = os.environ.get(AFFINITY_ENV)
    if not raw:
        return None
    placement = json.loads(raw)
    cores = [int(c) for c in placement["cores"][local_rank]]
    pin_process(cores)
    threads = placement.get("threads") or str(len(cores))
    os.environ["OMP_NUM_THREADS"] = threads
    import torch  # a rank has it already; the launcher reads AFFINITY_ENV without it

    torch.set_num_threads(int(threads))
    return cores


def pin_process(cores: list[int]) -> None:
    """Every thread of this process onto `cores` (threads started later inherit the mask)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (ProcessLookupError, FileNotFoundError):
            continue  # the thread ended meanwhile
    os.sched_setaffinity(0, cores)


def pin_from_config(affinity: Affinity | None, local_rank: int) -> None:
    """Under plain torchrun (no LEO launcher set LEO_CPU_AFFINITY) pin from the config.

    The heartbeat's thread, already running, stays unpinned (it sleeps and writes a file).
    Threads follow the cores: torchrun sets OMP_NUM_THREADS=1 itself, so a user's own
    setting cannot be told from it.

    Raises:
        ConfigError: the placement does not fit this node (`check_affinity`).
    """
    if affinity is None or os.environ.get(AFFINITY_ENV):
        return
    check_affinity(affinity, int(os.environ.get("LOCAL_WORLD_SIZE", len(affinity))))
    os.environ[AFFINITY_ENV] = placement_env(affinity, None) or ""
    pin_rank(local_rank)
