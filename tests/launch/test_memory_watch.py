"""The memory of a job's processes together (`peak_rss_total_bytes`): the launcher's process
tree, sampled."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from leo_cli.launch import memory_watch
from leo_cli.launch.memory_watch import MemoryWatch, resident_bytes
from leo_cli.util.procs import descendants

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


def test_a_costly_sample_spaces_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that takes t seconds of CPU is followed by at least COST_RATIO * t of waiting
    (at most MAX_WAIT_S), so sampling large processes costs a bounded share of a core."""
    times: list[float] = []

    def costly_sample(self: MemoryWatch) -> int:
        times.append(time.perf_counter())
        start = time.thread_time()
        while time.thread_time() - start < 0.01:  # 10 ms of this thread's CPU
            pass
        return 0

    monkeypatch.setattr(MemoryWatch, "sample", costly_sample)
    with MemoryWatch(interval=0.001):
        deadline = time.perf_counter() + 10
        while len(times) < 2 and time.perf_counter() < deadline:
            time.sleep(0.02)
    assert len(times) >= 2
    assert times[1] - times[0] >= memory_watch.COST_RATIO * 0.01
