"""How a worker process uses glibc's malloc: set-up hands its large temporaries back to the
system; the training loop hands back what its steps free, or keeps it for the next step.

During set-up a fixed mmap threshold of 4 MiB keeps every large block its own mapping, so the
temporaries freed after set-up go back to the system. The worker trims the heap once the
part's CSR is built (before set-up's peak) and once at the end of set-up. By default that is
all: large blocks stay mappings of their own and go back to the system when freed. With
`launch.keep_freed_memory` it then keeps what it frees: no new block gets its own mapping and
the heap's top is not trimmed, so a step's tensors reuse the previous step's pages instead of
faulting in fresh ones. Where `launch.allocator`
(launch/allocator.py) preloads jemalloc, these settings do nothing. `leo bench`'s PyG peers
make the same calls, so every system compared runs alike.

Specification: docs/design/memory.md; measurements: docs/results.md.
"""

from __future__ import annotations

from leo_cli.util.rss import glibc, hand_back_freed_memory

M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc malloc.h)
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD_BYTES = 4 << 20
NEVER_TRIM = 2**31 - 1  # the largest trim threshold mallopt's int takes (2 GiB)


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mapping.

    Call it early in a worker process. Returns True when glibc accepted the setting; on other
    C libraries it does nothing and returns False.
    """
    libc = glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def keep_freed_memory() -> bool:
    """From now on keep what is freed for the next allocation: no block gets its own mapping
    any more and the heap's top is never trimmed. Returns True when glibc accepted both
    settings; on other C libraries it does nothing and returns False.
    """
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


def after_setup(keep: bool) -> bool:
    """Hand set-up's freed memory back to the system; with `keep` (`launch.keep_freed_memory`)
    keep what the steps free from then on. Called once, just before the first step, by the
    workers and by `leo bench`'s PyG peers. Returns True when glibc accepted every setting.
    """
    handed_back = hand_back_freed_memory()
    return handed_back and (keep_freed_memory() if keep else True)
