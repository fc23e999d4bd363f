"""The parent side of `leo train`: prepare the run folder, start workers with torch's elastic
launcher (what torchrun uses), follow rank 0's metrics, and turn failures into clear errors.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from leo_cli.cache.plan import PLAN
from leo_cli.config import LeoConfig, load_config, write_resolved
from leo_cli.config.schema import LaunchConfig as LaunchConfigSection
from leo_cli.errors import ConfigError, TrainError
from leo_cli.graph.layout import ProgressFn
from leo_cli.graph.stage import ensure_partitions, partition_dir
from leo_cli.graph.storage import META, read_meta
from leo_cli.train.checkpoint import read_latest
from leo_cli.train.checks import check_config
from leo_cli.train.heartbeat import HeartbeatWatch, stalled_ranks
from leo_cli.train.plan_stage import ensure_plan
from leo_cli.train.worker import config_fingerprint

# Keys that may change when resuming; anything else must match the run folder.
RESUMABLE = {"train.num_epochs", "train.eval_every", "train.checkpoint_every", "pipeline.mode"}
RUN_FILES = ("metrics.jsonl", "summary.json", "status.json", "curves.png")


def check_supported(cfg: LeoConfig, allow_inexact: bool = False) -> None:
    """Devices as the parent sees them, then the config checks that every worker repeats."""
    check_device(cfg.launch, workers_per_node(cfg))
    check_config(cfg, allow_inexact)


def check_device(launch: LaunchConfigSection, nproc: int) -> None:
    cuda = launch.device == "cuda" or (launch.device == "auto" and torch.cuda.is_available())
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


def workers_per_node(cfg: LeoConfig) -> int:
    """launch.nproc, defaulting to num_parts / nnodes; every part needs exactly one worker."""
    lc, parts = cfg.launch, cfg.partition.num_parts
    nproc = lc.nproc if lc.nproc is not None else parts // lc.nnodes
    if nproc * lc.nnodes != parts:
        raise ConfigError(
            f"launch.nproc={nproc} x launch.nnodes={lc.nnodes} workers do not match "
            f"partition.num_parts={parts}; each worker trains one part."
        )
    if lc.node_rank >= lc.nnodes:
        raise ConfigError(
            f"launch.node_rank={lc.node_rank} must be below launch.nnodes={lc.nnodes}."
        )
    if lc.nnodes > 1 and lc.master_port == 0:
        raise ConfigError("launch.master_port must be set (non-zero) when launch.nnodes > 1.")
    return nproc


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def check_resumable(cfg: LeoConfig, run_dir: Path) -> None:
    """A resumed run must use the settings its checkpoints were trained with."""
    saved_path = run_dir / "resolved_config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"Cannot resume: {saved_path} does not exist; start without --resume.")
    saved = flat(load_config(saved_path).model_dump(mode="json"))
    new = flat(cfg.model_dump(mode="json"))
    for key in sorted(saved):
        if key.startswith(("launch.", "run.name", "run.out_dir", "bench.")) or key in RESUMABLE:
            continue
        if saved[key] != new.get(key):
            raise ConfigError(
                f"Cannot resume {run_dir}: {key} was {saved[key]!r} there but is {new.get(key)!r} "
                f"now; use the run's settings or a new run.out_dir."
            )


def clear_run_files(run_dir: Path) -> None:
    """A fresh run starts without the metrics and checkpoints of an earlier one."""
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for folder in ("checkpoints", ".heartbeat", ".errors", "logs"):
        shutil.rmtree(run_dir / folder, ignore_errors=True)


def wait_for_partitions(cfg: LeoConfig, run_dir: Path, timeout_s: float) -> None:
    """Nodes other than 0 wait until node 0 has written matching partitions."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = (partition_dir(run_dir) / META).is_file()
        ready = ready and (run_dir / "resolved_config.yaml").is_file()
        ready = ready and (cfg.cache.policy == "none" or (run_dir / PLAN).is_file())
        if ready and read_meta(partition_dir(run_dir))["num_parts"] == cfg.partition.num_parts:
            return
        time.sleep(0.5)
    raise TrainError(
        f"Node {cfg.launch.node_rank} waited {timeout_s:.0f} s for node 0 to write "
        f"{partition_dir(run_dir)} (and {PLAN}); is the run folder shared between nodes?"
    )


