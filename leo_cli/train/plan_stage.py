"""The cache-plan stage of a run: part accesses + hardware profile + policy -> cache-plan.json.

`leo profile-cache` runs it on its own; `leo train` runs it before starting workers when the
plan is missing or stale. The hardware profile comes from `--hardware FILE` or
`cache.hardware`, else from the run folder's hardware.json or this machine's saved profile
when measured with as many workers, threads and the same placement (`launch.cpu_affinity`),
else from a short probe through the same launcher as training (then saved in both places).
On several machines (`launch.nnodes > 1`) every node joins that probe (`join_probe`): the run
folder's profile is reused only when it was measured on as many machines with as many workers
and the same placement, a rule every node evaluates alike on the shared folder; no machine
cache is used. The profile also sizes the parts when `partition.part_weights=measured`, and
prices what each node weighs when the part weights are unequal (measured or a list;
`part_weigher`): it is then found or probed before partitioning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leo_cli.cache.access import PartAccess
from leo_cli.cache.cost import ModelShape, Reach
from leo_cli.cache.hardware import HARDWARE_FILE, HIGH_LOAD_SHARE, HardwareProfile, ProbeLoad
from leo_cli.cache.plan import (
    PLAN,
    CachePlan,
    graph_inputs,
    make_plan,
    model_shape,
    plan_inputs,
    plan_key,
    read_plan,
    write_plan,
)
from leo_cli.cache.plot import plot_plan
from leo_cli.cache.speed import measured_weights, work_costs
from leo_cli.comm.rounding import CODECS
from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError, LeoError
from leo_cli.graph.layout import ProgressFn
from leo_cli.graph.partitioners import WorkMeasure
from leo_cli.graph.stage import (
    PartitionResult,
    Weigher,
    ensure_partitions,
    partition_dir,
    weighted,
)
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.graph.types import Graph
from leo_cli.registry import mode_of, prediction_key
from leo_cli.train.allocator import allocator_of
from leo_cli.train.auto_mode import planning_config
from leo_cli.train.elastic import uses_cuda, worker_threads, workers_per_node
from leo_cli.train.in_place import reads_in_place
from leo_cli.train.placement import affinity_tag
from leo_cli.train.probe import run_probe
from leo_cli.train.timing import RunTimer

DTYPE_BYTES = {"float32": 4, "float64": 8}


def halo_bytes(cfg: LeoConfig) -> tuple[int, int, bool]:
    """Bytes per element and per row of a rounded row (`pipeline.halo_dtype`; (0, 0): rows
    are not rounded), and whether its rounding draws random bytes, for the cost model."""
    codec = CODECS[cfg.pipeline.halo_dtype]
    if codec is None:
        return 0, 0, False
    return codec.element_bytes, codec.row_bytes, codec.stochastic


def dtype_key(cfg: LeoConfig) -> str:
    """The numeric types a plan depends on: the training dtype, and the rows' where
    `pipeline.halo_dtype` rounds them (`float32+rows:bfloat16`)."""
    halo = cfg.pipeline.halo_dtype
    return cfg.train.dtype + (f"+rows:{halo}" if cfg.pipeline.rounds_rows else "")


def part_accesses(run_dir: Path, num_parts: int, verify: bool = True) -> list[PartAccess]:
    """The profile of every part (memory-mapped: features stay on disk). `verify` checks the
    parts' checksums first; `leo train` skips it, since every worker verifies its own part
    before training (a plan made from a corrupt part is never used: training stops)."""
    root = partition_dir(run_dir)
    return [
        PartAccess.from_part(read_part(root, r, verify=verify, mmap=True)) for r in range(num_parts)
    ]


def machine_cache(num_workers: int, threads: str) -> Path:
    """Where this machine's profile for a worker count and placement is kept between runs.

    `threads` is `placement(cfg)`. `LEO_HARDWARE_CACHE` names the folder (default
    ~/.cache/leo/hardware).
    """
    root = os.environ.get("LEO_HARDWARE_CACHE") or Path.home() / ".cache" / "leo" / "hardware"
    quick = "-quick" if quick_probe() else ""  # never in place of a full profile
    name = f"{socket.gethostname()}-p{num_workers}-t{threads}-torch{torch.__version__}{quick}.json"
    return Path(root) / name


def placement(cfg: LeoConfig) -> str:
    """Rank 0's threads, when pinned a tag of every worker's cores (`launch.cpu_affinity`), and
    the allocator unless the system's: what a profile must have been measured with to be
    reused."""
    affinity = cfg.launch.cpu_affinity
    threads = worker_threads(workers_per_node(cfg), affinity[0] if affinity else None)
    return threads + affinity_tag(affinity) + allocator_tag(allocator_of(cfg.launch.allocator).name)


def placement_of(hw: HardwareProfile) -> str:
    """`placement` of the launch that measured a profile."""
    return f"{hw.threads_per_worker}{affinity_tag(hw.cpu_affinity)}{allocator_tag(hw.allocator)}"


def allocator_tag(name: str) -> str:
    """The allocator's part of a placement tag (none for the system's: older names stand)."""
    return "" if name == "system" else f"-{name}"


def matches(hw: HardwareProfile, num_workers: int, threads: str) -> bool:
    """Measured here, with this torch, as many workers, threads and the same placement, at
    the probe sizes asked for (`LEO_PROBE_QUICK`)."""
    return (
        hw.world_size == num_workers
        and placement_of(hw) == threads
        and hw.hostname == socket.gethostname()
        and hw.torch_version == torch.__version__
        and hw.quick == quick_probe()
    )


def quick_probe(nnodes: int = 1) -> bool:
    """`LEO_PROBE_QUICK=1`: probe with the tiny sizes (a few seconds, rough rates; the test
    suite's setting: its plans need rates, not good ones). Profiles say `quick`. One machine
    only: nodes reading their own environments could disagree on the sizes and wait for
    each other's probe collectives."""
    raw = os.environ.get("LEO_PROBE_QUICK", "0")
    if raw not in ("0", "1"):
        raise CacheError(f"LEO_PROBE_QUICK={raw!r} must be 1 (tiny probe sizes) or 0.")
    return raw == "1" and nnodes == 1


def fits_nodes(hw: HardwareProfile, cfg: LeoConfig, num_workers: int) -> bool:
    """A profile of a multi-node run that every node agrees to reuse: as many machines and
    workers, the same placement, and the allocator `launch.allocator` names (each node's
    threads may differ, and under `auto` so may its allocator, as may one the user preloads
    (train/allocator.py); the config may not)."""
    setting = cfg.launch.allocator
    return (
        hw.world_size == num_workers
        and hw.nnodes == cfg.launch.nnodes
        and hw.cpu_affinity == cfg.launch.cpu_affinity
        and (setting == "auto" or hw.allocator in (setting, "user"))
    )


def needs_profile(cfg: LeoConfig) -> bool:
    """Whether this run uses a hardware profile: for its cache plan, or to size its parts."""
    return cfg.cache.policy != "none" or weighted(cfg.partition)


def join_probe(cfg: LeoConfig, run_dir: Path) -> None:
    """On a node other than 0: take part in the probe node 0 is about to run, if it will.

    Node 0 probes when the run needs a profile, none was given and the run folder's does not
    fit (`fits_nodes`); every node sees the same folder and config, so they all decide alike
    and meet in the probe's rendezvous. Node 0 writes the profile.
    """
    if not needs_profile(cfg) or cfg.cache.hardware is not None:
        return
    own = saved_profile(run_dir / HARDWARE_FILE)
    if own is None or not fits_nodes(own, cfg, cfg.partition.num_parts):
        run_probe(cfg, run_dir)  # several machines: full sizes (quick_probe)


def saved_profile(path: Path) -> HardwareProfile | None:
    """A saved copy, or None when it is missing or unreadable (a cache: probe again)."""
    if not path.is_file():
        return None
    try:
        return HardwareProfile.read(path)
    except CacheError:
        return None


def hardware_profile(
    cfg: LeoConfig,
    run_dir: Path,
    given: Path | None,
    num_workers: int,
    reprobe: bool = False,
    timer: RunTimer | None = None,
) -> HardwareProfile:
    """The given profile (kept as the run folder's); else the run folder's profile when it was
    measured with as many workers; else this machine's saved one for as many workers and
    threads; else a probe (saved in both places). `--force` probes again. `timer` gets the
    probe's seconds (spent now, or when a reused profile was measured)."""
    timer = timer or RunTimer()
    hw = _find_profile(cfg, run_dir, given, num_workers, reprobe)
    if hw is not None:
        timer.add("probe_s", hw.probe_s, ran=False)
        return hw
    t0 = time.perf_counter()
    hw = run_probe(cfg, run_dir, quick=quick_probe(cfg.launch.nnodes))
    timer.add("probe_s", time.perf_counter() - t0, ran=True)
    if hw.load is not None and hw.load.high(load_limit()):
        print(busy_note(hw.load, run_dir), file=sys.stderr)
        return hw  # kept in the run folder only
    if cfg.launch.nnodes > 1:
        return hw  # several machines: the run folder's alone
    with contextlib.suppress(OSError):  # an unwritable home only costs a probe next time
        hw.write(machine_cache(num_workers, placement(cfg)))
    return hw


def _find_profile(
    cfg: LeoConfig, run_dir: Path, given: Path | None, num_workers: int, reprobe: bool
) -> HardwareProfile | None:
    """A profile that needs no probe (see `hardware_profile`), or None."""
    path = given or cfg.cache.hardware
    if path is not None:  # kept in the run folder too, so later stages use the same one
        hw = HardwareProfile.read(Path(path))
        if Path(path).resolve() != (run_dir / HARDWARE_FILE).resolve():
            hw.write(run_dir / HARDWARE_FILE)
        return hw
    own = None if reprobe else saved_profile(run_dir / HARDWARE_FILE)
    if cfg.launch.nnodes > 1:  # what every node decides alike (join_probe)
        return own if own is not None and fits_nodes(own, cfg, num_workers) else None
    threads = placement(cfg)
    if (
        own is not None
        and own.world_size == num_workers
        and placement_of(own) == threads
        and own.quick == quick_probe()
    ):
        return own
    machine = None if reprobe else saved_profile(machine_cache(num_workers, threads))
    if machine is not None and matches(machine, num_workers, threads):
        machine.write(run_dir / HARDWARE_FILE)
        return machine
    if cfg.launch.device == "cuda" or (cfg.launch.device == "auto" and torch.cuda.is_available()):
        print(
            "warning: the hardware probe measures CPU kernels and the process group on the "
            "host, so the plan's predicted times do not describe GPU training; pass a profile "
            "with --hardware (or cache.hardware) or use cache.policy=degree or none.",
            file=sys.stderr,
        )
    return None


def load_limit() -> float:
    """Share of the cores other processes may keep busy during a probe that is saved for the
    whole machine (`LEO_PROBE_LOAD_LIMIT`, default 0.25; a machine that is always shared may
    raise it)."""
    raw = os.environ.get("LEO_PROBE_LOAD_LIMIT")
    try:
        limit = float(raw) if raw else HIGH_LOAD_SHARE
    except ValueError:
        raise CacheError(
            f"LEO_PROBE_LOAD_LIMIT={raw!r} is not a number; give a share of the cores such as 0.5."
        ) from None
    if not limit >= 0:  # also NaN
        raise CacheError(f"LEO_PROBE_LOAD_LIMIT={raw!r} must be a share of the cores >= 0.")
    return limit


def busy_note(load: ProbeLoad, run_dir: Path) -> str:
    """The sentence for a probe measured while other processes kept the machine busy."""
    what = (
        f"other processes kept {load.other_cpu:.1f} of {load.num_cpus} cores busy"
        if load.other_cpu is not None
        else f"the load average was {load.load_avg_1m:.1f} on {load.num_cpus} cores"
    )
    return (
        f"note: {what} while the hardware probe ran, so its rates are this machine's under "
        f"load: kept in {run_dir / HARDWARE_FILE} only, not saved for later runs; probe again "
        "on a quiet machine with `leo profile-cache --force`."
    )


def part_weigher(
    cfg: LeoConfig, run_dir: Path, timer: RunTimer | None = None, hardware: Path | None = None
) -> Weigher | None:
    """For unequal part weights (`measured` or a list): the weigher of the partition stage,
    from the run's hardware profile (`hardware`, or found, or probed now, before
    partitioning): the shares (`measured` only) and what each node weighs; None otherwise.

    Its key covers the profile and what the work is priced for (model, dtype, layer 0's
    level), so new rates or another model rebuild the parts.
    """
    if not weighted(cfg.partition):
        return None
    num = cfg.partition.num_parts
    hw = hardware_profile(cfg, run_dir, hardware, num, timer=timer)
    static = static_layer0(cfg)
    dtype = cfg.train.dtype
    material = [hw.fingerprint(), cfg.model.model_dump(mode="json"), dtype_key(cfg), static]
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def shape_of(graph: Graph) -> ModelShape:
        return model_shape(
            cfg.model, graph.num_features, graph.num_classes, DTYPE_BYTES[dtype],
            halo_bytes(cfg),
        )  # fmt: skip

    def weigh(graph: Graph) -> list[float]:
        return measured_weights(hw, shape_of(graph), graph.num_nodes, graph.num_edges, static)

    def work(graph: Graph) -> WorkMeasure:
        costs = work_costs(hw, shape_of(graph), graph.num_nodes, graph.num_edges, static)
        return WorkMeasure("cost", *costs)

    measured = cfg.partition.part_weights == "measured"
    return Weigher(key, weigh if measured else None, work)


def static_layer0(cfg: LeoConfig) -> bool:
    """Whether a plan would run layer 0 on the static aggregate (cache level L1s)."""
    c = cfg.cache
    no_input_dropout = cfg.model.effective_input_dropout == 0
    return (
        c.policy != "none" and c.static_aggregate and no_input_dropout and cfg.model.admits_replicas
    )


def run_partitions(
    cfg: LeoConfig,
    run_dir: Path,
    progress: ProgressFn | None = None,
    verify: bool = True,
    force: bool = False,
    hardware: Path | None = None,
) -> PartitionResult:
    """The run's partitions (`graph.stage.ensure_partitions`), sized by measured speeds when
    `partition.part_weights=measured` and by the cost model's work when the weights are
    unequal (the probe then runs first, unless `hardware` names a profile)."""
    weigher = part_weigher(cfg, run_dir, hardware=hardware)
    part = cfg.partition
    return ensure_partitions(
        cfg.data, part, cfg.run.seed, run_dir, force, progress, verify, weigher=weigher
    )


def ensure_plan(
    cfg: LeoConfig,
    run_dir: Path,
    hardware: Path | None = None,
    force: bool = False,
    always: bool = False,
    timer: RunTimer | None = None,
    verify_parts: bool = True,
) -> CachePlan | None:
    """The run's cache plan, made when missing or stale.

    Training needs none with `cache.policy=none` (None is returned); `always` makes one
    anyway (`leo profile-cache` shows the predictions of every mode). Under
    `pipeline.mode=auto` it is the planned mode's plan (train/auto_mode.py). `timer` gets the
    probe's and the plan's seconds (`plan_s`: accesses, policy, predictions, plot).
    `verify_parts=False` leaves the parts' checksums to the workers (see `part_accesses`).
    """
    timer = timer or RunTimer()
    if cfg.cache.policy == "none" and not always:
        return None
    meta = read_meta(partition_dir(run_dir))
    dataset = meta["dataset"]
    num_parts = int(meta["num_parts"])
    hw = hardware_profile(cfg, run_dir, hardware, num_parts, reprobe=force, timer=timer)
    t0 = time.perf_counter()
    reach = reach_of(cfg, num_parts)
    inputs, graph_key = plan_digests(cfg, meta, num_parts)
    key = plan_key(inputs, hw)
    existing = None if force else read_plan(run_dir)
    if existing is not None and existing.key == key:
        attention, layers = cfg.model.attention, cfg.model.num_layers
        existing.check_fits(
            run_dir / PLAN, halo_sizes(meta), layers, attention, cfg.pipeline.rounds_rows
        )
        timer.add("plan_s", existing.plan_s or 0.0, ran=False)
        return existing
    accesses = part_accesses(run_dir, num_parts, verify_parts)
    shape = model_shape(
        cfg.model,
        int(dataset["num_features"]),
        int(dataset["num_classes"]),
        DTYPE_BYTES[cfg.train.dtype],
        halo_bytes(cfg),
    )
    chunks = cfg.pipeline.num_chunks
    plan = make_plan(cfg.cache, accesses, shape, hw, (key, inputs, graph_key), chunks, reach)
    plot_plan(plan, run_dir / "cache-plan.png")
    plan.plan_s = round(time.perf_counter() - t0, 4)
    write_plan(run_dir, plan)
    timer.add("plan_s", plan.plan_s, ran=True)
    return plan


def plan_digests(cfg: LeoConfig, meta: dict[str, Any], num_parts: int) -> tuple[str, str]:
    """The digests a plan is made for and checked against, (inputs, graph inputs): one place,
    so the plan stage, the workers and the summary agree."""
    reach, chunks = reach_of(cfg, num_parts), cfg.pipeline.num_chunks
    return (
        plan_inputs(meta, cfg.model, cfg.cache, dtype_key(cfg), chunks, reach),
        graph_inputs(meta, cfg.model, dtype_key(cfg), chunks, reach),
    )


def reach_of(cfg: LeoConfig, num_parts: int) -> Reach:
    """Which ranks' rows each rank can read in place (comm/inplace.py): those on its host,
    in a mode that reads in place, on CPU (on GPUs only under
    `pipeline.transport=shared-memory`), unless `pipeline.transport=process-group` (or
    attention: its rows are not read in place); every row of them under
    `pipeline.transport=shared-memory` (train/assemble.py reads_in_place decides alike).
    Under `pipeline.mode=auto`, the planned mode's (the plan is made for it: auto_mode.py)."""
    cfg = planning_config(cfg)
    if not reads_in_place(cfg, "cuda" if uses_cuda(cfg.launch) else "cpu"):
        return Reach.none(num_parts)
    # Workers per node as launched (train/elastic.py workers_per_node, without its checks:
    # a pinned worker calls this too, and sees only its own cores).
    per_node = cfg.launch.nproc or max(num_parts // cfg.launch.nnodes, 1)
    host = np.arange(num_parts) // per_node
    published = host[:, None] == host[None, :]
    np.fill_diagonal(published, False)
    return Reach(published, every_row=cfg.pipeline.transport == "shared-memory")


def halo_sizes(meta: dict[str, Any]) -> list[int]:
    """Every part's halo rows, as META.json records them (checked by graph/storage.py)."""
    return [int(n) for n in meta["stats"]["halo_nodes"]]


def predicted_time(run_dir: Path, cfg: LeoConfig) -> float | None:
    """The plan's predicted step time of this run's mode, when the run folder's plan was made
    for these partitions and settings (the plan the workers ran with). With a cache, the
    planned mode's is the plan's own prediction and another exact mode's the one priced with
    what it can use of the plan's levels (`predicted_run_s`); without a cache, every mode's
    (the planned mode under its cache-free benchmark name, registry.prediction_key)."""
    plan = _plan_for(run_dir, cfg)
    if plan is None:
        return None
    if _runs_levels_unplanned(cfg):
        return plan.predicted_run.get(cfg.pipeline.mode)
    return plan.predicted.get(prediction_key(cfg.pipeline.mode, cfg.cache.policy != "none"))


def predicted_busy(run_dir: Path, cfg: LeoConfig) -> list[float] | None:
    """Each rank's predicted busy time (its own work, no waiting) in this run's mode, from a
    plan made for this run (as `predicted_time`); None for a mode other than the planned one
    run with a cache (the plan keeps only its step, not its ranks)."""
    plan = _plan_for(run_dir, cfg)
    if plan is None or _runs_levels_unplanned(cfg):
        return None
    ranks = plan.ranks_s.get(prediction_key(cfg.pipeline.mode, cfg.cache.policy != "none"))
    return None if not ranks else [r["busy_s"] for r in ranks]


def _runs_levels_unplanned(cfg: LeoConfig) -> bool:
    """Whether this run uses a cache plan's levels in a mode the plan was not made for."""
    return cfg.cache.policy != "none" and not mode_of(cfg.pipeline.mode).planned


def _plan_for(run_dir: Path, cfg: LeoConfig) -> CachePlan | None:
    """The run folder's plan, when it was made for these partitions and settings (with a
    cache, its levels and prices; without, the graph and partitions alone)."""
    try:
        plan = read_plan(run_dir)
        meta = read_meta(partition_dir(run_dir))
    except LeoError:
        return None
    if plan is None:
        return None
    cached = cfg.cache.policy != "none"
    inputs, graph_key = plan_digests(cfg, meta, int(meta["num_parts"]))
    fresh = plan.inputs == inputs if cached else plan.graph_inputs == graph_key
    return plan if fresh else None
