"""This process's peak resident memory, as the partition stage, the workers and the bench's
peers report it; glibc's malloc, for handing freed memory back."""

from __future__ import annotations

import ctypes
import gc
import platform
import resource
import sys
from pathlib import Path
from typing import Any

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


def glibc() -> Any | None:
    """glibc, or None on other C libraries (macOS, musl, Windows)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (find_library forks)
    except OSError:
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def trim_heap() -> bool:
    """Hand every free page of the C heap back to the system now (glibc's `malloc_trim(0)`),
    without collecting garbage first. False without glibc."""
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def hand_back_freed_memory() -> bool:
    """Collect garbage, then `trim_heap`: the launcher does so once its planning is done and
    before its workers start, so that what it freed is not counted beside theirs. False
    without glibc."""
    gc.collect()
    return trim_heap()


def available_memory_bytes() -> int | None:
    """Memory this machine can give without swapping (Linux's `MemAvailable`), or None where
    /proc/meminfo does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
