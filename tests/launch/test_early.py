"""The workers' server started as a run begins (launch/early.py): in the environment the last
run with the same key gave its server, kept by the `preload` stage where that is the workers'
environment still, replaced where it is not, and nothing started without a record of its own."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import pytest

from leo_cli.config import LeoConfig, load_config
from leo_cli.launch import early, elastic, preload

pytestmark = pytest.mark.integration  # starts servers that import torch


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[forkserver.ForkServer]:
    """A server of this test's own, stopped at its end."""
    server = forkserver.ForkServer()
    monkeypatch.setattr(forkserver, "_forkserver", server)
    monkeypatch.setattr(preload, "_server", None)
    yield server
    preload.stop(server)


def workers(cfg: LeoConfig) -> elastic.Workers:
    """As the checks stage works them out, on CPU."""
    return elastic.Workers(elastic.workers_per_node(cfg), False, elastic.worker_module(cfg))


def run(cfg: LeoConfig, cache: Path, mark: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A run's two steps: as it begins, and at its `preload` stage (where set-up has changed
    the environment: `mark`); the server's pid and environment after each."""
    seen: list[object] = []
    with early.server(cfg, cache):
        seen += [preload.server_pid(), preload.held_environment()]
        monkeypatch.setenv("LEO_TEST_MARK", mark)
        elastic.start_early(cfg, workers(cfg), cache)
        seen += [preload.server_pid(), preload.held_environment()]
    monkeypatch.delenv("LEO_TEST_MARK")
    return seen


def restart(server: forkserver.ForkServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a new process would begin: no server."""
    preload.stop(server)
    monkeypatch.setattr(preload, "_server", None)


def test_a_run_starts_the_server_its_last_run_wrote_down_and_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: forkserver.ForkServer
) -> None:
    cfg = load_config(None, ["partition.num_parts=2"])
    cache = tmp_path / "cache"
    first = run(cfg, cache, "a", monkeypatch)
    assert first[:2] == [None, None]  # nothing written down yet: started at `preload`
    env = first[3]
    assert isinstance(env, tuple) and env[0]["LEO_TEST_MARK"] == "a"
    assert len(list((cache / early.FOLDER).glob("*.json"))) == 1

    restart(fresh, monkeypatch)
    second = run(cfg, cache, "a", monkeypatch)
    assert second[0] is not None and second[1] == env  # started as the run began
    assert second[2] == second[0] and second[3] == env  # and kept: the same environment

    restart(fresh, monkeypatch)
    third = run(cfg, cache, "b", monkeypatch)  # set-up now gives the workers another one
    assert third[0] is not None and third[1] == env
    assert third[2] != third[0]  # replaced: no worker forks in the written-down environment
    assert isinstance(third[3], tuple) and third[3][0]["LEO_TEST_MARK"] == "b"


def test_no_server_without_a_record_of_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: forkserver.ForkServer
) -> None:
    cfg = load_config(None, ["partition.num_parts=2"])
    cache = tmp_path / "cache"
    run(cfg, cache, "a", monkeypatch)
    for other in (
        load_config(None, ["partition.num_parts=3"]),  # other workers
        load_config(None, ["partition.num_parts=2", "launch.allocator=system"]),
    ):
        restart(fresh, monkeypatch)
        with early.server(other, cache):
            assert preload.server_pid() is None
    restart(fresh, monkeypatch)
    monkeypatch.setenv("LEO_TEST_OTHER", "1")  # another environment to begin in
    with early.server(cfg, cache):
        assert preload.server_pid() is None
    monkeypatch.delenv("LEO_TEST_OTHER")
    for record in (cache / early.FOLDER).glob("*.json"):
        record.write_text('{"set": [')  # unreadable: nothing started, nothing said
    with early.server(cfg, cache):
        assert preload.server_pid() is None


def test_a_run_outside_early_server_writes_nothing_down(
    tmp_path: Path, fresh: forkserver.ForkServer
) -> None:
    """`leo bench`'s runs and direct launches start their server at `preload` as before."""
    cfg = load_config(None, ["partition.num_parts=2"])
    elastic.start_early(cfg, workers(cfg), tmp_path)
    assert preload.server_pid() is not None
    assert not (tmp_path / early.FOLDER).exists()
