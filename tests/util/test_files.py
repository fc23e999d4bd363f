"""Safe run-file writes: unique temporary files, never through a symlink, nothing left behind
on failure, no NaN in JSON; and the real writers of the run folder use them."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from leo_cli.config import LeoConfig, write_resolved
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.run_dir import RunDir
from leo_cli.util import files


def plant(link: Path, victim: Path) -> None:
    """A symlink at `link` pointing at `victim` (which holds something to protect)."""
    victim.write_text("precious")
    link.symlink_to(victim)


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_write_replaces_a_symlink_at_the_destination(tmp_path: Path) -> None:
    plant(tmp_path / "out.json", tmp_path / "victim")
    files.write_json(tmp_path / "out.json", {"a": 1})
    assert (tmp_path / "victim").read_text() == "precious"
    assert not (tmp_path / "out.json").is_symlink()
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}


def test_failed_write_leaves_old_content_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), files.atomic_file(path, "w") as f:
        f.write("half")
        raise RuntimeError("interrupted mid-write")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        files.write_text(tmp_path / "folder", "x")
    assert sorted(os.listdir(tmp_path)) == ["folder", "out.txt"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_json_never_holds_nan(tmp_path: Path, value: float) -> None:
    with pytest.raises(ValueError, match="JSON"):
        files.write_json(tmp_path / "summary.json", {"predicted_epoch_time_s": value})
    assert os.listdir(tmp_path) == []


def test_append_never_follows_a_symlink(tmp_path: Path) -> None:
    plant(tmp_path / "metrics.jsonl", tmp_path / "victim")
    with pytest.raises(OSError):
        RunDir(tmp_path).append_metrics({"epoch": 1, "loss": 1.0})
    assert (tmp_path / "victim").read_text() == "precious"


def test_sweep_removes_temporaries_of_dead_writers_only(tmp_path: Path) -> None:
    dead = tmp_path / f".plan.json.{dead_pid()}-abc123.tmp"
    alive = tmp_path / f".plan.json.{os.getpid()}-abc123.tmp"
    other = tmp_path / "notes.tmp"
    for path in (dead, alive, other):
        path.write_text("x")
    (tmp_path / f".link.{dead_pid()}-x.tmp").symlink_to(other)
    folder = files.private_dir(tmp_path / "partitions")  # a writer's folder, this pid: kept
    dead_folder = tmp_path / f".partitions.{dead_pid()}-abc.tmp"
    (dead_folder / "part_0").mkdir(parents=True)
    assert files.sweep_temporaries(tmp_path) == 2
    assert not dead.exists() and not dead_folder.exists()
    assert alive.exists() and other.exists() and folder.is_dir()


def test_resolved_config_is_not_written_through_a_planted_symlink(tmp_path: Path) -> None:
    """The old fixed name `resolved_config.yaml.tmp` was opened without O_EXCL/O_NOFOLLOW."""
    plant(tmp_path / "resolved_config.yaml.tmp", tmp_path / "victim")
    cfg = LeoConfig.model_validate({"run": {"out_dir": str(tmp_path)}})
    write_resolved(cfg)
    assert (tmp_path / "victim").read_text() == "precious"
    assert "out_dir" in (tmp_path / "resolved_config.yaml").read_text()


def test_hardware_cache_is_not_written_through_a_planted_symlink(
    tmp_path: Path, hw_profile: HardwareProfile
) -> None:
    """The machine-wide cache may be shared: a pid-named temporary file there is guessable."""
    path = tmp_path / "host-p3.json"
    plant(path.with_name(f".{path.name}.tmp-{os.getpid()}"), tmp_path / "victim")
    hw_profile.write(path)
    assert (tmp_path / "victim").read_text() == "precious"
    assert HardwareProfile.read(path) == hw_profile


def test_checkpoint_is_not_written_through_a_planted_symlink(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    plant(folder / f".epoch_000002.pt.tmp-{os.getpid()}", tmp_path / "victim")
    RunDir(tmp_path).save_checkpoint(2, {"model": {}, "optimizer": {"param_groups": []}})
    assert (tmp_path / "victim").read_text() == "precious"
    assert [p.name for p in folder.iterdir() if not p.is_symlink()] == ["epoch_000002.pt"]


def test_a_synced_file_also_syncs_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with files.atomic_file(tmp_path / "a.pt", fsync=True) as f:
        f.write(b"x")
    assert synced == ["file", "folder"]  # the data, then the name renamed into the folder
    with files.atomic_file(tmp_path / "b.json", "w") as f:
        f.write("{}")
    assert synced == ["file", "folder"]  # run files without fsync sync nothing


def test_stored_digests_are_hashed_once_and_again_after_an_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's sha256 is kept by its stamp: read again only once its content may have
    changed, an edit that puts size and mtime back included (its ctime moves)."""

    hashed: list[str] = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: (hashed.append(p.name), real(p))[1])
    data, store = tmp_path / "graph.bin", tmp_path / "cache" / "digests.json"
    data.write_bytes(b"abcd")
    first = files.stored_sha256([data], store)
    assert files.stored_sha256([data], store) == first and hashed == ["graph.bin"]
    st = data.stat()
    data.write_bytes(b"abce")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert files.stored_sha256([data], store) != first and len(hashed) == 2
    store.write_text("[not a store")
    assert files.stored_sha256([data], store) == [real(data)]
