"""The benchmark suite: every (system, mode, world size, bench variant) row, interleaved over
rounds.

LEO rows run through the real `leo train` path (launcher, elastic workers, partitions on
disk, reused across rows of one world size and bench variant); peers run in their own process.
`bench.variants` (named `--set` overrides, such as `partition.part_weights=measured`) multiply
the LEO rows: each runs in a run folder of its own (`<out_dir>/<variant>/p<P>`). Each round
runs every row once (A B C A B C ...), so a slow phase of a shared machine hits all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leo_cli.bench import stats
from leo_cli.bench.modes import bench_mode_of
from leo_cli.bench.peers import peer_command, peer_missing, write_peer_files
from leo_cli.config import LeoConfig, write_resolved
from leo_cli.config.load import validate, with_overrides
from leo_cli.config.schema import BenchVariant, CacheConfig, EmulateConfig
from leo_cli.errors import ConfigError, TrainError
from leo_cli.launch.allocator import workers_allocator
from leo_cli.launch.emulate import bits_per_second, check_split
from leo_cli.launch.nodes import run_nodes
from leo_cli.launch.setup import Ask, check_supported, run_setup
from leo_cli.planner.auto_mode import from_json
from leo_cli.planner.plan import static_layer0
from leo_cli.registry import is_auto, peer_of, planned_mode, policy_of
from leo_cli.run_dir import RunDir

LEO = "leo"  # the system of LEO's rows (the peers' are theirs: pyg, pyg-csr, dgl)
NEVER = 10**9  # an epoch interval that never comes (no evaluation, no checkpoint mid-run)

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Variant:
    """One row of the benchmark."""

    system: str  # leo, or a peer (bench.peers)
    mode: str  # a bench mode for LEO rows; the system's name for peers
    world_size: int
    static_aggregate: bool | None = None  # None: as the config says; False: turned off
    variant: str | None = None  # a bench.variants name (None: the config as it is)

    @property
    def label(self) -> str:
        off = " no-static" if self.static_aggregate is False else ""
        named = f" [{self.variant}]" if self.variant is not None else ""
        return f"{self.system}/{self.mode}{off}{named} P={self.world_size}"


@dataclass
class Measured:
    """What the rounds of one variant measured."""

    variant: Variant
    round_medians: list[float] = field(default_factory=list)
    epochs: list[float] = field(default_factory=list)
    dropped: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)


def variants(cfg: LeoConfig, skip: Callable[[str], None]) -> list[Variant]:
    """LEO modes per world size (each once per bench variant), then the peers at world size
    1. At world size 1 every mode is the same single process: one row, plus one without the
    static aggregate where it applies (the same algorithm as the peers; the precompute is a
    row of its own)."""
    out = []
    planned = planned_mode()
    names: list[str | None] = [v.name for v in bench_variants(cfg)] or [None]
    # One process crosses no link: its rows once per bench variant (at the first rate).
    alone = names[: max(len(cfg.bench.variants), 1)] if cfg.bench.links else names
    if cfg.launch.emulate is not None:  # every world size spreads over the nodes (but one)
        for w in cfg.bench.world_sizes:
            if w > 1:
                check_split(w, cfg.launch.emulate.nodes)
    for w in cfg.bench.world_sizes:
        for name in names:
            if w == 1:
                if name not in alone:
                    continue
                out.append(Variant(LEO, planned, 1, variant=name))
                if static_layer0(variant_config(cfg, name)):
                    out.append(Variant(LEO, planned, 1, static_aggregate=False, variant=name))
                continue
            out += [Variant(LEO, m, w, variant=name) for m in cfg.bench.modes]
    return out + peer_variants(cfg, skip)


def peer_variants(cfg: LeoConfig, skip: Callable[[str], None]) -> list[Variant]:
    """A row per peer of `bench.peers` that can run here; one sentence per reason for those
    that cannot (their rows skipped).

    Raises:
        ConfigError: `bench.peer_python` cannot be run.
    """
    out, missing = [], dict[str, list[str]]()
    for name in cfg.bench.peers:
        reason = peer_missing(cfg, peer_of(name))
        if reason is None:
            out.append(Variant(name, name, 1))
        else:
            missing.setdefault(reason, []).append(name)
    for reason, names in missing.items():
        rows = "row is" if len(names) == 1 else "rows are"
        skip(f"{reason}: the {' and '.join(names)} {rows} skipped.")
    return out


def bench_variants(cfg: LeoConfig) -> list[BenchVariant]:
    """`bench.variants`, each at every rate of `bench.links` (`link-<rate>`, or
    `<variant>+link-<rate>`); the variants alone without links."""
    if not cfg.bench.links:
        return cfg.bench.variants
    out = []
    for link in cfg.bench.links:
        tag = f"link-{link or 'unlimited'}"
        base: list[BenchVariant | None] = [*cfg.bench.variants] or [None]
        for v in base:
            sets = [f"launch.emulate.link={link or 'null'}"]
            if v is None:
                out.append(BenchVariant(name=tag, set=sets))
            else:
                out.append(BenchVariant(name=f"{v.name}+{tag}", set=[*v.set, *sets]))
    return out


def variant_config(cfg: LeoConfig, name: str | None) -> LeoConfig:
    """The bench config with a bench variant's overrides applied (None: as it is).

    Raises:
        ConfigError: an override is not a valid setting (naming the variant and the key).
    """
    if name is None:
        return cfg
    variant = next(v for v in bench_variants(cfg) if v.name == name)
    return with_overrides(cfg, variant.set, f"bench.variants {name}")


def run_folder(out_dir: Path, v: Variant) -> Path:
    """Where a LEO row runs: one folder per world size (and bench variant)."""
    return (out_dir if v.variant is None else out_dir / v.variant) / f"p{v.world_size}"


def leo_config(cfg: LeoConfig, v: Variant, out_dir: Path) -> LeoConfig:
    """The `leo train` config of a LEO variant (one run folder per world size and bench
    variant): the variant's overrides, its pipeline mode, the cache policy the benchmark
    gives it (the baselines run without a cache), and no setting its mode would refuse;
    `auto`'s trials repay over the config's own `train.num_epochs` unless it sets
    `pipeline.payback_epochs`."""
    # The variant's overrides are validated at this row's worker count (a variant may list
    # one part weight per worker).
    sized = cfg.model_copy(
        update={"partition": cfg.partition.model_copy(update={"num_parts": v.world_size})}
    )
    cfg = variant_config(sized, v.variant)
    epochs = cfg.bench.warmup_epochs + cfg.bench.num_epochs
    if is_auto(v.mode):  # a user's default run, its candidates measured every round
        # ... and weighed by the run the user would train, not the bench's few epochs
        repay = cfg.pipeline.payback_epochs or cfg.train.num_epochs
        pipeline = {"mode": v.mode, "choose": "remeasure", "payback_epochs": repay}
        return row_config(cfg, v, out_dir, epochs, {}, pipeline)
    mode = bench_mode_of(v.mode)
    cache: dict[str, Any] = {"policy": mode.policy or cfg.cache.policy}
    if not policy_of(cache["policy"]).caches:  # level settings a run without a cache refuses
        for key in ("static_aggregate", "replica_budget_mb"):
            cache[key] = CacheConfig.model_fields[key].default
    if v.static_aggregate is False:
        cache["static_aggregate"] = False
    pipeline = {"mode": mode.runs.name}
    if not mode.runs.chunks:
        pipeline["num_chunks"] = "auto"
    return row_config(cfg, v, out_dir, epochs, cache, pipeline)


def row_config(
    cfg: LeoConfig,
    v: Variant,
    out_dir: Path,
    epochs: int,
    cache: dict[str, Any],
    pipeline: dict[str, Any],
) -> LeoConfig:
    """A LEO row's config: its run folder, worker count, cache and pipeline settings, the
    bench's epochs, no evaluation or checkpoint mid-run, no emulation for one process."""
    launch: dict[str, Any] = {"nproc": None}
    bench = cfg.bench
    if v.world_size == 1:  # one process: no node to emulate, no link to cross
        launch["emulate"] = None
        bench = bench.model_copy(update={"links": []})
    return cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"out_dir": run_folder(out_dir, v)}),
            "partition": cfg.partition.model_copy(update={"num_parts": v.world_size}),
            "launch": cfg.launch.model_copy(update=launch),
            "bench": bench,
            "pipeline": cfg.pipeline.model_copy(update=pipeline),
            "cache": cfg.cache.model_copy(update=cache),
            "train": cfg.train.model_copy(
                update={"num_epochs": epochs, "eval_every": NEVER, "checkpoint_every": NEVER}
            ),
        }
    )


