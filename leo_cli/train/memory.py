"""How a worker process asks the C allocator to hand large blocks back to the system.

glibc serves allocations above its mmap threshold (128 KiB at start) with their own `mmap`,
which `free` returns to the kernel at once. But its threshold is dynamic: freeing such a block
raises the threshold to the block's size (up to 32 MiB on 64-bit). Worker set-up frees many
large temporaries (edge-sized index arrays, sort keys), after which later large tensors come
from the brk heap instead, whose freed memory below a live allocation is never returned: a
worker then keeps the peak of its set-up resident for the whole run. Fixing the threshold
turns the dynamic adjustment off, so every block of 4 MiB or more stays its own mapping. 4 MiB,
not lower: at 1 MiB the many 1-4 MiB tensors of a training step were mapped and faulted in
afresh each step (warm epochs 3-6% slower on the 2.4M-node graph) for 0.1 GB less memory.
(`malloc_trim` after set-up was measured to give nothing beyond this.) The price is a page
fault per 4 KiB of every such block at every allocation; `launch.allocator` (train/
allocator.py) preloads jemalloc instead where the machine has it, and this glibc setting then
does nothing.
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
