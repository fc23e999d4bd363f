"""Emulated nodes run as root in folders others may write: their logs are never opened through
a link, their configs come from the cluster's private folder, Python never imports a package
planted in the current folder, and what a killed run left is swept at the next start (unit
tests: no namespaces are made here)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from leo_cli.comm import segments
from leo_cli.config.schema import EmulateConfig
from leo_cli.launch import emulate, nodes
from leo_cli.run_dir import RunDir


def test_a_log_planted_as_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    run = tmp_path / "run"
    RunDir(run).emulate.mkdir(parents=True)
    (RunDir(run).emulate / "node_1.log").symlink_to(target)
    with nodes.node_folder(run).new_file("node_1.log") as log:
        log.write("node 1 says hello\n")
    assert target.read_text() == "keep me"
    assert (RunDir(run).emulate / "node_1.log").read_text() == "node 1 says hello\n"
    assert not (RunDir(run).emulate / "node_1.log").is_symlink()


def test_a_planted_emulate_folder_link_is_replaced(tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).emulate.symlink_to(elsewhere)
    folder = nodes.node_folder(run).path
    assert folder.is_dir() and not folder.is_symlink() and not any(elsewhere.iterdir())


def test_a_link_swapped_in_for_the_folder_after_it_opened_redirects_nothing(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    run = tmp_path / "run"
    folder = nodes.node_folder(run)
    folder.path.rename(tmp_path / "moved")  # someone swaps the opened folder for a link
    folder.path.symlink_to(elsewhere)
    with folder.new_file("node_1.log") as log:
        log.write("hello\n")
    folder.close()
    assert not any(elsewhere.iterdir())
    assert (tmp_path / "moved" / "node_1.log").read_text() == "hello\n"


@pytest.mark.integration  # starts interpreters
@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH needs Python 3.11")
def test_nodes_never_import_a_package_planted_in_the_current_folder(tmp_path: Path) -> None:
    planted = tmp_path / "leo_cli"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    env = nodes.own_package_env(dict(os.environ))
    done = subprocess.run(
        [sys.executable, "-c", "import leo_cli; print(leo_cli.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(done.stdout.strip()).parent == nodes.PACKAGE_ROOT / "leo_cli"
    subprocess.run(
        [sys.executable, "-m", "leo_cli", "--help"], cwd=tmp_path, env=env, capture_output=True,
        check=False, timeout=120,
    )  # fmt: skip
    assert not (tmp_path / "ran").exists()


def test_a_leftover_cluster_folder_does_not_stop_the_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folder left under this cluster's name (same pid and start time after a restart) is
    no FileExistsError: each cluster's folder has a random part."""
    monkeypatch.setattr(emulate, "run", lambda *argv: None)  # no namespaces made here
    monkeypatch.setattr(emulate, "namespaces", lambda: [])
    c = emulate.Cluster(EmulateConfig(nodes=2))
    leftover = Path(tempfile.gettempdir()) / c.switch
    leftover.mkdir(exist_ok=True)
    try:
        c.up()
        assert c.folder.name.startswith(f"{c.switch}-") and (c.folder / "hosts").is_file()
        assert oct(c.folder.stat().st_mode & 0o777) == "0o700"
    finally:
        c.down()
        leftover.rmdir()
    assert not c.folder.exists()


def test_a_killed_clusters_folder_is_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulate, "namespaces", lambda: [])
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    folder = Path(tempfile.mkdtemp(prefix=f"{emulate.PREFIX}-{dead.pid}-1-sw-"))
    emulate.sweep()
    assert not folder.exists()


def test_every_train_start_sweeps_what_killed_emulated_runs_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from leo_cli.cli import common

    monkeypatch.setattr(emulate, "sweep", lambda: 3)
    monkeypatch.setattr(segments, "sweep_stale", lambda: segments.Freed(2, 3 << 20))
    common.sweep_segments()
    out = " ".join(capsys.readouterr().out.split())
    assert "removed 3 network namespaces of emulated nodes a killed run left behind" in out
    assert "Note: removed 2 shared-memory segments left in /dev/shm by ended LEO jobs" in out
    assert "(3.0 MiB freed)" in out


def test_emulation_is_refused_where_python_cannot_keep_the_current_folder_off_the_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from leo_cli.config import load_config
    from leo_cli.errors import ConfigError

    monkeypatch.setattr(nodes.sys, "version_info", (3, 10, 14))
    cfg = load_config(None, ["launch.emulate={nodes: 2}"])
    with pytest.raises(ConfigError, match="needs Python 3.11 or later"):
        nodes.run_nodes(cfg, "train", [])
