"""One rank's training job: `Trainer(args, env)` assembles it in the order it happens and
`train()` runs its epochs; `finish()` writes rank 0's report.

The constructor reads as the set-up it does: the resolved config, checked again (plain
torchrun starts workers without the launcher); the device and the process group; this
rank's part; the checkpoint it resumes from and the check that every rank starts alike
(worker/agree.py); the cache plan; the job: the mode's aggregator over the part's cache
levels, the model and its optimizer (worker/assemble.py; `auto`'s candidates are tried first,
worker/trials.py); the checkpoint restored; the run folder made ready for this attempt's rows.
`train()` is the epoch loop: a step (worker/step.py), a stop on a non-finite loss, evaluation
every `train.eval_every` epochs (its counts summed over the ranks in the epoch's one gather
of numbers), and on rank 0 a metrics row, the best model and a checkpoint every
`train.checkpoint_every`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from leo_cli.comm.dist import DistEnv, all_gather_, init_process_group, pick_backend
from leo_cli.config import LeoConfig, config_fingerprint, load_config
from leo_cli.config.schema import LaunchConfig
from leo_cli.errors import TrainError
from leo_cli.graph.layout import LocalPart
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.graph.types import DatasetInfo
from leo_cli.harness.placement import pin_from_config
from leo_cli.kernels import active_backend
from leo_cli.kernels.variants import set_cpu_spmm
from leo_cli.planner.auto_mode import (
    ModeChoice,
    epochs_to_repay,
    read_choice,
    refuse_unresolved,
)
from leo_cli.planner.checks import check_backend, check_config, check_transport
from leo_cli.planner.plan import load_plan
from leo_cli.run_dir import RunDir, checkpoint_digest
from leo_cli.util.rss import peak_rss_bytes
from leo_cli.util.timing import Laps
from leo_cli.worker.agree import check_consistent, check_same_host, with_plan, with_trials
from leo_cli.worker.assemble import PartTensors, build_job, halo_plan, part_tensors, shared_static
from leo_cli.worker.board import Board
from leo_cli.worker.checkpoint import keep_best_of, restore, row_accuracies
from leo_cli.worker.memory import after_setup
from leo_cli.worker.report import (
    attempt_setup,
    finish,
    reduce_setup,
    rounded,
    row_extras,
    setup_progress,
)
from leo_cli.worker.step import ACCURACY_KEYS, Job, epoch_stats
from leo_cli.worker.trials import choose_spmm, train_winner


@dataclass(frozen=True)
class WorkerArgs:
    """What a worker is started with (worker/entry.py reads them from its command line)."""

    run_dir: Path  # the run folder holding resolved_config.yaml
    resume: bool = False  # continue from the latest checkpoint
    allow_inexact: bool = False  # an inexact pipeline.mode such as compute-only (leo bench)
    config_sha: str | None = None  # the launcher's config fingerprint (None: the folder's)
    launched_at: float | None = None  # when the launcher started the workers (None: torchrun)
    entered_at: float = field(default_factory=time.time)  # when this process started


class Trainer:
    """One rank's job, built by the constructor in the order set-up happens; `train()` runs
    the epochs, `finish()` writes rank 0's summary and lets the group go."""

    def __init__(self, args: WorkerArgs, env: DistEnv) -> None:
        self.env = env
        self.run = run = RunDir(args.run_dir)
        laps = Laps(on_lap=setup_progress(run) if env.rank == 0 else None)
        # 1. The config the parent resolved, and the device and process group it asks for.
        self.cfg = cfg = checked_config(run, env, args.allow_inexact)
        meta = read_meta(run.partitions)
        if meta["num_parts"] != env.world_size:
            raise TrainError(
                f"{run.partitions} holds {meta['num_parts']} parts but "
                f"{env.world_size} workers started; set launch.nproc to match."
            )
        self.device = pick_device(cfg.launch, env)
        join_group(cfg, env, self.device)
        laps.lap("process_group_s")
        # 2. This rank's part. Mapped, not read: the part's files serve as page cache while
        # set-up copies what it needs.
        part = read_part(run.partitions, env.rank, mmap=True)
        laps.lap("read_part_s")
        # 3. Where it starts: the checkpoint it resumes from, `auto`'s candidates to try, and
        # every rank alike.
        state = run.load_latest() if args.resume or env.restart > 0 else None
        self.start = 0 if state is None else int(state["epoch"])
        # The candidates run before the first epoch, also in a run restarted or resumed
        # before it (its trials never finished: mode-choice.json still lists them).
        choice = read_choice(run.root) if state is None else None
        # Checked before any set-up collective: mismatched ranks must fail with a sentence,
        # not hang in the first exchange.
        fingerprint = with_plan(args.config_sha or config_fingerprint(cfg), cfg, run)
        fingerprint = with_trials(fingerprint, tried(choice))
        digest = checkpoint_digest(state)
        halo_sizes = check_consistent(halo_plan(part, torch.device("cpu")), fingerprint,
                                      self.start, digest)  # fmt: skip
        # 4. The cache plan, read once after every rank saw the same bytes (the job, the rows'
        # extras and the summary read it), then the job: cache levels, the mode's aggregator,
        # the model and its optimizer.
        self.cache_plan = load_plan(cfg, run.root, meta)
        self.job = self.assemble(part, meta, choice, halo_sizes, laps)
        # The job copied what it needs of the part (the features stay mapped through x_NF):
        # dropping it unmaps the edge arrays that set-up read, which would stay resident.
        del part
        # 5. The checkpoint restored, the run folder ready for this attempt's rows.
        if state is not None:
            restore(state, self.job.model, self.job.optimizer, run.checkpoints)
        if env.rank == 0:
            # Rows past the checkpoint (or all rows, without one) belong to a dead attempt.
            # First the checkpoints this resume skipped: once their rows are gone, nothing
            # would tell the next resume not to take them.
            run.set_aside_checkpoints_after(self.start)
            run.truncate_metrics(self.start)
            run.write_status("running", stages=rounded(laps.seconds))
        # 6. Set-up's temporaries handed back and its seconds reported; TensorBoard and what
        # every metrics row carries.
        after_setup(self.cfg.launch.keep_freed_memory)
        worker = reduce_setup(laps, args.entered_at, args.launched_at)
        self.setup = (
            attempt_setup(run, env.restart, args.launched_at, worker) if env.rank == 0 else {}
        )
        tensorboard = self.cfg.run.tensorboard and env.rank == 0
        self.board = Board(run / RunDir.TENSORBOARD, self.start) if tensorboard else None
        self.extras = row_extras(self.cfg, self.cache_plan, env.world_size)

    def assemble(
        self,
        part: LocalPart,
        meta: dict[str, Any],
        choice: ModeChoice | None,
        halo_sizes: list[int],
        laps: Laps,
    ) -> Job:
        """The job that trains (worker/assemble.py): the config's, or under `auto` the
        fastest of the candidates tried on this part (`self.cfg` becomes the winner's)."""
        cfg, env = self.cfg, self.env
        used = self.cache_plan if cfg.cache.enabled else None
        trials = [] if choice is None else choice.trials
        # `auto`'s candidates share the part's CSR and data and the static aggregate (the
        # winner keeps them): made once, as a run of one mode makes them, so `choose_s` is
        # the trials'.
        data = DatasetInfo.from_meta(meta)
        shared = part_tensors(cfg, part, data, self.device) if trials else None
        laps.lap("graph_s")
        static = None if shared is None else shared_static(cfg, used, part, shared, env.world_size)
        laps.lap("levels_s")

        def build(
            run_cfg: LeoConfig,
            run_laps: Laps | None,
            tensors: PartTensors | None = shared,
            static_NF: torch.Tensor | None = static,
        ) -> Job:
            return build_job(
                self.run.plan, run_cfg, used, meta, part, env.world_size, self.device,
                halo_sizes, run_laps, tensors, static_NF,
            )  # fmt: skip

        if self.device.type == "cpu":  # CUDA tensors use the CUDA kernels whatever it says
            set_cpu_spmm(cfg.pipeline.spmm)
        # What a trial must repay itself over (planner/auto_mode.py `payback`): the epochs to
        # run, or pipeline.payback_epochs.
        epochs = epochs_to_repay(cfg, self.start)
        if choice is not None and trials:
            job, self.cfg, choice = train_winner(
                self.run, cfg, choice, build, env.rank, laps, epochs
            )
        else:
            job = build(cfg, laps)
        if choice is not None and choice.spmm_trials:
            self.cfg, choice = choose_spmm(self.run, self.cfg, choice, job, env.rank, laps, epochs)
        return job

    def train(self) -> None:
        """Epochs `start + 1 .. train.num_epochs`; rank 0 writes each epoch's row and keeps
        the model of the first epoch with the best validation accuracy."""
        job, train, seed = self.job, self.cfg.train, self.cfg.run.seed
        stats = job.graph.aggregator.stats
        try:
            best = keep_best_of(self.run, self.start) if self.env.rank == 0 else None
            for epoch in range(self.start + 1, train.num_epochs + 1):
                stats.reset()
                loss, times = job.step(seed, epoch)
                if not math.isfinite(loss):
                    raise TrainError(
                        f"training loss became {loss} at epoch {epoch}; lower train.lr "
                        "(checkpoints of earlier epochs, if any, are kept in checkpoints/)."
                    )
                stats.settle()
                row: dict[str, Any] = {"epoch": epoch, "loss": loss, **times}
                step_comm = (stats.wait_s, stats.transfer_s, stats.remote_bytes,
                             stats.published_bytes)  # fmt: skip
                counts, eval_s = None, 0.0
                if epoch % train.eval_every == 0 or epoch == train.num_epochs:
                    t0 = time.perf_counter()
                    counts = job.correct_counts()  # summed over ranks by epoch_stats' gather
                    eval_s = time.perf_counter() - t0
                numbers = epoch_stats(times, *step_comm, stats.remote_bytes, counts)
                if counts is not None:  # the row's order: accuracies, eval_s, the rest
                    row.update({k: numbers.pop(k) for k in ACCURACY_KEYS}, eval_s=eval_s)
                row.update(numbers)
                row.update(self.extras, cold=epoch == self.start + 1)
                if self.env.rank == 0:
                    best = self.record(epoch, row, best)
        finally:
            if self.board is not None:
                self.board.close()

    def record(self, epoch: int, row: dict[str, Any], best: float | None) -> float | None:
        """Rank 0: the epoch's metrics row, the best model when validation improved, and a
        checkpoint every `train.checkpoint_every` epochs; returns the best accuracy so far."""
        train, job = self.cfg.train, self.job
        written = None
        if epoch % train.checkpoint_every == 0 or epoch == train.num_epochs:
            # What the checkpoint will hold, so a resume can tell an edited one.
            model, optimizer = job.model.state_dict(), job.optimizer.state_dict()
            written = {"epoch": epoch, "rng": torch.get_rng_state(), "model": model,
                       "optimizer": optimizer}  # fmt: skip
            row["checkpoint_sha256"] = checkpoint_digest(written).hex()
        self.run.append_metrics(row)
        if self.board is not None:
            self.board.add_row(row)
        val = row.get("val_acc")
        if val is not None and (best is None or val > best):
            best = val
            self.run.save_best(epoch, row_accuracies(row), job.model.state_dict())
        if written is not None:
            self.run.save_checkpoint(epoch, written)  # the very contents of the digest
        return best

    def finish(self) -> None:
        """Rank 0's summary.json, curves.png and final status; then the group's last
        barrier, so that nobody tears it down while a peer still talks to it."""
        peaks = all_gather_(torch.tensor(peak_rss_bytes(), dtype=torch.int64)).tolist()
        if self.env.rank == 0:
            self.setup["static_aggregate"] = self.job.static_layer0
            self.setup["peak_rss_bytes"] = peaks
            finish(self.cfg, self.run, self.cache_plan, self.env.world_size, self.setup)
        if self.env.world_size > 1:
            dist.barrier()


