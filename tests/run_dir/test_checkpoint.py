"""Checkpoints: a corrupt newest one falls back to the one before it, saying so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ended_pid

from leo_cli.errors import TrainError
from leo_cli.models.optim import Adam
from leo_cli.run_dir import RunDir
from leo_cli.util.interrupt import Interrupted


def saved_state(epoch: int) -> dict[str, Any]:
    """What the worker saves: the model's and the optimizer's state dicts."""
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.fill_(float(epoch))
    opt = Adam(model.parameters())  # the workers' (torch's makes its first test import dynamo)
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def save_two(run_dir: Path) -> list[Path]:
    for epoch in (2, 4):
        RunDir(run_dir).save_checkpoint(epoch, saved_state(epoch))
    return [path for _, path in RunDir(run_dir).list_checkpoints()]


def test_corrupt_newest_falls_back_to_older(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older, newest = save_two(tmp_path)
    newest.write_bytes(newest.read_bytes()[:100])  # a copy cut short
    state = RunDir(tmp_path).load_latest()
    assert state is not None and state["epoch"] == 2
    assert torch.equal(state["model"]["weight"], torch.full((1, 3), 2.0))
    err = capsys.readouterr().err
    assert f"warning: checkpoint {newest} cannot be read" in err and older.name in err
    assert len(err.strip().splitlines()) == 1


def test_no_readable_checkpoint_is_one_sentence(tmp_path: Path) -> None:
    for path in save_two(tmp_path):
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="No checkpoint in .* can be read") as info:
        RunDir(tmp_path).load_latest()
    assert "\n" not in str(info.value) and "without --resume" in str(info.value)


def test_no_checkpoint_is_none(tmp_path: Path) -> None:
    assert RunDir(tmp_path).load_latest() is None


@pytest.mark.parametrize(
    ("ending", "nnodes", "swept"),
    [
        (Interrupted(15), 1, True),
        (TrainError("worker 1 failed"), 1, True),
        (None, 1, True),  # the run finished
        (Interrupted(15), 2, False),  # a folder shared by machines: their writers are not ours
    ],
)
def test_launcher_sweeps_a_checkpoint_cut_by_a_signal(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ending: BaseException | None,
    nnodes: int,
    swept: bool,
) -> None:
    """A worker killed in the middle of a save leaves its temporary file (nothing of its own
    runs); the launcher removes it once the workers are gone, and only a dead writer's."""
    from leo_cli.config import load_config
    from leo_cli.launch import elastic

    folder = RunDir(tmp_path).checkpoints
    folder.mkdir()
    cut = folder / f".epoch_000003.pt.{ended_pid()}-abc123.tmp"
    live = folder / f".epoch_000004.pt.{os.getpid()}-def456.tmp"
    huge = folder / ".epoch_000005.pt.99999999999999999999-a.tmp"  # no pid: left alone
    for path in (cut, live, huge):
        path.write_bytes(b"\0" * 64)

    def launched(*_: Any) -> None:
        if ending is not None:
            raise ending

    monkeypatch.setattr(elastic, "launch_module", launched)
    cfg = load_config(None, [f"launch.nnodes={nnodes}"])
    if ending is None:
        elastic.run_workers(cfg, tmp_path, resume=False)
    else:
        with pytest.raises(type(ending)):
            elastic.run_workers(cfg, tmp_path, resume=False)
    assert cut.exists() != swept and live.exists() and huge.exists()
