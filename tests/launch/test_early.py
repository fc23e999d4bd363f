"""The workers' server started as a run begins (launch/early.py): in the environment the last
run with the same key gave its server, kept by the `preload` stage where that is the workers'
environment still, replaced where it is not, and nothing started without a record of its own."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import pytest

from leo_cli.config import LeoConfig, load_config
from leo_cli.launch import early, elastic, preload

pytestmark = pytest.mark.integration  # starts servers that import torch
BEGAN_THREADS = os.environ.get("OMP_NUM_THREADS")


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[forkserver.ForkServer]:
    """A server of this test's own, stopped at its end."""
    server = forkserver.ForkServer()
    monkeypatch.setattr(forkserver, "_forkserver", server)
    monkeypatch.setattr(preload, "_server", None)
    began_threads(monkeypatch)  # and put back after: a launch sets them for good
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
    """As a new process would begin: no server, the threads it began with (a launch sets
    them for its workers)."""
    preload.stop(server)
    monkeypatch.setattr(preload, "_server", None)
    began_threads(monkeypatch)


def began_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    if BEGAN_THREADS is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", BEGAN_THREADS)


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


def test_no_early_server_where_the_cpu_library_it_loads_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: forkserver.ForkServer
) -> None:
    """A server importing LEO without the library would keep the reference kernels while
    the `preload` stage builds the library again in the same folder."""
    library = tmp_path / "kernels" / "cpu-1" / "_leo_cpu.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    monkeypatch.setenv("LEO_CPU_KERNELS_DIR", str(library.parent))
    cfg = load_config(None, ["partition.num_parts=2"])
    cache = tmp_path / "cache"
    run(cfg, cache, "a", monkeypatch)
    record = json.loads(next((cache / early.FOLDER).glob("*.json")).read_text())
    assert record["requires"] == [str(library)]
    restart(fresh, monkeypatch)
    library.unlink()
    with early.server(cfg, cache):
        assert preload.server_pid() is None


def test_the_key_follows_the_threads_and_not_the_shells_bookkeeping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_config(None, ["partition.num_parts=2"])
    key = early._key(cfg, early._environment())
    monkeypatch.setenv("OLDPWD", "/elsewhere")  # a `cd` between two runs
    monkeypatch.setenv("_", "/usr/bin/time")
    assert early._key(cfg, early._environment()) == key
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the workers' threads follow the user's
    assert early._key(cfg, early._environment()) != key


def test_the_key_follows_what_the_server_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, ["partition.num_parts=2"])
    key = early._key(cfg, early._environment())
    monkeypatch.setattr(preload, "PRELOAD", (*preload.PRELOAD, "torch._dynamo"))
    assert early._key(cfg, early._environment()) != key  # an older record's imports: not kept


def test_a_run_that_fails_before_its_workers_stops_the_server_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: forkserver.ForkServer
) -> None:
    cfg = load_config(None, ["partition.num_parts=2"])
    cache = tmp_path / "cache"
    run(cfg, cache, "a", monkeypatch)
    restart(fresh, monkeypatch)
    started = []
    with pytest.raises(RuntimeError), early.server(cfg, cache):
        started.append(preload.server_pid())
        raise RuntimeError("refused by a check")
    assert started[0] is not None and preload.server_pid() is None
    assert not alive(started[0])


def alive(pid: int) -> bool:
    """Whether `pid` runs still (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