def run_leo(
    cfg: LeoConfig, v: Variant, out_dir: Path, progress: ProgressFn | None
) -> dict[str, Any]:
    """One `leo train` run; per-epoch times of the timed epochs and the run's summary."""
    run_cfg = leo_config(cfg, v, out_dir)
    inexact = not is_auto(v.mode) and not bench_mode_of(v.mode).runs.exact
    emulated = run_cfg.launch.emulate
    if emulated is not None:  # every node runs `leo train`, as on a cluster
        flags = ["--overwrite"] + ["--allow-inexact"] * inexact  # rounds reuse the folder
        run_nodes(run_cfg, "train", flags, quiet=True)
        run_dir = run_cfg.run.folder.resolve()
    else:
        run_dir = run_setup(Ask.train(run_cfg, allow_inexact=inexact, progress=progress)).run_dir
    rows = RunDir(run_dir).read_metrics()[cfg.bench.warmup_epochs :]
    summary = RunDir(run_dir).read_summary()
    reused = summary.get("setup_reused_s", {})
    return {
        # What a fresh run pays: the partitions and plan this run reused cost that much to
        # make (the probe is once per machine and worker count, listed apart).
        "setup_s": summary["setup_s"] + reused.get("partition_s", 0) + reused.get("plan_s", 0),
        "run_setup_s": summary["setup_s"],  # what this run paid itself, within its wall_s
        "setup_parts_s": summary["setup_parts_s"],
        "setup_reused_s": reused,
        "wall_s": summary.get("wall_s"),
        "static_aggregate": summary.get("static_aggregate", False),
        "epoch_times": [r["epoch_time_s"] for r in rows],
        "comm_bytes_per_epoch": median_of(rows, "step_comm_bytes"),
        "comm_wait_s": median_of(rows, "comm_wait_s"),
        "test_acc": summary.get("final_test_acc"),
        "exact": summary.get("exact", True),
        "predicted_epoch_time_s": summary.get("predicted_epoch_time_s"),
        "final_loss": summary.get("final_loss"),
        "halo_dtype": summary.get("halo_dtype"),
        "allocator": summary.get("allocator"),
        "kernels": summary.get("kernels"),
        "spmm": summary.get("spmm"),  # the CPU SpMM variant that trained (pipeline.spmm)
        "peak_rss_bytes": summary.get("peak_rss_bytes"),
        "peak_rss_total_bytes": summary.get("peak_rss_total_bytes"),
        "rank_busy_s": rank_medians(rows, "rank_busy_s"),
        "predicted_rank_busy_s": summary.get("predicted_rank_busy_s"),
        "mode_ran": ran_name(summary),
        # the cost model's prediction of the mode that ran, scaled by earlier trials here
        "calibrated_epoch_time_s": dict(summary.get("mode_calibrated_s") or {}).get(
            str(summary.get("mode"))
        ),
        **link_fields(emulated),
        **(trial_fields(summary) if is_auto(v.mode) else {}),
    }


