"""The memory of a job's processes together (`peak_rss_total_bytes`): the launcher's process
tree, sampled."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from leo_cli.launch.memory_watch import MemoryWatch, descendants, resident_bytes

HOLD_200_MB = (
    "b = bytearray(200 << 20); import sys, time; print('ready', flush=True); time.sleep(30)"
)


def test_a_child_and_its_memory_are_counted() -> None:
    mine = resident_bytes(os.getpid())
    assert mine > 10e6
    child = subprocess.Popen([sys.executable, "-c", HOLD_200_MB], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert child.pid in descendants(os.getpid())
        with MemoryWatch(interval=0.05) as watch:
            time.sleep(0.3)
        assert watch.peak_bytes > mine + 200e6 * 0.9
    finally:
        child.kill()
        child.wait()
    assert resident_bytes(child.pid) == 0  # gone: nothing to count
    assert child.pid not in descendants(os.getpid())