def checked_config(run: RunDir, env: DistEnv, allow_inexact: bool) -> LeoConfig:
    """The run folder's resolved config, checked as the launcher checks it (plain torchrun
    starts workers without it), with this rank pinned where the config says and the kernels
    `LEO_KERNELS` asks for loadable."""
    cfg = load_config(run.config)
    refuse_unresolved(cfg)  # every rank runs the mode leo train resolved, never `auto`
    check_config(cfg, allow_inexact)
    pin_from_config(cfg.launch.cpu_affinity, env.local_rank)  # plain torchrun: not pinned yet
    active_backend()  # LEO_KERNELS=cuda without a loadable extension: one sentence, now
    check_same_host(cfg, env)
    return cfg


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


def join_group(cfg: LeoConfig, env: DistEnv, device: torch.device) -> None:
    """The device's backend and transport checked, then the process group (several ranks)."""
    check_backend(cfg.launch.backend, device.type == "cuda")
    check_transport(cfg, device.type == "cuda")
    if env.world_size > 1:
        backend = pick_backend(device, cfg.launch.backend)
        init_process_group(env, backend, cfg.launch.timeout_s, device)


def tried(choice: ModeChoice | None) -> list[str]:
    """`auto`'s candidates this run tries (modes, then SpMM variants): every rank must try
    the same."""
    if choice is None:
        return []
    return [*choice.trials, *(f"spmm={v}" for v in choice.spmm_trials)]
