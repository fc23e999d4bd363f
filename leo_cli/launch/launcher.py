"""The parent side of `leo train`: the checks and run-folder steps its set-up runs (in the
order launch/setup.py gives them: its `checks` stage calls the checks in turn); the workers are
started by launch/elastic.py (`run_workers`).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from leo_cli.config import LeoConfig, load_config
from leo_cli.config.schema import LaunchConfig as LaunchConfigSection
from leo_cli.errors import ConfigError, TrainError, tensorboard_missing
from leo_cli.graph.storage import META, read_meta
from leo_cli.planner.checks import check_backend
from leo_cli.run_dir import RunDir

# Keys that may change when resuming; anything else must match the run folder. The worker
# count may: every mode gives one process's numbers whatever the parts (dropout and rounding
# are keyed by global node ids), so a run goes on with partitions and a plan made for it.
RESUMABLE = {
    "partition.num_parts",
    "partition.part_weights",
    "train.num_epochs",
    "train.eval_every",
    "train.checkpoint_every",
    "pipeline.mode",
    "pipeline.levels",  # auto's measured choice, kept on resume (every level is exact)
    "pipeline.spmm",  # likewise (every variant computes the same sums)
    "pipeline.choose",
    "pipeline.trial_steps",
    "pipeline.auto_margin",
    "run.tensorboard",
}


def check_tensorboard(wanted: bool) -> None:
    if wanted and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(tensorboard_missing())


def check_device(launch: LaunchConfigSection, nproc: int, cuda: bool) -> None:
    """Devices as the parent sees them for `nproc` workers per node (`cuda`: on CUDA devices,
    comm/dist.py `uses_cuda`), and the backend that moves their tensors."""
    if launch.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "launch.device=cuda but no CUDA device is visible; use launch.device=cpu."
        )
    if cuda and launch.nnodes == 1 and nproc > torch.cuda.device_count():
        raise ConfigError(
            f"{nproc} workers need {nproc} CUDA devices but {torch.cuda.device_count()} are "
            "visible; lower partition.num_parts or use launch.device=cpu."
        )
    if launch.backend == "nccl" and not cuda:
        raise ConfigError("launch.backend=nccl needs CUDA devices; use launch.backend=gloo on CPU.")
    check_backend(launch.backend, cuda)


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def check_resumable(cfg: LeoConfig, run_dir: Path) -> None:
    """A resumed run must use the settings its checkpoints were trained with."""
    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        raise ConfigError(f"Cannot resume: {saved_path} does not exist; start without --resume.")
    saved = flat(load_config(saved_path).model_dump(mode="json"))
    new = flat(cfg.model_dump(mode="json"))
    for key in sorted(saved):
        skipped = ("launch.", "run.name", "run.out_dir", "run.cache_dir", "bench.")
        if key.startswith(skipped) or key in RESUMABLE:
            continue
        if saved[key] != new.get(key):
            raise ConfigError(
                f"Cannot resume {run_dir}: {key} was {saved[key]!r} there but is {new.get(key)!r} "
                f"now; use the run's settings or a new run.out_dir."
            )


def clear_run_files(run_dir: Path) -> None:
    """A fresh run starts without the metrics and checkpoints of an earlier one."""
    run = RunDir(run_dir)
    for name in run.ATTEMPT_FILES:
        (run / name).unlink(missing_ok=True)
    for folder in run.ATTEMPT_FOLDERS:
        shutil.rmtree(run / folder, ignore_errors=True)


def written(path: Path) -> tuple[int, int, int] | None:
    """Which write of `path` is there (inode, mtime, size): an atomic rewrite is a new inode."""
    try:
        stat = path.stat()
    except OSError:  # missing, or unreadable for now (a shared folder's hiccup): not there
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def wait_for_partitions(
    cfg: LeoConfig, run_dir: Path, timeout_s: float, stale: tuple[int, int, int] | None = None
) -> None:
    """Nodes other than 0 wait until node 0 has written matching partitions, and the resolved
    config node 0 writes last: one other than `stale` (an earlier launch's, when this node
    knows node 0 writes it again)."""
    run = RunDir(run_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        config = written(run.config)
        ready = (run.partitions / META).is_file() and config is not None and config != stale
        ready = ready and (not cfg.cache.enabled or run.plan.is_file())
        if ready and read_meta(run.partitions)["num_parts"] == cfg.partition.num_parts:
            return
        time.sleep(0.5)
    raise TrainError(
        f"Node {cfg.launch.node_rank} waited {timeout_s:.0f} s for node 0 to write "
        f"{run.partitions} (and {run.PLAN}); is the run folder shared between nodes?"
    )