def prepare(
    cfg: LeoConfig, resume: bool, progress: ProgressFn | None, allow_inexact: bool = False
) -> Path:
    """Partition if needed, check resume consistency, write the resolved config."""
    check_supported(cfg, allow_inexact)
    run_dir = Path(cfg.run.out_dir).resolve()
    if cfg.launch.node_rank > 0:
        wait_for_partitions(cfg, run_dir, cfg.launch.timeout_s)
        return run_dir
    if resume:
        check_resumable(cfg, run_dir)
        read_latest(run_dir)  # says here, not only in worker logs, if the newest is corrupt
    # Workers verify the checksums of their own part, in parallel; no need to hash twice.
    ensure_partitions(
        cfg.data, cfg.partition, cfg.run.seed, run_dir, progress=progress, verify=False
    )
    if not resume:
        clear_run_files(run_dir)
    shutil.rmtree(run_dir / ".errors", ignore_errors=True)
    write_resolved(cfg.model_copy(update={"run": cfg.run.model_copy(update={"out_dir": run_dir})}))
    ensure_plan(cfg, run_dir)
    return run_dir


def launch_config(cfg: LeoConfig, run_dir: Path) -> LaunchConfig:
    lc = cfg.launch
    single = lc.nnodes == 1
    return LaunchConfig(
        min_nodes=lc.nnodes,
        max_nodes=lc.nnodes,
        nproc_per_node=workers_per_node(cfg),
        run_id=f"leo-{uuid.uuid4().hex[:8]}" if single else f"leo-{lc.master_port}",
        rdzv_endpoint=f"{lc.master_addr}:{lc.master_port}",
        # c10d may swap node ranks on restart; static keeps node_rank, so node 0 hosts rank 0.
        rdzv_backend="c10d" if single else "static",
        rdzv_configs={"rank": lc.node_rank} if not single else {},
        rdzv_timeout=int(lc.timeout_s),
        max_restarts=lc.max_restarts,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs"), redirects=Std.ALL),
        shutdown_timeout=5,
    )


# The user's own OMP_NUM_THREADS, read before any launch sets it (leo bench launches many).
_USER_THREADS = os.environ.get("OMP_NUM_THREADS")


def worker_threads(nproc: int) -> str:
    """Threads per worker: the user's OMP_NUM_THREADS, else the cores shared among workers."""
    return _USER_THREADS or str(max(1, (os.cpu_count() or 1) // nproc))


def run_workers(cfg: LeoConfig, run_dir: Path, resume: bool, allow_inexact: bool = False) -> None:
    """Start the training workers and block until they finish; failures become TrainError."""
    args = [str(run_dir), "--config-sha", config_fingerprint(cfg)]
    args += (["--resume"] if resume else []) + (["--allow-inexact"] if allow_inexact else [])
    launch_module(cfg, run_dir, "leo_cli.train.worker", args)


def launch_module(cfg: LeoConfig, run_dir: Path, module: str, args: list[str]) -> None:
    """Run `python -m <module> <args>` in this node's workers, as `leo train` runs its own.

    Same elastic launch config (worker count, rendezvous, restarts), threads per worker and
    stall watch; logs land in `<run_dir>/logs`, a worker's user error is read from
    `<run_dir>/.errors`, heartbeats from `<run_dir>/.heartbeat`. Blocks until the workers
    finish; failures become TrainError.
    """
    # Like torchrun: workers share the cores instead of each spawning one thread per core.
    nproc = workers_per_node(cfg)
    os.environ["OMP_NUM_THREADS"] = worker_threads(nproc)
    # The agent logs each failed worker with its own formatting; our message replaces that.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with HeartbeatWatch(run_dir, cfg.launch.timeout_s) as watch:
        try:
            elastic_launch(launch_config(cfg, run_dir), entrypoint=sys.executable)(
                "-m", module, *args
            )
        except ChildFailedError as exc:
            stalled = watch.killed or stalled_ranks(run_dir, cfg.launch.timeout_s)
            message = worker_error(run_dir) or describe_failure(
                exc, run_dir, cfg.launch.timeout_s, stalled
            )
            raise TrainError(message) from None


def describe_failure(
    exc: ChildFailedError, run_dir: Path, timeout_s: float, stalled: list[int]
) -> str:
    if stalled:
        return (
            f"worker rank {stalled[0]} stopped responding (no heartbeat for "
            f"launch.timeout_s={timeout_s:g} s) and was killed; worker logs are in "
            f"{run_dir / 'logs'}."
        )
    rank, failure = exc.get_first_failure()
    message = failure.message
    if isinstance(message, dict):  # the error file written by @record
        message = str(message.get("message", ""))
    lines = str(message).strip().splitlines()
    first = lines[-1] if lines else f"exit code {failure.exitcode}"
    return f"worker rank {rank} failed ({first}); its log is under {run_dir / 'logs'}."


def worker_error(run_dir: Path) -> str | None:
    """The sentence of the lowest rank that stopped on a user error, if any did."""
    files = sorted((run_dir / ".errors").glob("rank_*"), key=lambda p: int(p.name[5:]))
    return files[0].read_text() if files else None
