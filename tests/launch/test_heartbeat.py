"""The launcher's heartbeat watch kills its own stalled workers, and nothing else."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from leo_cli.launch import heartbeat
from leo_cli.launch.heartbeat import HeartbeatWatch

pytestmark = pytest.mark.integration  # stand-in workers (`sleep`) it watches and kills


def test_watch_kills_only_own_stalled_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeat, "MIN_STALL_S", 0.0)
    folder = tmp_path / ".heartbeat"
    folder.mkdir()
    old, stalled = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    (folder / "rank_2").write_text(f"{old.pid}\n")  # an earlier attempt's file, never touched
    try:
        with HeartbeatWatch(tmp_path, timeout_s=1.0) as watch:
            time.sleep(0.6)
            (folder / "rank_0").write_text(f"{stalled.pid}\n")  # a child whose beats stop
            (folder / "rank_1").write_text(f"{os.getppid()}\n")  # not a child of ours
            deadline = time.monotonic() + 10
            while stalled.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.5)
        assert stalled.poll() == -9 and watch.killed == [0]
        assert old.poll() is None
    finally:
        for p in (old, stalled):
            p.kill()
            p.wait()
