"""Starting worker processes with torch's elastic launcher (what torchrun uses), for training
(`run_workers`: the training workers, followed to the end) and for the hardware probe: one
launch config, threads per worker, stall watch, and failures turned into one sentence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from leo_cli.comm.segments import JOB_ENV, new_job, remove_job
from leo_cli.config import LeoConfig, config_fingerprint
from leo_cli.errors import ConfigError, TrainError
from leo_cli.harness.placement import AFFINITY_ENV, affinity_problem, placement_env
from leo_cli.launch import early
from leo_cli.launch.allocator import allocator_env, workers_allocator
from leo_cli.launch.heartbeat import HeartbeatWatch, stalled_ranks
from leo_cli.launch.memory_watch import MemoryWatch
from leo_cli.launch.preload import ensure_server, entry_point, forks_workers, launching
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.interrupt import Interrupted
from leo_cli.util.rss import hand_back_freed_memory
from leo_cli.util.timing import RunTimer

# The signals the elastic agent takes over while it runs (TORCHELASTIC_SIGNALS_TO_HANDLE).
AGENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class Workers:
    """This node's training workers as the config asks for them, worked out once by set-up's
    checks stage (launch/setup.py) and handed to the stages after it: how many
    (`workers_per_node`), whether they train on CUDA devices, and the module they run
    (`worker_module`)."""

    per_node: int
    cuda: bool
    module: str


def workers_per_node(cfg: LeoConfig) -> int:
    """launch.nproc, defaulting to num_parts / nnodes; every part needs exactly one worker.
    The placement is looked at before the elastic settings and refused after them."""
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
    misplaced = affinity_problem(lc.cpu_affinity, nproc)
    if lc.elastic():
        check_elastic(cfg)
    if misplaced is not None:
        raise ConfigError(misplaced)
    return nproc


def check_elastic(cfg: LeoConfig) -> None:
    """What going on with fewer machines (`launch.nnodes: MIN:MAX`) needs of the config."""
    lc = cfg.launch
    span = f"launch.nnodes={lc.min_nodes}:{lc.nnodes}"
    if lc.max_restarts < 1:
        raise ConfigError(
            f"{span} restarts the survivors' workers after a machine is lost; set "
            "launch.max_restarts >= 1 (each loss uses one restart)."
        )
    if isinstance(cfg.partition.part_weights, list):
        raise ConfigError(
            f"{span} re-partitions for the workers left after a loss, which a list of "
            f"partition.part_weights (one per worker of {lc.nnodes} machines) cannot size; use "
            "equal or measured weights."
        )


# Seconds the agent waits for workers to exit after a signal: a field of recent torch releases
# only (2.11 lacks it and waits its own fixed time).
_SHUTDOWN: dict[str, Any] = (
    {"shutdown_timeout": 5}
    if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}
    else {}
)


def launch_config(
    cfg: LeoConfig, run_dir: Path, elastic: bool = False, start_method: str = "spawn"
) -> LaunchConfig:
    """The agent's launch config. Under `launch.nnodes: MIN:MAX` every launch rendezvouses
    through c10d hosted by node 0's agent, so the probe's ranks are numbered as training's
    (c10d orders machines by host name, not `launch.node_rank`); `elastic`: training, whose
    membership may shrink to MIN (the probe's is fixed)."""
    lc = cfg.launch
    single = lc.nnodes == 1
    ordered = lc.elastic()
    if ordered:  # node 0 hosts the store: several agents of one host must not all try
        rdzv: dict[str, Any] = {
            "is_host": lc.node_rank == 0,
            "last_call_timeout": lc.last_call_s,
            "keep_alive_interval": lc.keep_alive_s,
        }
    else:  # c10d may swap node ranks on restart; static keeps node_rank: node 0 hosts rank 0
        rdzv = {"rank": lc.node_rank} if not single else {}
    return LaunchConfig(
        min_nodes=lc.min_nodes if elastic and ordered and lc.min_nodes else lc.nnodes,
        max_nodes=lc.nnodes,
        nproc_per_node=workers_per_node(cfg),
        run_id=f"leo-{uuid.uuid4().hex[:8]}" if single else f"leo-{lc.master_port}",
        rdzv_endpoint=f"{lc.master_addr}:{lc.master_port}",
        rdzv_backend="c10d" if single or ordered else "static",
        rdzv_configs=rdzv,
        rdzv_timeout=int(lc.timeout_s),
        max_restarts=lc.max_restarts,
        monitor_interval=0.2,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(RunDir(run_dir).logs), redirects=Std.ALL),
        **_SHUTDOWN,
    )


