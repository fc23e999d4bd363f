"""Shared-memory segments never outlive their job: names say whose they are, the launcher
removes its job's, and every `leo train` start removes those whose creator is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.ranks import spawn_ranks
from torch.distributed.elastic.multiprocessing import SignalException

from leo_cli.comm import segments
from leo_cli.config import load_config
from leo_cli.launch import elastic, preload
from leo_cli.util.interrupt import Interrupted


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(segments, "SHM_DIR", tmp_path)
    return tmp_path


def segment(root: Path, name: str, num_bytes: int = 1 << 16) -> Path:
    path = root / name
    with path.open("wb") as f:
        os.posix_fallocate(f.fileno(), 0, num_bytes)
    return path


def test_name_carries_creator_start_time_and_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(segments.JOB_ENV, "abc123")
    name = segments.segment_name().name
    pid, start, job = name.split("-")[1:4]
    assert int(pid) == os.getpid() and int(start) == segments.start_time(os.getpid())
    assert job == "abc123" and segments.job_of(name) == "abc123"
    assert not segments.creator_gone(name)


def test_sweep_removes_segments_of_ended_creators_only(shm: Path) -> None:
    gone = dead_pid()
    stale = segment(shm, f"leo-{gone}-123-abc-0123456789ab")
    stale_old_format = segment(shm, f"leo-{gone}-0123456789ab")
    reused_pid = segment(shm, f"leo-{os.getpid()}-1-abc-0123456789ab")  # another start time
    live = segments.segment_name()
    live.write_bytes(b"x")
    foreign = segment(shm, "other-file")
    (shm / f"leo-{gone}-1-abc-ffffffffffff").symlink_to(foreign)
    freed = segments.sweep_stale()
    assert freed.count == 3 and freed.num_bytes >= 3 << 16
    assert not stale.exists() and not stale_old_format.exists() and not reused_pid.exists()
    assert live.exists() and foreign.exists()
    assert "removed 3 shared-memory segments" in segments.describe(freed)


def test_launcher_removes_its_jobs_segments_when_interrupted(
    shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 killed between creating a segment and unlinking it: the launcher cleans up
    however the job ends (here: SIGTERM, which the elastic agent turns into SignalException)."""
    other_job = segment(shm, f"leo-{os.getpid()}-0-otherjob-0123456789ab")

    def agent(config: object, entrypoint: str) -> object:
        def run(*args: str) -> None:
            signal.signal(signal.SIGTERM, lambda *a: None)  # the agent's, left installed
            segments.segment_name().write_bytes(b"x")  # a worker's, named with LEO_JOB
            raise SignalException("got SIGTERM", sigval=signal.SIGTERM)

        return run

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    monkeypatch.setattr(elastic, "elastic_launch", agent)
    monkeypatch.setattr(preload, "ensure_server", lambda module: None)  # no agent, no workers
    cfg = load_config(None, [f"run.out_dir={tmp_path}"])
    saved = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(Interrupted) as info:
            elastic.launch_module(cfg, tmp_path, "leo_cli.worker.entry", [])
        assert signal.getsignal(signal.SIGTERM) is mine  # ours again after the launch
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert info.value.exit_code == 143
    assert [p.name for p in shm.glob("leo-*")] == [other_job.name]


def _map_with_rank_1_failing(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    from leo_cli.comm import shm
    from leo_cli.errors import TrainError

    dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 1:

        def refused(*args: object, **kwargs: object) -> object:
            raise RuntimeError("unable to mmap 64 bytes: Permission denied\ndetail")

        torch.from_file = refused  # type: ignore[assignment]
    try:
        shm.open_segment(16, torch.float32)
    except TrainError as exc:
        return str(exc)
    return "mapped"


@pytest.mark.dist
def test_a_segment_one_worker_cannot_map_stops_every_worker_with_its_reason() -> None:
    """Not rank 0 waiting in a barrier until launch.timeout_s names the wrong cause."""
    got = spawn_ranks(_map_with_rank_1_failing, 2, limit_s=60)
    for sentence in got:
        assert isinstance(sentence, str), sentence
        assert sentence.startswith("workers [1] cannot map the shared /dev/shm segment"), sentence
        assert "Permission denied" in sentence and "pipeline.mode=leo" in sentence
        assert "\n" not in sentence