def trial_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """What an `auto` run's trials measured (its round in bench.json `auto_rounds`): each
    candidate's median trial step, why one was not tried or stopped, the SpMM variant's, and
    the predictions it chose from."""
    keys = ("mode_measured_s", "mode_notes", "mode_predicted_s", "mode_calibrated_s",
            "spmm_measured_s")  # fmt: skip
    return {"trials": {k: summary.get(k) for k in keys}}


def ran_name(summary: dict[str, Any]) -> str | None:
    """The candidate a run trained (`leo/no-replicas`), as its summary records it."""
    try:
        return from_json(summary).name
    except ValueError:
        return None


def link_fields(emulated: EmulateConfig | None) -> dict[str, Any]:
    """A row's `nodes`, `link` (node 0's uplink, `unlimited`) and its bits per second (0:
    unlimited; None: not emulated)."""
    if emulated is None:
        return {"nodes": 1, "link": None, "link_bits_per_s": None}
    rate = emulated.rates()[0]
    bits = 0.0 if rate is None else bits_per_second(rate)
    return {"nodes": emulated.nodes, "link": rate or "unlimited", "link_bits_per_s": bits}


def rank_medians(rows: list[dict[str, Any]], key: str) -> list[float] | None:
    """Per rank, the median over the timed epochs of a per-rank list (`rank_busy_s`)."""
    lists = [r[key] for r in rows if isinstance(r.get(key), list)]
    if not lists or any(len(x) != len(lists[0]) for x in lists):
        return None
    return [stats.spread(list(col))["median"] for col in zip(*lists, strict=True)]


