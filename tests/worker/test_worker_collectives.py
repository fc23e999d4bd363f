"""The worker's collectives on the process group LEO builds, and its start-up cross-checks.

No GPU here: a gloo group with the device map LEO builds for CUDA, gloo standing in for NCCL,
refuses tensors of a device that map does not serve exactly as NCCL would.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from torch.distributed.distributed_c10d import Backend, BackendConfig

from leo_cli.comm.dist import DistEnv, pick_backend
from leo_cli.comm.exchange import HaloPlan
from leo_cli.config import load_config
from leo_cli.errors import TrainError
from leo_cli.launch.setup import prepare
from leo_cli.run_dir import RunDir
from leo_cli.worker import agree, trainer
from leo_cli.worker.trainer import Trainer, WorkerArgs

pytestmark = pytest.mark.dist

CUDA = torch.device("cuda", 0)


def served_as_on_cuda(backend: str) -> str:
    """The device map `pick_backend` gives on CUDA, with gloo in place of NCCL."""
    return str(BackendConfig(Backend(pick_backend(CUDA, backend)))).replace("nccl", "gloo")


@pytest.mark.parametrize("backend", ["auto", "nccl", "gloo"])
def test_cuda_group_serves_cpu_tensors(backend: str) -> None:
    assert served_as_on_cuda(backend) == "cpu:gloo,cuda:gloo"
    assert pick_backend(torch.device("cpu"), "auto") == "gloo"


def _worker_as_on_cuda(rank: int, world: int, run_dir: Path) -> int:
    trainer.pick_backend = lambda device, backend: served_as_on_cuda(backend)  # type: ignore[assignment]
    env = DistEnv(rank, world, rank, 0, local_world_size=world)
    job = Trainer(WorkerArgs(run_dir), env)
    job.train()
    job.finish()
    return 0


@pytest.mark.parametrize("mode", ["blocking", "leo", "fine-grained", "shared-memory"])
def test_whole_worker_runs_on_the_cuda_device_map(tmp_path: Path, mode: str) -> None:
    """Every collective of a run (start-up checks, loss, gradients, halo exchange and the
    mode's set-up, evaluation, epoch statistics, final barrier) on the group a CUDA run gets."""
    cfg = load_config(
        None,
        [
            f"pipeline.mode={mode}",
            f"run.out_dir={tmp_path / 'run'}",
            "data.synthetic.num_nodes=300",
            "data.synthetic.num_features=8",
            "model.hidden_channels=8",
            "train.num_epochs=2",
            "launch.timeout_s=30",
        ],
    )
    run_dir = prepare(cfg, resume=False, progress=None)
    assert spawn_ranks(_worker_as_on_cuda, 2, run_dir) == [0, 0]
    assert [r["epoch"] for r in RunDir(run_dir).read_metrics()] == [1, 2]


SEND = [[0, 3], [5, 0]]  # rank r sends SEND[r][q] rows to q
RECV = [[0, 5], [3, 0]]  # ... and expects RECV[r][q] from q
SAME = [bytes(range(32))] * 2  # the digests of the checkpoint each rank loaded
CASES = {
    "consistent": (SEND, RECV, ["a" * 64, "a" * 64], SAME),
    "counts": (SEND, [[0, 5], [4, 0]], ["a" * 64, "a" * 64], SAME),
    "config": (SEND, RECV, ["a" * 64, "b" * 64], SAME),
    "checkpoint": (SEND, RECV, ["a" * 64, "a" * 64], [bytes(range(32)), bytes(32)]),
}


def _cross_check(rank: int, world: int) -> dict[str, str]:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    out = {}
    for name, (send, recv, digests, loaded) in CASES.items():
        plan = HaloPlan(0, torch.zeros(0, dtype=torch.int64), send[rank], recv[rank])
        try:
            agree.check_consistent(plan, digests[rank], start=4, loaded=loaded[rank])
            out[name] = "ok"
        except TrainError as exc:
            out[name] = str(exc)
    return out


def test_ranks_cross_check_halo_counts_and_configs() -> None:
    for got in spawn_ranks(_cross_check, 2):
        assert not isinstance(got, Exception), got
        assert got["consistent"] == "ok"
        sentence = "rank 0 sends 3 halo rows to rank 1 but rank 1 expects 4 from rank 0"
        assert sentence in got["counts"]
        assert "ranks [1] were started with another config than rank 0" in got["config"]
        assert "ranks [1] loaded another checkpoint of epoch 4 than rank 0" in got["checkpoint"]


def _epoch_stats(rank: int, world: int) -> dict[str, object]:
    from leo_cli.worker.step import epoch_stats

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    times = {"step_s": 1.0 + rank, "allreduce_s": 0.25, "loss_sync_s": 0.25}
    return epoch_stats(times, 0.1 * (rank + 1), 0.2 * (rank + 1), 100 + rank, 10 * rank, 7)


def test_epoch_stats_over_ranks_from_one_gather() -> None:
    """The slowest step, mean and longest waits, summed bytes and every rank's step and busy
    time (the step less its waits), the same on every rank."""
    got = spawn_ranks(_epoch_stats, 2)
    assert got[0] == got[1]
    row = got[0]
    assert row["epoch_time_s"] == 2.0 and row["rank_step_s"] == [1.0, 2.0]
    assert row["rank_busy_s"] == pytest.approx([0.4, 1.3])
    assert row["comm_wait_s"] == pytest.approx(0.15) and row["comm_wait_max_s"] == 0.2
    assert row["comm_transfer_s"] == pytest.approx(0.3)
    assert (row["step_comm_bytes"], row["comm_bytes"], row["step_published_bytes"]) == (201, 14, 10)


def _stats_with_counts(rank: int, world: int) -> dict[str, object]:
    from leo_cli.worker.step import epoch_stats

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    times = {"step_s": 1.0}
    counts = torch.tensor([[3.0, 7.0], [rank, 2.0], [0.0, 0.0]], dtype=torch.float64)
    return epoch_stats(times, 0.0, 0.0, 0, 0, 0, counts)


def test_epoch_stats_sums_an_evaluations_counts_in_its_gather() -> None:
    """The accuracies from every rank's correct and total counts, summed (None: an empty
    split), beside the epoch's numbers, the same on every rank."""
    got = spawn_ranks(_stats_with_counts, 2)
    assert got[0] == got[1]
    row = got[0]
    assert (row["train_acc"], row["val_acc"], row["test_acc"]) == (6 / 14, 1 / 4, None)
    assert row["epoch_time_s"] == 1.0 and row["rank_step_s"] == [1.0, 1.0]


def _loop_collectives(rank: int, world: int, run_dir: Path) -> list[int]:
    """How many all-reduces and all-gathers each epoch of `Trainer.train` makes besides its
    training steps."""
    env = DistEnv(rank, world, rank, 0, local_world_size=world)
    job = Trainer(WorkerArgs(run_dir), env)
    calls, in_step, per_epoch = [0], [False], []
    for name in ("all_reduce", "all_gather", "all_gather_into_tensor"):
        real = getattr(dist, name)

        def counted(*args: object, _real: Any = real, **kwargs: object) -> object:
            calls[0] += 0 if in_step[0] else 1
            return _real(*args, **kwargs)

        setattr(dist, name, counted)
    step = job.job.step

    def timed_step(seed: int, epoch: int) -> tuple[float, dict[str, float]]:
        if epoch > 1:
            per_epoch.append(calls[0])
            calls[0] = 0
        in_step[0] = True
        try:
            return step(seed, epoch)
        finally:
            in_step[0] = False

    job.job.step = timed_step  # type: ignore[method-assign]
    job.train()
    per_epoch.append(calls[0])
    job.finish()
    return per_epoch


def test_an_evaluated_epoch_gathers_its_numbers_in_one_collective(tmp_path: Path) -> None:
    """Past the training step, an epoch with an evaluation makes one all-gather (its numbers
    and the evaluation's counts together), not a collective of each."""
    cfg = load_config(
        None,
        [
            "pipeline.mode=blocking",
            f"run.out_dir={tmp_path / 'run'}",
            "data.synthetic.num_nodes=300",
            "data.synthetic.num_features=8",
            "model.hidden_channels=8",
            "train.num_epochs=3",
            "launch.timeout_s=30",
        ],
    )
    run_dir = prepare(cfg, resume=False, progress=None)
    assert spawn_ranks(_loop_collectives, 2, run_dir) == [[1, 1, 1], [1, 1, 1]]
    rows = RunDir(run_dir).read_metrics()
    assert all(0.0 <= r["val_acc"] <= 1.0 and r["eval_s"] > 0 for r in rows)
