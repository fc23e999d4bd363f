"""Rank 0's epoch files written behind the epoch loop (worker/records.py): in order, without
the loop waiting for them, from copies of what the epoch had, and a failed write raised."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from leo_cli.config import load_config
from leo_cli.launch.setup import prepare
from leo_cli.run_dir import KEEP_CHECKPOINTS, RunDir, checkpoint_digest
from leo_cli.worker.records import EpochWriter, snapshot


def test_tasks_run_in_order_behind_put_and_close_waits_for_them() -> None:
    writer, done, release = EpochWriter(), [], threading.Event()
    writer.put(lambda: release.wait(10) and done.append(1))
    writer.put(lambda: done.append(2))
    assert done == []  # put returned while the first write still waits
    release.set()
    writer.close()
    assert done == [1, 2]


def test_a_failed_write_stops_the_later_ones_and_is_raised() -> None:
    writer, done = EpochWriter(), []

    def fail() -> None:
        raise OSError("disk full")

    writer.put(fail)
    writer.put(lambda: done.append("checkpoint"))
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert done == []

    writer = EpochWriter()
    writer.put(fail)
    with pytest.raises(OSError, match="disk full"):  # by a put once the thread has failed
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            writer.put(lambda: None)
            time.sleep(0.01)
    writer.close()  # raised once


def test_a_snapshot_keeps_the_state_of_when_it_was_taken() -> None:
    model = torch.nn.Linear(3, 2)
    moment = torch.zeros(2, 3)
    state = snapshot({"model": model.state_dict(), "optimizer": {"state": {0: {"m": moment}}}})
    before = [t.clone() for t in (*state["model"].values(), state["optimizer"]["state"][0]["m"])]
    with torch.no_grad():  # training's in-place updates of parameters and moments
        model.weight.add_(1.0)
        moment.add_(1.0)
    after = [*state["model"].values(), state["optimizer"]["state"][0]["m"]]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not torch.equal(model.weight, state["model"]["weight"])


@pytest.mark.slow
def test_the_epoch_loop_goes_on_while_a_checkpoint_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 2's step starts while epoch 1's checkpoint waits on the disk; the run's rows,
    best model and checkpoints are all there at the end, of their own epochs."""
    from leo_cli.comm.dist import DistEnv
    from leo_cli.worker.trainer import Trainer, WorkerArgs

    cfg = load_config(None, [f"run.out_dir={tmp_path / 'run'}", "data.synthetic.num_nodes=200",
                             "data.synthetic.num_features=8", "model.hidden_channels=8",
                             "train.num_epochs=3", "train.checkpoint_every=1",
                             "partition.num_parts=1"])  # fmt: skip
    run_dir = prepare(cfg, resume=False, progress=None)
    stepped = threading.Event()
    waited: list[bool] = []
    save = RunDir.save_checkpoint

    def slow_save(self: RunDir, epoch: int, state: dict[str, object]) -> Path:
        if epoch == 1:
            waited.append(stepped.wait(10))  # released by epoch 2's step, if it starts
        return save(self, epoch, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", slow_save)
    job = Trainer(WorkerArgs(run_dir), DistEnv(0, 1, 0, 0, local_world_size=1))
    step = job.job.step

    def watched(seed: int, epoch: int) -> tuple[float, dict[str, float]]:
        if epoch == 2:
            stepped.set()
        return step(seed, epoch)

    job.job.step = watched  # type: ignore[method-assign]
    job.train()
    assert waited == [True]
    run = RunDir(run_dir)
    rows = run.read_metrics()
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    kept = dict(run.list_checkpoints())
    assert sorted(kept) == [1, 2, 3][-KEEP_CHECKPOINTS:]
    for r in rows:  # each kept checkpoint holds what its own epoch's row recorded
        if r["epoch"] in kept:
            state = run.read_recorded(kept[r["epoch"]])
            assert checkpoint_digest(state).hex() == r["checkpoint_sha256"]
    assert run.read_best()["epoch"] in (1, 2, 3)
