"""CPU workers fork from one server per launching process (launch/preload.py): each runs as
`python -m` would run it (its launch's environment, working directory and threads, a session
of its own, the launching script not run again), the server is started again where the
environment changed, exit codes and tracebacks reach the launcher, and spawn still works."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from leo_cli.comm.segments import JOB_ENV
from leo_cli.config import load_config
from leo_cli.errors import TrainError
from leo_cli.launch import elastic, preload

pytestmark = pytest.mark.integration  # starts worker processes

WORKER = "tests.helpers.env_worker"
ROOT = Path(__file__).resolve().parents[2]


def launched(tmp_path: Path, name: str, code: str = "0") -> list[dict[str, object]]:
    """Launch WORKER on 2 CPU workers; what each saw, and the job the launch named."""
    out = tmp_path / name
    out.mkdir()
    cfg = load_config(None, ["partition.num_parts=2", f"run.out_dir={tmp_path / 'run'}"])
    try:
        elastic.launch_module(cfg, tmp_path / "run", WORKER, [str(out), code])
    finally:
        seen = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    for s in seen:
        s["launch_job"] = os.environ[JOB_ENV]
    return seen


def test_workers_fork_from_one_server_and_run_as_their_launch_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(os.fspath(ROOT))  # WORKER imports from any working directory
    monkeypatch.setenv("LEO_TEST_MARK", "a")
    threads = int(elastic.worker_threads(2))
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads + 1))  # the server's; not the workers'
    assert preload.ensure_server(WORKER)
    first, second = launched(tmp_path, "first"), launched(tmp_path, "second")
    monkeypatch.setenv("LEO_TEST_MARK", "b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    third = launched(tmp_path, "third")
    for seen in (first, second, third):
        assert sorted(s["rank"] for s in seen) == ["0", "1"]
        assert all(s["job"] == s["launch_job"] and s["argv"][1] == "0" for s in seen)
        assert all(s["ppid"] != os.getpid() and not s["cli"] for s in seen)
        assert all(s["sid"] == s["pid"] for s in seen)  # a session of its own
        assert all(s["threads"] == threads for s in seen)
        assert all(s["frozen"] > 0 for s in seen)  # the server's imports: never collected
        assert all(s["drawing"] for s in seen)  # curves.png's Figure and Agg: the server's
    assert first[0]["job"] != second[0]["job"]  # each launch's own
    servers = [{s["ppid"] for s in seen} for seen in (first, second, third)]
    assert servers[0] == servers[1] and len(servers[0]) == 1  # one server, reused
    assert servers[2] != servers[0]  # another environment: another server
    assert [s["mark"] for s in first + third] == ["a", "a", "b", "b"]
    assert {s["cwd"] for s in first} == {os.fspath(ROOT)}
    assert {s["cwd"] for s in third} == {os.fspath(elsewhere)}


def test_a_matplotlib_that_fails_to_import_leaves_the_server_starting_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown MPLBACKEND makes importing matplotlib raise (not an ImportError, which the
    server's preload would pass over): the workers start all the same, without it."""
    monkeypatch.syspath_prepend(os.fspath(ROOT))
    monkeypatch.setenv("MPLBACKEND", "no-such-backend")
    seen = launched(tmp_path, "workers")
    assert sorted(s["rank"] for s in seen) == ["0", "1"]
    assert not any(s["drawing"] for s in seen)


def test_a_workers_exit_code_and_traceback_reach_the_launcher(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="exit"):
        launched(tmp_path, "failing", code="3")
    with pytest.raises(TrainError):
        launched(tmp_path, "raising", code="raise")
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "logs").rglob("stderr.log"))
    assert "RuntimeError: a worker's own error" in logs and "Traceback" in logs


def test_workers_of_a_cuda_torch_start_by_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preload, "forks_workers", lambda: False)
    seen = launched(tmp_path, "spawned")
    assert {s["ppid"] for s in seen} == {os.getpid()}  # the agent's own children
    assert all(s["job"] == s["launch_job"] for s in seen)


SCRIPT = """
from pathlib import Path
from leo_cli.config import load_config
from leo_cli.launch import elastic

runs = Path({out!r}, "script_runs")
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
cfg = load_config(None, ["partition.num_parts=2", "run.out_dir={out}/run"])
elastic.launch_module(cfg, Path({out!r}, "run"), "tests.helpers.env_worker", [{out!r}, "0"])
"""


def test_a_launching_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """A user's script calling the API at its top level is not run again in each worker."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(out=os.fspath(tmp_path))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.fspath(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, os.fspath(script)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "script_runs").read_text() == "run\n"
    assert len(list(tmp_path.glob("*.json"))) == 2


def _sleep() -> None:
    time.sleep(60)


def test_a_busy_server_started_by_something_else_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopping another's server waits for its children: workers start by spawn instead."""
    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    monkeypatch.setattr(preload, "_server", None)
    child = multiprocessing.get_context("forkserver").Process(target=_sleep, daemon=True)
    child.start()
    try:
        assert not preload.ensure_server(WORKER)
        assert preload.entry_point(WORKER, [])[2] == "spawn"
    finally:
        child.kill()
        child.join()
        forkserver._forkserver._stop()  # type: ignore[attr-defined]


def test_a_server_started_by_something_else_in_place_of_ours_is_not_taken_for_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """multiprocessing keeps one forkserver per process: one something else started after
    ours stopped (in its own environment) is replaced, not reused as if it were ours."""
    monkeypatch.setattr(preload, "_server", None)
    monkeypatch.setenv("LEO_TEST_MARK", "ours")
    server = forkserver._forkserver  # type: ignore[attr-defined]
    try:
        assert preload.ensure_server(WORKER)
        ours = preload.server_pid()
        preload.stop(server)  # not waiting for its imports
        monkeypatch.setenv("LEO_TEST_MARK", "theirs")
        multiprocessing.set_forkserver_preload([])
        server.ensure_running()
        theirs = server._forkserver_pid
        assert theirs not in (None, ours)
        monkeypatch.setenv("LEO_TEST_MARK", "ours")
        assert preload.ensure_server(WORKER)
        assert preload.server_pid() not in (None, theirs)
    finally:
        preload.stop(server)


def test_a_kept_server_keeps_the_imports_it_was_started_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A launch asking for fewer modules keeps the server, whose record still lists every
    module it imported: a later launch asking for them again keeps it too."""
    monkeypatch.setattr(preload, "_server", None)
    server = forkserver._forkserver  # type: ignore[attr-defined]
    try:
        assert preload.ensure_server(WORKER)
        first = preload.server_pid()
        assert preload.ensure_server()
        assert preload.ensure_server(WORKER)
        assert preload.server_pid() == first
        held = preload.held_environment()
        assert held is not None and WORKER in held[1]
    finally:
        preload.stop(server)
