"""How a worker process asks the C allocator to hand large blocks back to the system.

Under glibc's malloc, a fixed mmap threshold of 4 MiB keeps every large block its own mapping,
so the large temporaries freed after set-up go back to the system instead of the set-up's peak
staying resident for the whole run. Where `launch.allocator` (launch/allocator.py) preloads
jemalloc, this setting does nothing.

Specification: docs/design/memory.md; measurements: docs/results.md.
"""

from __future__ import annotations

import ctypes
import platform

M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
MMAP_THRESHOLD_BYTES = 4 << 20


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mapping, for good.

    Call it early in a worker process. Returns True when glibc accepted the setting; on other
    C libraries (macOS, musl, Windows) it does nothing and returns False.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt  # glibc's soname (find_library forks)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
