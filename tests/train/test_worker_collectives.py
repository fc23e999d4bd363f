"""The worker's collectives on the process group LEO builds, and its start-up cross-checks.

No GPU here: a gloo group with the device map LEO builds for CUDA, gloo standing in for NCCL,
refuses tensors of a device that map does not serve exactly as NCCL would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_harness import spawn_ranks
from torch.distributed.distributed_c10d import Backend, BackendConfig

from leo_cli.comm.dist import DistEnv, pick_backend
from leo_cli.config import load_config
from leo_cli.train import metrics, worker
from leo_cli.train.launcher import prepare

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
    worker.pick_backend = lambda device, backend: served_as_on_cuda(backend)  # type: ignore[assignment]
    return worker.run_worker(run_dir, DistEnv(rank, world, rank, 0), resume=False)


def test_whole_worker_runs_on_the_cuda_device_map(tmp_path: Path) -> None:
    """Every collective of a run (start-up checks, loss, gradients, halo exchange, evaluation,
    epoch statistics, final barrier) on the group a CUDA run gets."""
    cfg = load_config(
        None,
        [
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
    assert [r["epoch"] for r in metrics.read_metrics(run_dir)] == [1, 2]