def median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return stats.spread(values)["median"] if values else None


def run_peer(cfg: LeoConfig, v: Variant, out_dir: Path) -> dict[str, Any]:
    """One peer run in its own process, with all the cores LEO's single worker gets."""
    write_resolved(cfg.model_copy(update={"run": cfg.run.model_copy(update={"out_dir": out_dir})}))
    os.replace(RunDir(out_dir).config, out_dir / "peer_config.yaml")
    epochs = cfg.bench.warmup_epochs + cfg.bench.num_epochs
    threads = str(os.cpu_count() or 1)
    cmd = peer_command(cfg, peer_of(v.system), out_dir, epochs)
    env = {**os.environ, **workers_allocator(cfg.launch).env}  # the workers' allocator
    env["OMP_NUM_THREADS"] = threads  # DGL's own kernels take their thread count from it
    proc = subprocess.run(
        [*cmd, "--threads", threads], capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TrainError(
            f"the {v.system} peer failed ({last}); rerun with bench.peers=[] to skip it."
        )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["epoch_times"] = result["epoch_times"][cfg.bench.warmup_epochs :]
    result.update(comm_bytes_per_epoch=0, comm_wait_s=0.0, exact=True)
    return result


def run_suite(
    cfg: LeoConfig,
    out_dir: Path,
    on_run: Callable[[int, int, Variant], None],
    progress: ProgressFn | None = None,
    skip: Callable[[str], None] = lambda _: None,
    on_round: Callable[[list[Measured]], None] = lambda _: None,
) -> list[Measured]:
    """Every variant once per round, `bench.repeats` rounds; returns what each measured.

    `on_round` receives the measurements so far after every round (partial results survive
    an interrupted benchmark).
    """
    todo = variants(cfg, skip)
    write_peer_files(cfg, out_dir, [peer_of(v.system) for v in todo if v.system != LEO])
    measured = {v: Measured(v) for v in todo}
    total = len(todo) * cfg.bench.repeats
    for r in range(cfg.bench.repeats):
        for i, v in enumerate(todo):
            on_run(r * len(todo) + i, total, v)
            if v.system == LEO:
                run = run_leo(cfg, v, out_dir, progress)
            else:
                run = run_peer(cfg, v, out_dir)
            record(measured[v], run)
        on_round([measured[v] for v in todo])
    on_run(total, total, todo[-1])
    return [measured[v] for v in todo]


def record(m: Measured, run: dict[str, Any]) -> None:
    kept = stats.drop_disturbed(run["epoch_times"])
    m.dropped += len(run["epoch_times"]) - len(kept)
    m.epochs += kept
    m.round_medians.append(stats.spread(kept)["median"])
    m.runs.append(run)


def check_bench(cfg: LeoConfig) -> None:
    """Settings a benchmark cannot run with, as one sentence each."""
    if cfg.launch.nnodes > 1:
        raise ConfigError(
            "leo bench runs on one machine (launch.nnodes=1); benchmark multi-node jobs with "
            "leo train on each node."
        )
    if cfg.launch.nproc is not None:
        raise ConfigError(
            "launch.nproc is set by leo bench from bench.world_sizes; remove launch.nproc."
        )
    check_runs(cfg)


def check_runs(cfg: LeoConfig) -> None:
    """Every `leo train` the suite will run, checked before the first (a bench variant's
    override, or a placement for another worker count, would otherwise stop it midway)."""
    for v in variants(cfg, lambda _: None):
        if v.system == LEO:
            try:  # validated again: the suite sets num_parts, which part_weights must fit
                run_cfg = leo_config(cfg, v, cfg.run.folder)
                validate(run_cfg.model_dump(mode="json"), "leo bench")
                check_supported(run_cfg, allow_inexact=True)
            except ConfigError as exc:
                where = f"bench variant {v.variant} at " if v.variant else "at "
                raise ConfigError(f"{where}{v.world_size} workers: {exc}") from None
