"""The processes below a process, read from /proc (none where it is missing)."""

from __future__ import annotations

import contextlib
from pathlib import Path

_PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from each task's `children` list."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in (_PROC / str(current) / "task").iterdir():
                text = (task / "children").read_text()
                todo.extend(int(child) for child in text.split())
    return found
