"""The workers' memory allocator (`launch.allocator`).

With glibc's malloc a worker gives large freed blocks back to the system and pages them in
again at its next allocation: on this repository's CPU machine (2 cores, default bench graph,
3 workers) rank 0 took 51,700 page faults per step, 93 ms of kernel time in a 0.22 s step.
jemalloc told to keep freed memory (`MALLOC_CONF` with both decays off) reuses it: the same
steps ran 1.7-2x faster, with the same losses. It is preloaded into the workers (and the probe
workers, and `leo bench`'s PyG peers, so every system compared runs on the same allocator)
through LD_PRELOAD; the launching process itself keeps its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from leo_cli.errors import TrainError

JEMALLOC_NAMES = ("libjemalloc.so.2", "libjemalloc.so")
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/opt/homebrew/lib",
)
RETAIN = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # keep freed pages: no faults on reuse
USER_KEYS = ("LD_PRELOAD", "MALLOC_CONF")
NAME_ENV = "LEO_ALLOCATOR"  # the allocator's name, for the probe workers to record


@dataclass(frozen=True)
class Allocator:
    """What the workers get: extra environment, and a phrase for the run's summary."""

    name: str  # `jemalloc`, `system` or `user` (the user's own LD_PRELOAD / MALLOC_CONF)
    described: str
    env: dict[str, str] = field(default_factory=dict)


def find_jemalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> Path | None:
    """The jemalloc shared library of this machine (LEO_JEMALLOC names one), or None."""
    named = os.environ.get("LEO_JEMALLOC")
    if named:
        return Path(named) if Path(named).is_file() else None
    for folder in dirs:
        for name in JEMALLOC_NAMES:
            path = Path(folder) / name
            if path.is_file():
                return path
    return None


def choose(setting: str, environ: Mapping[str, str], found: Path | None) -> Allocator:
    """`_choose`, with the allocator's name in the environment it gives."""
    allocator = _choose(setting, environ, found)
    return Allocator(
        allocator.name, allocator.described, {**allocator.env, NAME_ENV: allocator.name}
    )


def _choose(setting: str, environ: Mapping[str, str], found: Path | None) -> Allocator:
    """The allocator for `launch.allocator=setting`, given the environment and the library.

    Raises:
        TrainError: `jemalloc` asked for on a machine without it.
    """
    if setting == "jemalloc" and found is None:
        raise TrainError(
            "launch.allocator=jemalloc but no jemalloc library was found (looked in "
            f"{', '.join(LIBRARY_DIRS)}); install it (apt install libjemalloc2), name it with "
            "LEO_JEMALLOC=/path/libjemalloc.so.2, or set launch.allocator to auto or system."
        )
    if setting == "system":
        return Allocator("system", "system malloc (launch.allocator=system)")
    own = [key for key in USER_KEYS if environ.get(key)]
    if own:
        return Allocator("user", f"as set by the user ({', '.join(own)})")
    if found is None:
        return Allocator(
            "system", "system malloc (no jemalloc found: apt install libjemalloc2 for speed)"
        )
    return Allocator(
        "jemalloc", f"jemalloc ({found}), freed memory kept",
        {"LD_PRELOAD": str(found), "MALLOC_CONF": RETAIN},
    )  # fmt: skip


def allocator_of(setting: str) -> Allocator:
    """`choose` on this process's environment and machine."""
    return choose(setting, os.environ, find_jemalloc())


@contextmanager
def allocator_env(allocator: Allocator) -> Iterator[None]:
    """Processes started inside get the allocator's environment; this one keeps its own
    (the variables are restored on the way out)."""
    saved = {key: os.environ.get(key) for key in allocator.env}
    os.environ.update(allocator.env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
