"""The rank side of `leo train`: `python -m leo_cli.worker.entry <run folder> [--resume]`.

Runs under the elastic agent that `leo train` starts, or under plain `torchrun`. Reads the
run folder's resolved config and this rank's partition, checks across ranks that everyone
starts alike, assembles the job and hands it to the training loop (worker/trainer.py); global
rank 0 writes the summary and curves at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from leo_cli.comm.dist import (
    DistEnv,
    all_gather_,
    all_reduce_,
    init_process_group,
    pick_backend,
)
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.placement import pin_from_config
from leo_cli.comm.process import rank_entry, run_rank
from leo_cli.config import LeoConfig, config_fingerprint, load_config
from leo_cli.config.load import PER_NODE_KEYS
from leo_cli.config.schema import LaunchConfig
from leo_cli.errors import TrainError
from leo_cli.graph.layout import LocalPart
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.graph.types import DatasetInfo
from leo_cli.kernels import active_backend
from leo_cli.kernels.variants import set_cpu_spmm
from leo_cli.planner.auto_mode import read_choice, refuse_unresolved, summary_fields
from leo_cli.planner.checks import check_backend, check_config, check_transport
from leo_cli.planner.plan import CachePlan, load_plan, predicted_busy, predicted_time
from leo_cli.registry import mode_of, planned_mode
from leo_cli.run_dir import RunDir, checkpoint_digest
from leo_cli.util.rss import peak_rss_bytes
from leo_cli.util.timing import WORKER_PARTS, Laps, setup_summary
from leo_cli.worker.assemble import (
    PartTensors,
    build_job,
    halo_plan,
    keeps_plan_levels,
    part_tensors,
    shared_static,
)
from leo_cli.worker.board import Board
from leo_cli.worker.memory import after_setup, fix_mmap_threshold
from leo_cli.worker.report import plot_curves, summarize
from leo_cli.worker.trainer import Job, RunLog, fit, restore
from leo_cli.worker.trials import choose_spmm, train_winner

USER_ERROR_EXIT = 3


def pick_device(launch: LaunchConfig, env: DistEnv) -> torch.device:
    """One CUDA device per local rank, or the CPU (checked by the launcher beforehand)."""
    if launch.device == "cuda" or (launch.device == "auto" and torch.cuda.is_available()):
        if env.local_rank >= torch.cuda.device_count():
            raise TrainError(
                f"local rank {env.local_rank} has no CUDA device of its own "
                f"({torch.cuda.device_count()} visible); lower launch.nproc."
            )
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def check_same_host(cfg: LeoConfig, env: DistEnv) -> None:
    """A one-host mode reaches only the workers of one host (what torchrun says, not the
    config)."""
    if mode_of(cfg.pipeline.mode).one_host and env.local_world_size != env.world_size:
        raise TrainError(
            f"pipeline.mode={cfg.pipeline.mode} needs every worker on one host, but "
            f"{env.world_size - env.local_world_size} run elsewhere; use pipeline.mode="
            f"{planned_mode()}."
        )


def with_plan(fingerprint: str, cfg: LeoConfig, run: RunDir) -> str:
    """The config fingerprint combined with the cache plan's bytes, read raw (not parsed: a
    rank whose copy is bad must fail with the others, in the cross-check): every rank must
    train with the same plan (both ends of a transfer cut it the same way)."""
    if not cfg.cache.enabled or not run.plan.is_file():
        return fingerprint
    return hashlib.sha256(bytes.fromhex(fingerprint) + run.plan.read_bytes()).hexdigest()


def with_trials(fingerprint: str, trials: list[str]) -> str:
    """The fingerprint combined with the candidates to try: every rank must try the same."""
    if not trials:
        return fingerprint
    return hashlib.sha256(bytes.fromhex(fingerprint) + "\n".join(trials).encode()).hexdigest()


def check_consistent(
    plan: HaloPlan, fingerprint: str, start: int, loaded: bytes = bytes(32)
) -> list[int]:
    """Cross-check every rank's config, halo counts, resume epoch and the digest of the
    checkpoint it loaded (`run_dir.checkpoint_digest`) in one all-gather; returns every rank's
    halo size (what the cache plan's rows are checked against).

    A node started with another config would silently train node 0's; ranks that read
    different partitions (a stale folder on one host) would run an inconsistent all-to-all;
    ranks resuming from different checkpoints would train different models.
    """
    p = len(plan.send_counts)
    digests = [bytearray(bytes.fromhex(fingerprint)), bytearray(loaded)]
    digest = torch.cat([torch.frombuffer(d, dtype=torch.int64) for d in digests])
    mine = torch.tensor([*plan.send_counts, *plan.recv_counts, start], dtype=torch.int64)
    rows = all_gather_(torch.cat([mine, digest]))
    config_at = 2 * p + 1  # then the config's digest, then the loaded checkpoint's
    loaded_at = config_at + len(digests[0]) // 8
    check_fingerprints(rows[:, config_at:loaded_at])
    check_halo_counts(rows[:, :p], rows[:, p : 2 * p])
    check_same_start(rows[:, 2 * p])
    check_same_checkpoint(rows[:, loaded_at:], start)
    return [int(n) for n in rows[:, p : 2 * p].sum(dim=1)]


def unlike_rank_0(digests: torch.Tensor) -> list[int]:
    """The ranks whose row differs from rank 0's."""
    return [r for r in range(len(digests)) if not torch.equal(digests[r], digests[0])]


def check_fingerprints(digests: torch.Tensor) -> None:
    other = unlike_rank_0(digests)
    if other:
        raise TrainError(
            f"worker ranks {other} were started with another config than rank 0 (only "
            f"{', '.join(PER_NODE_KEYS)} may differ between nodes); start every node with the "
            "same config."
        )


def check_halo_counts(send: torch.Tensor, recv: torch.Tensor) -> None:
    """`send[r][q]` rows that rank r sends to q must be the `recv[q][r]` that q expects."""
    bad = (send != recv.T).nonzero()
    if len(bad):
        r, q = bad[0].tolist()
        raise TrainError(
            f"rank {r} sends {int(send[r, q])} halo rows to rank {q} but rank {q} expects "
            f"{int(recv[q, r])} from rank {r}: the ranks read different partitions; make sure "
            "every node sees the same run.out_dir/partitions."
        )


def check_same_checkpoint(digests: torch.Tensor, epoch: int) -> None:
    """Every rank must have loaded the same checkpoint contents, not only the same epoch."""
    other = unlike_rank_0(digests)
    if other:
        raise TrainError(
            f"worker ranks {other} loaded another checkpoint of epoch {epoch} than rank 0 "
            "(different weights or optimizer state); make sure every node sees the same "
            "run.out_dir/checkpoints."
        )


def check_same_start(starts: torch.Tensor) -> None:
    """Every rank must resume from the same checkpoint (a shared folder seen inconsistently
    across machines would otherwise train different models)."""
    lo, hi = int(starts.min()), int(starts.max())
    if lo != hi:
        raise TrainError(
            f"workers found different latest checkpoints (epochs {lo} to {hi}); make sure "
            "every node sees the same run.out_dir/checkpoints."
        )


def row_extras(cfg: LeoConfig, cache_plan: CachePlan | None, world_size: int) -> dict[str, Any]:
    """What every metrics row of the run carries besides the epoch's own numbers: the worker
    count (a run resumed on another one has segments, summary.json's `segments`), the bytes
    per cache level of one step, all workers (from the plan; modes that hold its levels and
    move one row per halo node move exactly these, a test checks them against the measured
    bytes), and whether the numbers are exact."""
    mode = mode_of(cfg.pipeline.mode)
    extras: dict[str, Any] = {"exact": mode.exact or world_size == 1, "workers": world_size}
    if (
        cache_plan is not None
        and cfg.cache.enabled
        and mode.cache_levels
        and not mode.per_edge_rows
        and keeps_plan_levels(cfg)
    ):
        for level in ("L2", "L3"):
            rows = cache_plan.bytes_per_level
            extras[f"step_{level}_bytes"] = sum(r[f"{level}_bytes_per_step"] for r in rows)
    return extras


def reduce_setup(laps: Laps, entered_at: float, launched_at: float | None) -> dict[str, float]:
    """This worker's set-up parts, each the slowest rank's, and when the slowest rank starts
    its first step (`first_step_at`, wall clock)."""
    now = time.time()
    mine = {k: laps.seconds.get(k, 0.0) for k in WORKER_PARTS}
    mine["worker_setup_s"] = now - entered_at
    mine["launch_s"] = entered_at - launched_at if launched_at is not None else 0.0
    mine["first_step_at"] = now
    values = torch.tensor(list(mine.values()), dtype=torch.float64)
    return dict(zip(mine, all_reduce_(values, op="max").tolist(), strict=True))


def attempt_setup(
    run: RunDir, restart: int, launched_at: float | None, worker: dict[str, float]
) -> dict[str, Any]:
    """summary.json's set-up fields, on rank 0 before the first step: the first attempt's
    (kept in the run folder), and for an attempt the elastic agent restarted (a failure, a
    lost machine) the first attempt's with this one's set-up added to `restart_setup_s`."""
    first_step_at = worker.pop("first_step_at")
    earlier = run.read_first_setup(launched_at) if restart > 0 else {}
    if not earlier:
        earlier = setup_summary(run.read_setup(launched_at), worker, first_step_at)
        if restart > 0:  # the first attempt never reached its first step
            earlier["restart_setup_s"] = []
    if restart > 0:
        earlier["restart_setup_s"] = [*earlier.get("restart_setup_s", []), worker["worker_setup_s"]]
    with contextlib.suppress(OSError):  # costs only a restart's accounting
        run.write_first_setup(launched_at, earlier)
    return earlier


def finish(
    cfg: LeoConfig,
    run: RunDir,
    cache_plan: CachePlan | None,
    world_size: int,
    setup: dict[str, Any],
) -> None:
    """Rank 0 at the end: summary.json, curves.png and the final status."""
    rows = run.read_metrics()
    predicted = predicted_time(cache_plan, cfg)
    summary = summarize(rows, world_size, cfg.pipeline.mode, cfg.run.name, predicted)
    summary["predicted_rank_busy_s"] = predicted_busy(cache_plan, cfg)
    summary["halo_dtype"] = cfg.pipeline.halo_dtype
    summary.update(summary_fields(run.root, cfg.pipeline.mode))  # mode_requested and why
    run.write_summary({**summary, **setup})
    plot_curves(rows, run.curves)
    run.write_status("done")


def worker_body(argv: list[str] | None = None) -> tuple[Path, Callable[[DistEnv], int]]:
    """The worker's arguments read, and what it runs as a rank (`main`; the elastic entry
    runs it after a regroup, leo_cli/elastic/entry.py): its run folder and its body."""
    parser = argparse.ArgumentParser(prog="python -m leo_cli.worker.entry")
    parser.add_argument("run_dir", type=Path, help="run folder holding resolved_config.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument(
        "--allow-inexact",
        action="store_true",
        help="allow an inexact pipeline.mode such as compute-only (for leo bench)",
    )
    parser.add_argument(
        "--config-sha", help="fingerprint of the launcher's config (default: the run folder's)"
    )
    parser.add_argument(
        "--launched-at",
        type=float,
        help="wall-clock time the launcher started the workers (set-up accounting)",
    )
    args = parser.parse_args(argv)
    entered_at = time.time()
    fix_mmap_threshold()  # before set-up's large temporaries come and go (worker/memory.py)
    run_dir: Path = args.run_dir

    def body(env: DistEnv) -> int:
        resume = args.resume or env.restart > 0
        started = (entered_at, args.launched_at)
        return run_worker(run_dir, env, resume, args.config_sha, args.allow_inexact, started)

    return run_dir, body


def main(argv: list[str] | None = None) -> int:
    run_dir, body = worker_body(argv)
    return run_rank(body, heartbeat_dir=run_dir, errors_dir=RunDir(run_dir).errors)


def setup_progress(run: RunDir) -> Callable[[dict[str, float]], None]:
    """Rank 0's finished set-up stages in status.json (state `setup`), for the parent's
    display (cli/train.py); a write that fails only costs the display."""

    def show(seconds: dict[str, float]) -> None:
        with contextlib.suppress(OSError):
            run.write_status("setup", stages=rounded(seconds))

    return show


def rounded(seconds: dict[str, float]) -> dict[str, float]:
    """Set-up stages as status.json records them (ms)."""
    return {k: round(v, 3) for k, v in seconds.items()}


def run_worker(
    run_dir: Path,
    env: DistEnv,
    resume: bool,
    config_sha: str | None = None,
    allow_inexact: bool = False,
    started: tuple[float, float | None] | None = None,
) -> int:
    """Train this rank's part. `started`: when this process entered main and when the
    launcher started the workers (None under plain torchrun), for the set-up accounting."""
    entered_at, launched_at = started or (time.time(), None)
    run = RunDir(run_dir)
    laps = Laps(on_lap=setup_progress(run) if env.rank == 0 else None)
    cfg = load_config(run.config)
    refuse_unresolved(cfg)  # every rank runs the mode leo train resolved, never `auto`
    check_config(cfg, allow_inexact)  # plain torchrun starts workers without the launcher
    pin_from_config(cfg.launch.cpu_affinity, env.local_rank)  # plain torchrun: not pinned yet
    active_backend()  # LEO_KERNELS=cuda without a loadable extension: one sentence, now
    check_same_host(cfg, env)
    meta = read_meta(run.partitions)
    if meta["num_parts"] != env.world_size:
        raise TrainError(
            f"{run.partitions} holds {meta['num_parts']} parts but "
            f"{env.world_size} workers started; set launch.nproc to match."
        )
    device = pick_device(cfg.launch, env)
    check_backend(cfg.launch.backend, device.type == "cuda")
    check_transport(cfg, device.type == "cuda")
    if env.world_size > 1:
        backend = pick_backend(device, cfg.launch.backend)
        init_process_group(env, backend, cfg.launch.timeout_s, device)
    laps.lap("process_group_s")
    # Cross-check before any set-up collective: mismatched ranks must fail with a sentence,
    # not hang in the first exchange.
    # Mapped, not read: the part's files serve as page cache while set-up copies what it needs.
    part = read_part(run.partitions, env.rank, mmap=True)
    laps.lap("read_part_s")
    state = run.load_latest() if resume else None
    start = 0 if state is None else int(state["epoch"])
    # `auto`'s candidates to try, if any: before the first epoch, also in a run restarted or
    # resumed before it (its trials never finished: mode-choice.json still lists them).
    choice = read_choice(run_dir) if state is None else None
    trials = [] if choice is None else choice.trials
    spmm_trials = [] if choice is None else choice.spmm_trials
    tried = [*trials, *(f"spmm={v}" for v in spmm_trials)]
    fingerprint = with_trials(with_plan(config_sha or config_fingerprint(cfg), cfg, run), tried)
    loaded = checkpoint_digest(state)
    halo_sizes = check_consistent(halo_plan(part, torch.device("cpu")), fingerprint, start, loaded)
    # Read once, after every rank saw the same bytes: the job, the rows' extras, the summary.
    cache_plan = load_plan(cfg, run_dir, meta)
    used = cache_plan if cfg.cache.enabled else None

    # `auto`'s candidates share the part's CSR and data and the static aggregate (the winner
    # keeps them): made once, as a run of one mode makes them, so `choose_s` is the trials'.
    shared = part_tensors(cfg, part, DatasetInfo.from_meta(meta), device) if trials else None
    laps.lap("graph_s")
    static = None if shared is None else shared_static(cfg, used, part, shared, env.world_size)
    laps.lap("levels_s")

    def build(
        run_cfg: LeoConfig,
        run_laps: Laps | None,
        part: LocalPart = part,
        tensors: PartTensors | None = shared,
        static_NF: torch.Tensor | None = static,
    ) -> Job:
        return build_job(
            run.plan, run_cfg, used, meta, part, env.world_size, device, halo_sizes, run_laps,
            tensors, static_NF,
        )  # fmt: skip

    set_cpu_spmm(cfg.pipeline.spmm)
    if choice is not None and trials:
        job, cfg, choice = train_winner(run, cfg, choice, build, env.rank, laps)
    else:
        job = build(cfg, laps)
    if choice is not None and spmm_trials:
        cfg, choice = choose_spmm(run, cfg, choice, job, env.rank, laps)
    # The job copied what it needs of the part (the features stay mapped through x_NF):
    # dropping it unmaps the edge arrays that set-up read, which would stay resident.
    del part, build, shared, static
    if state is not None:
        restore(state, job.model, job.optimizer, run.checkpoints)
    if env.rank == 0:
        # Rows past the checkpoint (or all rows, without one) belong to a dead attempt.
        # First the checkpoints this resume skipped: once their rows are gone, nothing would
        # tell the next resume not to take them.
        run.set_aside_checkpoints_after(start)
        run.truncate_metrics(start)
        run.write_status("running", stages=rounded(laps.seconds))
    after_setup(cfg.launch.keep_freed_memory)  # set-up's temporaries go back to the system
    worker = reduce_setup(laps, entered_at, launched_at)
    setup = attempt_setup(run, env.restart, launched_at, worker) if env.rank == 0 else {}
    board = (
        Board(run / RunDir.TENSORBOARD, start) if cfg.run.tensorboard and env.rank == 0 else None
    )
    log = RunLog(run, env.rank, row_extras(cfg, cache_plan, env.world_size), board)
    try:
        fit(job, cfg.train, cfg.run.seed, start, log)
    finally:
        if board is not None:
            board.close()
    peaks = all_gather_(torch.tensor(peak_rss_bytes(), dtype=torch.int64)).tolist()
    if env.rank == 0:
        setup["static_aggregate"] = job.static_layer0
        setup["peak_rss_bytes"] = peaks
        finish(cfg, run, cache_plan, env.world_size, setup)
    if env.world_size > 1:
        dist.barrier()  # nobody tears the group down while a peer still talks to it
    return 0


@record
def entry() -> None:
    rank_entry(main)


if __name__ == "__main__":
    entry()
