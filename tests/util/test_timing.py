"""Set-up accounting: the parent's stages, the workers' parts, and what belongs to a launch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from leo_cli.models.optim import Adam
from leo_cli.run_dir import RunDir
from leo_cli.util import timing
from leo_cli.util.timing import RunTimer, process_start_time, setup_summary

WORKER = {"launch_s": 2.0, "worker_setup_s": 3.0, "process_group_s": 1.0, "levels_s": 1.5}


IMPORTED = time.time()  # this process started before it imported this file


def test_process_start_is_before_now() -> None:
    assert IMPORTED - 3600 < process_start_time() <= IMPORTED


def test_a_run_counts_from_the_process_start_only_under_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run the API starts in a longer-lived process (a user's Python, a test) counts from
    the call; the `leo` command's from the process's start (its imports count)."""
    before = time.time()
    assert timing.run_start_time() >= before
    monkeypatch.setattr(timing, "_COMMAND_PROCESS", False)
    timing.started_as_command()
    assert timing.run_start_time() == process_start_time() <= IMPORTED


def test_setup_spans_start_to_first_step_and_splits_into_stages(tmp_path: Path) -> None:
    timer = RunTimer(started_at=100.0)
    timer.add("partition_s", 4.0, ran=True)
    timer.add("plan_s", 7.5, ran=False)  # a reused plan: its cost when it was made
    RunDir(tmp_path).write_setup(timer.stamp())
    setup = setup_summary(RunDir(tmp_path).read_setup(timer.launched_at), WORKER, 112.0)
    assert setup["setup_s"] == 12.0
    parts = setup["setup_parts_s"]
    assert parts["partition_s"] == 4.0 and "plan_s" not in parts
    assert parts["other_s"] == pytest.approx(12.0 - 4.0 - 2.0 - 3.0)
    assert setup["setup_reused_s"] == {"plan_s": 7.5}


def test_a_stage_run_twice_counts_both() -> None:
    """`auto` chose a mode that reads other rows in place: the plan is made again for it."""
    timer = RunTimer(started_at=100.0)
    timer.add("plan_s", 1.5, ran=True)
    timer.add("plan_s", 0.75, ran=True)
    timer.add("plan_s", 9.0, ran=False)  # reused after being made here: not counted again
    assert timer.parts == {"plan_s": 2.25} and timer.reused == {}


def test_a_stale_parent_file_is_ignored(tmp_path: Path) -> None:
    timer = RunTimer(started_at=100.0)
    RunDir(tmp_path).write_setup(timer.stamp())
    assert RunDir(tmp_path).read_setup(None) == {}  # plain torchrun: no launcher
    assert RunDir(tmp_path).read_setup(timer.launched_at + 1) == {}  # another launch wrote it
    setup = setup_summary({}, WORKER, 112.0)
    assert setup["setup_s"] == 3.0 and setup["setup_reused_s"] == {}


def test_busy_time_is_the_step_less_the_steps_own_waits(tmp_path: Path) -> None:
    """Rows exchanged while evaluating after the step are not waits of the step: a rank that
    waited 0.25 s of a 1 s step is busy 0.75 s, however long its evaluation waited."""
    import json
    from types import SimpleNamespace
    from typing import Any, cast

    import torch

    from leo_cli.comm.dist import DistEnv
    from leo_cli.comm.exchange import CommStats
    from leo_cli.config import load_config
    from leo_cli.worker.trainer import Trainer

    stats = CommStats()
    model = torch.nn.Linear(2, 2)

    def step(seed: int, epoch: int) -> tuple[float, dict[str, float]]:
        stats.wait_s += 0.25
        return 1.0, {"step_s": 1.0}

    def correct_counts() -> torch.Tensor:
        stats.wait_s += 5.0  # the evaluation's forward pass waits for a slower peer
        return torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)

    job = SimpleNamespace(
        graph=SimpleNamespace(aggregator=SimpleNamespace(stats=stats)),
        step=step,
        correct_counts=correct_counts,
        model=model,
        optimizer=Adam(model.parameters(), lr=0.1),
    )
    # A trainer around the stand-in job, as its constructor would leave it on rank 0.
    trainer = Trainer.__new__(Trainer)
    trainer.job = cast(Any, job)
    trainer.cfg = load_config(None, ["train.num_epochs=1"])
    trainer.env, trainer.run, trainer.start = DistEnv(0, 1, 0, 0), RunDir(tmp_path), 0
    trainer.extras, trainer.board = {}, None
    trainer.train()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rank_busy_s"] == [pytest.approx(0.75)] and row["rank_step_s"] == [1.0]
    assert row["val_acc"] == 0.5  # the evaluation ran, its wait not the step's
