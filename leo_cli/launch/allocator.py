"""The workers' memory allocator (`launch.allocator`) and what PyTorch is told of huge pages
(`launch.huge_pages`).

With `launch.keep_freed_memory`, jemalloc is told to keep freed memory (`MALLOC_CONF` with
both decays off) and reuses it without page faults; under the system's glibc malloc the
worker sets the same up itself after set-up (worker/memory.py). jemalloc is preloaded into
the workers (and the probe workers, and `leo bench`'s PyG peers, so every system compared
runs on the same allocator) through LD_PRELOAD; the launching process itself keeps its own.

Design: docs/design/memory.md; measurements: docs/results.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from leo_cli.errors import TrainError
from leo_cli.harness.process import ALLOCATOR_ENV

if TYPE_CHECKING:
    from leo_cli.config.schema import LaunchConfig

JEMALLOC_NAMES = ("libjemalloc.so.2", "libjemalloc.so")
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
RETAIN = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # keep freed pages: no faults on reuse
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")  # names of preloaded allocators
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"  # PyTorch's: advise huge pages for tensors >= 2 MiB
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Allocator:
    """What the workers get: extra environment, and a phrase for the run's summary."""

    name: str  # `jemalloc`, `system` or `user` (an allocator the user preloaded)
    described: str
    env: dict[str, str] = field(default_factory=dict)


def find_jemalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> Path | None:
    """The jemalloc shared library of this machine, or None.

    Raises:
        TrainError: LEO_JEMALLOC names a file that is not there.
    """
    named = os.environ.get("LEO_JEMALLOC")
    if named:
        if not Path(named).is_file():
            raise TrainError(
                f"LEO_JEMALLOC={named} is not a file; name the jemalloc library "
                "(e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2) or unset it."
            )
        return Path(named)
    for folder in dirs:
        for name in JEMALLOC_NAMES:
            path = Path(folder) / name
            if path.is_file():
                return path
    return None


def users_allocator(environ: Mapping[str, str]) -> str | None:
    """The allocator the user preloads (LD_PRELOAD naming one), or None."""
    preload = environ.get("LD_PRELOAD", "")
    return next((name for name in ALLOCATORS if name in preload), None)


def choose(
    setting: str, environ: Mapping[str, str], found: Path | None, keep: bool = False
) -> Allocator:
    """The allocator for `launch.allocator=setting`, given the environment and the library;
    its environment also carries its name (ALLOCATOR_ENV).

    An allocator the user preloads is theirs, whatever the setting. Otherwise jemalloc
    (`auto` where found, or `jemalloc`) goes first in LD_PRELOAD before the user's own
    libraries, with the user's MALLOC_CONF if set, else one that keeps freed memory (with
    `keep`, `launch.keep_freed_memory`; else jemalloc's default decays).

    Raises:
        TrainError: `jemalloc` asked for on a machine without it.
    """
    own = users_allocator(environ)
    if own is not None:
        return Allocator(
            "user", f"{own}, preloaded by the user (LD_PRELOAD)", {ALLOCATOR_ENV: "user"}
        )
    if setting == "jemalloc" and found is None:
        raise TrainError(
            "launch.allocator=jemalloc but no jemalloc library was found (looked in "
            f"{', '.join(LIBRARY_DIRS)}); install it (apt install libjemalloc2), name it with "
            "LEO_JEMALLOC=/path/libjemalloc.so.2, or set launch.allocator to auto or system."
        )
    if setting == "system" or found is None:
        why = (
            "launch.allocator=system"
            if setting == "system"
            else ("no jemalloc found: apt install libjemalloc2 for speed")
        )
        kept = ", freed memory kept" if keep else ""
        return Allocator("system", f"system malloc ({why}){kept}", {ALLOCATOR_ENV: "system"})
    preload = ":".join(filter(None, [str(found), environ.get("LD_PRELOAD", "")]))
    env = {"LD_PRELOAD": preload, ALLOCATOR_ENV: "jemalloc"}
    kept = ""
    if environ.get("MALLOC_CONF"):
        env["MALLOC_CONF"] = environ["MALLOC_CONF"]
    elif keep:
        env["MALLOC_CONF"], kept = RETAIN, ", freed memory kept"
    return Allocator("jemalloc", f"jemalloc ({found}){kept}", env)


def fallback_note(auto: Allocator) -> str | None:
    """The sentence `leo train` prints before workers start when `launch.allocator=auto`
    (`auto`: what it resolved to) found no jemalloc (the summary says which allocator ran;
    this says it while there is time to act)."""
    if auto.name != "system":
        return None
    return (
        "no jemalloc library on this machine, so the workers run on the system's malloc; "
        "apt install libjemalloc2 (or "
        "LEO_JEMALLOC=/path/libjemalloc.so.2) to use it."
    )


def allocator_of(setting: str, keep: bool = False) -> Allocator:
    """`choose` on this process's environment and machine."""
    return choose(setting, os.environ, find_jemalloc(), keep)


def kernel_huge_pages(path: Path = THP_MODE_FILE) -> str:
    """The kernel's transparent huge page mode: `always`, `madvise`, `never`, or `absent`
    where its setting is not found (a kernel without them, or /sys hidden)."""
    try:
        chosen = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return "absent"
    return chosen.group(1) if chosen else "absent"


def with_huge_pages(allocator: Allocator, environ: Mapping[str, str], mode: str) -> Allocator:
    """`allocator` with PyTorch told to advise transparent huge pages for every tensor of
    2 MiB or more (`launch.huge_pages`), under the kernel's mode `mode` (kernel_huge_pages;
    with none found, `absent`, PyTorch is not asked: it would warn in every worker); a
    THP_MEM_ALLOC_ENABLE the user set stands, and the phrase says whose it is."""
    env = allocator.env
    if HUGE_PAGES_ENV in environ:
        said = f"huge pages: {HUGE_PAGES_ENV}={environ[HUGE_PAGES_ENV]} set by the user"
    elif mode == "absent":
        said = "huge pages: the kernel's transparent huge page setting was not found"
    else:
        env = {**env, HUGE_PAGES_ENV: "1"}
        said = (
            "huge pages advised for tensors of 2 MiB or more"
            if mode in ("always", "madvise")
            else f"huge pages asked for, but the kernel's transparent huge pages are {mode}"
        )
    return replace(allocator, described=f"{allocator.described}, {said}", env=env)


def workers_allocator(launch: LaunchConfig) -> Allocator:
    """The allocator the workers and `leo bench`'s PyG peers run on: `launch.allocator`,
    keeping freed memory as `launch.keep_freed_memory` says, with huge pages advised as
    `launch.huge_pages` says (a THP_MEM_ALLOC_ENABLE the user set is theirs either way, and
    said)."""
    chosen = allocator_of(launch.allocator, launch.keep_freed_memory)
    if launch.huge_pages or HUGE_PAGES_ENV in os.environ:
        return with_huge_pages(chosen, os.environ, kernel_huge_pages())
    return chosen


@contextmanager
def allocator_env(allocator: Allocator) -> Iterator[None]:
    """Processes started inside get the allocator's environment; this one keeps its own
    (the variables are restored on the way out; PyTorch in this process read
    THP_MEM_ALLOC_ENABLE at its first allocation, long before)."""
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
