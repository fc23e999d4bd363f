"""Column slabs for the CPU SpMM: how many feature columns of x one pass gathers.

A CSR SpMM gathers one row of x per edge, in the order of the graph's columns. When x is
larger than the last-level cache most gathers come from DRAM; cut into column slabs that each
fit a share of the cache, the same gathers hit the cache. `slab_width` picks the widest slab
that fits (all columns when x fits already), and only for a process that has the cache to
itself: with several workers on a host, slabs measured slower (docs/results.md).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

# Share of the last-level cache one slab of x may take (the rest holds the CSR's streamed
# indices and values, the output rows and other processes' data).
CACHE_SHARE = 0.2
# Narrowest slab: 32 bytes of float32 (4 columns measured slower than no slabs at all).
MIN_SLAB = 8
_FALLBACK_CACHE_BYTES = 32 << 20
_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def last_level_cache_bytes() -> int:
    """Size of CPU 0's largest cache (sysfs), or 32 MiB where sysfs does not say."""
    sizes = [_parse_size(f.read_text()) for f in _CACHE_DIR.glob("index*/size") if f.is_file()]
    known = [s for s in sizes if s > 0]
    return max(known) if known else _FALLBACK_CACHE_BYTES


@functools.cache
def sharing_processes() -> int:
    """Processes that share this host's cache: its workers (torchrun's LOCAL_WORLD_SIZE; 1
    outside a launch). Workers time-sliced on fewer cores still evict each other's lines.
    Emulated nodes (`launch.emulate`) each count their own workers only."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def _parse_size(text: str) -> int:
    """Bytes of a sysfs cache size ("32768K", "1M", "512"); 0 when unreadable."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    return int(digits) * scale if digits.isdigit() else 0


def slab_width(num_rows: int, width: int, itemsize: int, shared: bool | None = None) -> int:
    """Columns per slab for gathering from an x of `num_rows` x `width`: `width` when other
    processes share the cache (`shared`; None: `sharing_processes` decides), when x fits
    CACHE_SHARE of it, or when no divisor of `width` of at least MIN_SLAB columns fits; else
    the widest such divisor whose slab fits."""
    budget = CACHE_SHARE * last_level_cache_bytes()
    if shared is None:
        shared = sharing_processes() > 1
    if shared or num_rows * width * itemsize <= budget:
        return width
    fitting = [
        w for w in range(MIN_SLAB, width, 1) if width % w == 0 and num_rows * w * itemsize <= budget
    ]
    return max(fitting, default=width)
