"""The best-validation model (`checkpoints/best.pt`) after a resume: a best model of an epoch
the dead attempt trained past the checkpoint goes, replaced by the kept checkpoint of the best
epoch before it."""

from __future__ import annotations

from pathlib import Path

import torch

from leo_cli.run_dir import RunDir
from leo_cli.worker.checkpoint import keep_best_of


def model(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2,), value)}


def row(epoch: int, val: float) -> dict[str, float]:
    return {"epoch": epoch, "loss": 1.0, "train_acc": 0.5, "val_acc": val, "test_acc": val / 2}


def test_a_dead_attempts_best_model_is_replaced_by_the_kept_checkpoint(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for e, val in ((1, 0.2), (2, 0.6), (3, 0.4)):  # metrics as cut back to the checkpoint
        run.append_metrics(row(e, val))
    for e in (2, 3):
        run.save_checkpoint(e, {"model": model(e), "optimizer": {"param_groups": []}})
    run.save_best(5, {"val_acc": 0.9}, model(5.0))  # epoch 5 of the attempt that died
    assert keep_best_of(run, start=3) == 0.6
    best = run.read_best()
    assert best["epoch"] == 2 and best["val_acc"] == 0.6
    assert torch.equal(best["model"]["w"], model(2.0)["w"])


def test_a_best_model_within_the_kept_epochs_stays(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.append_metrics(row(1, 0.7))
    run.save_best(1, {"val_acc": 0.7}, model(1.0))
    assert keep_best_of(run, start=1) == 0.7
    assert run.read_best()["epoch"] == 1
    assert keep_best_of(RunDir(tmp_path / "fresh"), start=0) is None


def test_an_unreadable_kept_checkpoint_leaves_no_best_model(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for e, val in ((1, 0.2), (2, 0.6)):
        run.append_metrics(row(e, val))
    path = run.save_checkpoint(2, {"model": model(2), "optimizer": {"param_groups": []}})
    path.write_bytes(b"not a checkpoint")
    run.save_best(5, {"val_acc": 0.9}, model(5.0))  # the dead attempt's
    assert keep_best_of(run, start=2) == 0.6
    assert not run.best.is_file()
