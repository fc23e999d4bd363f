"""CPU workers fork from one server per launching process (launch/preload.py): each sees its
own launch's environment, the server is started again where that environment changed, exit
codes reach the agent, and workers that may use a GPU still start by spawn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from leo_cli.comm.segments import JOB_ENV
from leo_cli.config import load_config
from leo_cli.errors import TrainError
from leo_cli.launch import elastic, preload

WORKER = "tests.helpers.env_worker"


def launched(tmp_path: Path, name: str, code: int = 0) -> list[dict[str, object]]:
    """Launch WORKER on 2 CPU workers; what each saw, and the job the launch named."""
    out = tmp_path / name
    out.mkdir()
    cfg = load_config(None, ["partition.num_parts=2", "launch.device=cpu",
                             f"run.out_dir={tmp_path / 'run'}"])  # fmt: skip
    try:
        elastic.launch_module(cfg, tmp_path / "run", WORKER, [str(out), str(code)])
    finally:
        seen = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    for s in seen:
        s["launch_job"] = os.environ[JOB_ENV]
    return seen


@pytest.mark.integration
def test_workers_fork_from_one_server_and_see_their_launchs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEO_TEST_MARK", "a")
    first, second = launched(tmp_path, "first"), launched(tmp_path, "second")
    monkeypatch.setenv("LEO_TEST_MARK", "b")
    third = launched(tmp_path, "third")
    for seen in (first, second, third):
        assert sorted(s["rank"] for s in seen) == ["0", "1"]
        assert all(s["job"] == s["launch_job"] and s["argv"][1] == "0" for s in seen)
        assert all(s["ppid"] != os.getpid() and not s["cli"] for s in seen)
    assert first[0]["job"] != second[0]["job"]  # each launch's own
    servers = [{s["ppid"] for s in seen} for seen in (first, second, third)]
    assert servers[0] == servers[1] and len(servers[0]) == 1  # one server, reused
    assert servers[2] != servers[0]  # another environment: another server
    assert [s["mark"] for s in first + third] == ["a", "a", "b", "b"]


@pytest.mark.integration
def test_a_workers_exit_code_fails_the_launch(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="exit"):
        launched(tmp_path, "failing", code=3)


@pytest.mark.integration
def test_workers_that_may_use_a_gpu_start_by_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preload, "forks_workers", lambda cfg: False)
    seen = launched(tmp_path, "spawned")
    assert {s["ppid"] for s in seen} == {os.getpid()}  # the agent's own children
    assert all(s["job"] == s["launch_job"] for s in seen)