# The user's own OMP_NUM_THREADS, read before any launch sets it (leo bench launches many).
USER_THREADS = os.environ.get("OMP_NUM_THREADS")


def worker_threads(nproc: int, cores: list[int] | None = None) -> str:
    """Threads per worker: the user's OMP_NUM_THREADS, else those of its `cores` when pinned,
    else the cores shared among workers."""
    if cores is not None:
        return USER_THREADS or str(len(cores))
    return USER_THREADS or str(max(1, (os.cpu_count() or 1) // nproc))


def launch_module(
    cfg: LeoConfig, run_dir: Path, module: str, args: list[str], elastic: bool = False
) -> None:
    """Run `python -m <module> <args>` in this node's workers, as `leo train` runs its own.

    Same elastic launch config (worker count, rendezvous, restarts), threads per worker and
    stall watch (`elastic`: a membership that may shrink, see `launch_config`); logs land in
    `<run_dir>/logs`, a worker's user error is read from
    `<run_dir>/.errors`, heartbeats from `<run_dir>/.heartbeat`. Blocks until the workers
    finish; failures become TrainError, SIGINT / SIGTERM `Interrupted` (once the agent has
    stopped the workers). Shared-memory segments of the job are removed however it ends.
    """
    # Like torchrun: workers share the cores instead of each spawning one thread per core.
    os.environ["OMP_NUM_THREADS"] = worker_threads(workers_per_node(cfg))
    placement = placement_env(cfg.launch.cpu_affinity, USER_THREADS)
    if placement is None:  # this process launches many jobs: no earlier job's placement
        os.environ.pop(AFFINITY_ENV, None)
    else:  # each worker pins itself and sets its threads (harness/placement.py)
        os.environ[AFFINITY_ENV] = placement
    # The agent logs each failed worker (and a signal it got) with its own formatting; our
    # message replaces that. Its modules set their own levels, so each logger is quietened.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    job = os.environ[JOB_ENV] = new_job()  # names this launch's shared-memory segments
    with (
        allocator_env(workers_allocator(cfg.launch)),
        HeartbeatWatch(run_dir, cfg.launch.timeout_s) as watch,
        own_signal_handlers(),
    ):
        try:
            entrypoint, entry_args, start_method = entry_point(module, args)
            config = launch_config(cfg, run_dir, elastic, start_method)
            with launching():
                elastic_launch(config, entrypoint=entrypoint)(*entry_args)
        except SignalException as exc:  # the agent stopped the workers first
            raise Interrupted(int(exc.sigval)) from None
        except ChildFailedError as exc:
            stalled = watch.killed or stalled_ranks(run_dir, cfg.launch.timeout_s)
            message = worker_error(run_dir) or describe_failure(
                exc, run_dir, cfg.launch.timeout_s, stalled
            )
            raise TrainError(message) from None
        finally:
            remove_job(job)  # the segments a killed worker had not unlinked yet


def run_workers(
    cfg: LeoConfig,
    run_dir: Path,
    resume: bool,
    allow_inexact: bool = False,
    timer: RunTimer | None = None,
) -> None:
    """Start the training workers and block until they finish; failures become TrainError.

    With the parent's `timer`, workers report the set-up since the run started and the
    summary gets the run's `wall_s` (util/timing.py). status.json never stays "running" once
    they are gone: "interrupted" after SIGINT / SIGTERM (checkpoints kept, resumable),
    "failed" with the reason after any other failure.
    """
    # The fingerprint of the config as given (`auto` unresolved): every node's is the same when
    # their configs are, whenever each reads the run folder; the workers read the mode node 0
    # chose from resolved_config.yaml after the rendezvous, when node 0 has written it.
    args = [str(run_dir), "--config-sha", config_fingerprint(cfg)]
    args += (["--resume"] if resume else []) + (["--allow-inexact"] if allow_inexact else [])
    # Under `launch.nnodes: MIN:MAX` the workers re-form the run when their count changes.
    elastic = cfg.launch.elastic()
    module = worker_module(cfg)
    args += ["--node-rank", str(cfg.launch.node_rank)] if elastic else []
    if timer is not None and cfg.launch.node_rank == 0:  # rank 0 runs on node 0 and reads it
        stamp = timer.stamp()  # (the folder is shared: another node's stamp would replace it)
        RunDir(run_dir).write_setup(stamp)
        args += ["--launched-at", repr(stamp["launched_at"])]
    hand_back_freed_memory()  # planning's freed memory, before the workers' peaks count
    watch = MemoryWatch()
    try:
        with watch:
            launch_module(cfg, run_dir, module, args, elastic)
    except Interrupted as exc:
        mark_status(cfg, run_dir, "interrupted", exc.name)
        raise
    except BaseException as exc:
        mark_status(cfg, run_dir, "failed", str(exc) or type(exc).__name__)
        raise
    finally:
        sweep_run_files(cfg, run_dir)
    if timer is not None and cfg.launch.node_rank == 0:
        RunDir(run_dir).update_summary({
            "wall_s": round(time.time() - timer.started_at, 4),
            "allocator": workers_allocator(cfg.launch).described,
            "peak_rss_total_bytes": watch.peak_bytes or None,  # this node's processes
        })  # fmt: skip


def sweep_run_files(cfg: LeoConfig, run_dir: Path) -> None:
    """Remove the temporary files of writers that are gone (a worker killed by a signal in
    the middle of a checkpoint or a run file runs no clean-up of its own). One machine only:
    whether a writer lives is known for this host's processes alone, and a run folder shared
    by several machines holds the others' (checkpoint saves sweep their own folder)."""
    if cfg.launch.nnodes == 1:
        for folder in (run_dir, RunDir(run_dir).checkpoints):
            files.sweep_temporaries(folder)


def mark_status(cfg: LeoConfig, run_dir: Path, state: str, reason: str) -> None:
    """status.json after the workers ended without finishing (node 0 writes it: the folder
    may be shared between nodes)."""
    if cfg.launch.node_rank == 0:
        RunDir(run_dir).write_status(state, reason)


def worker_module(cfg: LeoConfig) -> str:
    """What `leo train`'s workers run: under `launch.nnodes: MIN:MAX` they re-form the run
    first when their count changes."""
    return "leo_cli.elastic.entry" if cfg.launch.elastic() else "leo_cli.worker.entry"


def cpu_library() -> Path | None:
    """The CPU library the workers' server loads as it imports LEO (`$LEO_CPU_KERNELS_DIR`),
    or None (the package's own, or the reference kernels)."""
    from leo_cli.kernels import cpu

    folder = os.environ.get(cpu.DIR_ENV)
    return cpu.library_path(Path(folder)) if folder else None


def start_early(cfg: LeoConfig, workers: Workers, cache_dir: Path) -> None:
    """Start the server `leo train`'s `workers` will fork from (launch/preload.py) in the
    environment `launch_module` gives them, so its imports run beside this process's set-up
    (kept where launch/early.py started it in that environment), and write that environment
    down for the next run in `cache_dir`. A launch in another environment starts another one."""
    if forks_workers():
        os.environ["OMP_NUM_THREADS"] = worker_threads(workers.per_node)  # numpy's too
        with allocator_env(workers_allocator(cfg.launch)):
            if ensure_server(workers.module):
                early.remember(cache_dir, cpu_library())


@contextlib.contextmanager
def own_signal_handlers() -> Iterator[None]:
    """Restore this process's signal handlers after a launch: the elastic agent installs its
    own (SIGINT, SIGTERM, SIGHUP, SIGQUIT raise its SignalException) and leaves them."""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS} if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def describe_failure(
    exc: ChildFailedError, run_dir: Path, timeout_s: float, stalled: list[int]
) -> str:
    if stalled:
        return (
            f"worker rank {stalled[0]} stopped responding (no heartbeat for "
            f"launch.timeout_s={timeout_s:g} s) and was killed; worker logs are in "
            f"{RunDir(run_dir).logs}."
        )
    rank, failure = exc.get_first_failure()
    message = failure.message
    if isinstance(message, dict):  # the error file written by @record
        message = str(message.get("message", ""))
    lines = str(message).strip().splitlines()
    first = lines[-1] if lines else f"exit code {failure.exitcode}"
    return f"worker rank {rank} failed ({first}); its log is under {RunDir(run_dir).logs}."


def worker_error(run_dir: Path) -> str | None:
    """The sentence of the lowest rank that stopped on a user error, if any did."""
    files = sorted(RunDir(run_dir).errors.glob("rank_*"), key=lambda p: int(p.name[5:]))
    return files[0].read_text() if files else None
