"""TensorBoard event files (`run.tensorboard`): the numbers of metrics.jsonl, read back with
TensorBoard's own reader; a resumed run replaces the dead attempt's later epochs; a missing
package is refused before anything starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import TrainedRun
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from leo_cli.errors import ConfigError, TrainError
from leo_cli.launch.launcher import check_tensorboard
from leo_cli.run_dir import RunDir
from leo_cli.worker.board import Board


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    tags = events.Tags()["scalars"]
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags}


def test_every_number_of_a_row_is_a_scalar_at_its_epoch(tmp_path: Path) -> None:
    board = Board(tmp_path, start=0)
    for epoch in (1, 2):
        row = {"epoch": epoch, "loss": 1.0 / epoch, "test_acc": None, "cold": epoch == 1}
        board.add_row({**row, "rank_step_s": [0.1, 0.2], "wait_s": float("nan"), "mode": "leo"})
    board.close()
    got = scalars(tmp_path)
    assert set(got) == {"loss"}  # no None, bool, list, NaN or text; the epoch is the step
    assert got["loss"] == [(1, 1.0), (2, 0.5)]


@pytest.mark.parametrize("checkpoint", [0, 1])
def test_a_resumed_run_replaces_the_epochs_after_its_checkpoint(
    tmp_path: Path, checkpoint: int
) -> None:
    board = Board(tmp_path, start=0)
    for epoch in (1, 2, 3):
        board.add_row({"epoch": epoch, "loss": float(epoch)})
    board.close()
    resumed = Board(tmp_path, start=checkpoint)  # 0: died before its first checkpoint
    for epoch in range(checkpoint + 1, 4):
        resumed.add_row({"epoch": epoch, "loss": 10.0 * epoch})
    resumed.close()
    kept = [(e, float(e)) for e in range(1, checkpoint + 1)]
    assert scalars(tmp_path)["loss"] == kept + [(e, 10.0 * e) for e in range(checkpoint + 1, 4)]


def test_without_the_package_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    check_tensorboard(False)
    check_tensorboard(True)  # installed with the dev extra
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r"run.tensorboard=true needs the tensorboard package"):
        check_tensorboard(True)


def test_rank_0_without_the_package_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(TrainError, match=r"needs the tensorboard package: pip install"):
        Board(tmp_path, start=0)


@pytest.mark.integration
def test_leo_train_writes_rank_0s_events(trained_run: TrainedRun) -> None:
    """The session's trained run: 2 workers, run.tensorboard=true, evaluation every epoch."""
    assert "run.tensorboard=true" in trained_run.settings
    epochs = 6  # the trained run's (tests/conftest.py), every one of them an event
    assert len(RunDir(trained_run.folder).read_metrics()) == epochs
    got = scalars(trained_run.folder / "tensorboard")
    assert [step for step, _ in got["loss"]] == list(range(1, epochs + 1))
    assert [step for step, _ in got["val_acc"]] == list(range(1, epochs + 1))
