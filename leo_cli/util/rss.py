"""This process's peak resident memory, as the partition stage, the workers and the bench's
peers report it."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """Peak resident set of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
