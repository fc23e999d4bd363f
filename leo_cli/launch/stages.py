"""The hardware profile, part weights and cache plan of a run: part accesses + hardware
profile + policy -> cache-plan.json.

launch/setup.py runs these steps in order as stages of the set-up pipeline (`given_profile`,
`saved_profile_for` or `new_profile`, `weigher_for`, `plan_for`), each going down the layers
with what the stage hands it (paths, placement); `find_profile`, `part_weigher`,
`run_partitions` and `ensure_plan` chain them for callers outside it (the elastic workers'
re-forming of a run). The hardware
profile comes from `--hardware` or `cache.hardware`, a saved profile measured under the same
conditions, or a short probe through the training launcher (every node joins it on several
machines: `join_probe`); it also weighs the parts when their weights are unequal.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import torch

from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError
from leo_cli.graph.layout import ProgressFn
from leo_cli.graph.partition_cache import (
    PartitionResult,
    Weigher,
    ensure_partitions,
    weighted,
)
from leo_cli.graph.partitioners import WorkMeasure
from leo_cli.graph.storage import META, read_meta, read_part
from leo_cli.graph.types import Graph
from leo_cli.harness.placement import affinity_tag, machine_cores
from leo_cli.launch.allocator import allocator_of
from leo_cli.launch.elastic import worker_threads, workers_per_node
from leo_cli.launch.probe import run_probe
from leo_cli.launch.run_folder import machine_cache_dir
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape
from leo_cli.planner.make import make_plan, model_shape, plan_key
from leo_cli.planner.plan import (
    DTYPE_BYTES,
    PLAN,
    CachePlan,
    PlanInputs,
    dtype_key,
    halo_bytes,
    halo_sizes,
    plan_bytes,
    read_plan,
    static_layer0,
    write_plan,
)
from leo_cli.planner.plot import plot_plan
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.profile.store import (
    allocator_tag,
    busy_cache,
    busy_note,
    busy_now,
    busy_reuse_note,
    fits_nodes,
    load_limit,
    machine_cache,
    matches,
    quick_probe,
    saved_profile,
)
from leo_cli.planner.weights import measured_weights, work_costs
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.timing import RunTimer

_kept: dict[tuple[str, int, bytes, bool], list[PartAccess]] | None = None
PROFILE_THREADS = 4  # parts profiled at once, at most


@contextlib.contextmanager
def accesses_kept() -> Iterator[None]:
    """Inside, `part_accesses` profiles the same parts once (`leo train` under
    `pipeline.mode=auto` plans twice: the planned mode, then the chosen one's levels)."""
    global _kept
    if _kept is not None:  # nested: the outer one keeps them
        yield
        return
    _kept = {}
    try:
        yield
    finally:
        _kept = None


def part_accesses(run_dir: Path, num_parts: int, verify: bool = True) -> list[PartAccess]:
    """The profile of every part (memory-mapped: features stay on disk). `verify` checks the
    parts' checksums first; `leo train` skips it, since every worker verifies its own part
    before training (a plan made from a corrupt part is never used: training stops)."""
    root = RunDir(run_dir).partitions
    kept = _kept
    meta = (root / META).read_bytes() if kept is not None else b""
    key = (str(root.resolve()), num_parts, meta, verify)
    if kept is not None and key in kept:
        return kept[key]

    def profile(rank: int) -> PartAccess:
        return PartAccess.from_part(read_part(root, rank, verify=verify, mmap=True))

    # numpy leaves the lock while it counts: parts are profiled side by side, a few at a time
    # (each holds temporaries the size of its edges).
    threads = max(1, min(num_parts, len(machine_cores()), PROFILE_THREADS))
    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(profile, range(num_parts)))
    if kept is not None:
        kept[key] = found
    return found


def placement(cfg: LeoConfig, nproc: int) -> str:
    """Rank 0's threads (of `nproc` workers on this node: `workers_per_node`), when pinned a
    tag of every worker's cores (`launch.cpu_affinity`), and the allocator unless the
    system's: what a profile must have been measured with to be reused."""
    affinity = cfg.launch.cpu_affinity
    threads = worker_threads(nproc, affinity[0] if affinity else None)
    allocator = allocator_tag(allocator_of(cfg.launch.allocator).name)
    return threads + affinity_tag(affinity) + allocator


def needs_profile(cfg: LeoConfig) -> bool:
    """Whether this run uses a hardware profile: for its cache plan, or to size its parts."""
    return cfg.cache.enabled or weighted(cfg.partition)


def nodes_probe(
    cfg: LeoConfig,
    run_dir: Path,
    always: bool = False,
    force: bool = False,
    given: Path | None = None,
) -> Literal["none", "check", "full"]:
    """What the nodes of a several-machine run do about the hardware profile, decided alike on
    every node (they see the same folder and config, and must meet in the same launches).

    "none" where the run needs no profile (`always`: `leo profile-cache`, which plans whatever
    the policy) or one is given (`given`, `cache.hardware`); "check" where the run folder's
    fits (`fits_nodes`): a short launch whose ranks each check their own entry (host, torch,
    threads: only a node knows its host) and measure again unless all of them match; "full"
    otherwise, or where `force` asks again.
    """
    if given is not None or cfg.cache.hardware is not None or not (always or needs_profile(cfg)):
        return "none"
    own = None if force else saved_profile(RunDir(run_dir).hardware)
    return "check" if own is not None and fits_nodes(own, cfg, cfg.partition.num_parts) else "full"


def join_probe(
    cfg: LeoConfig,
    run_dir: Path,
    always: bool = False,
    force: bool = False,
    given: Path | None = None,
) -> bool:
    """On a node other than 0: take part in the probe node 0 is about to run, if it will
    (`nodes_probe`); whether it did. Node 0 writes the profile."""
    what = nodes_probe(cfg, run_dir, always, force, given)
    if what != "none":
        run_probe(cfg, run_dir, quick=quick_probe(), keep=what == "check")  # node 0's sizes
    return what != "none"


def check_nodes_profile(
    cfg: LeoConfig,
    run_dir: Path,
    always: bool = False,
    force: bool = False,
    given: Path | None = None,
    progress: ProgressFn | None = None,
) -> bool:
    """Node 0's half of `join_probe`, before any stage looks for a profile: on several
    machines, the "check" launch of `nodes_probe` (the other nodes join it); whether it ran.
    Where a full probe is due, the stage that needs the profile runs it, as the other nodes
    expect. Nothing on one machine."""
    if cfg.launch.nnodes == 1 or nodes_probe(cfg, run_dir, always, force, given) != "check":
        return False
    with stage(progress, "probe"):
        run_probe(cfg, run_dir, quick=quick_probe(), keep=True)
    return True


@contextlib.contextmanager
def stage(progress: ProgressFn | None, name: str) -> Iterator[None]:
    """One stage of unknown length for the progress display (a spinner and its elapsed time
    until it ends)."""
    if progress is not None:
        progress(name, 0, 1)
    yield
    if progress is not None:
        progress(name, 1, 1)


def hardware_profile(
    cfg: LeoConfig,
    run_dir: Path,
    given: Path | None,
    num_workers: int,
    reprobe: bool = False,
    progress: ProgressFn | None = None,
) -> HardwareProfile:
    """The given profile (kept as the run folder's); else the run folder's profile when it was
    measured with as many workers (on several machines, where node 0 has first run
    `check_nodes_profile`, as the others `join_probe`); else this machine's saved one for as
    many workers and threads; else a probe (`new_profile`). `reprobe` (`--force`) probes
    again; `progress` shows the probe."""
    hw = find_profile(cfg, run_dir, given, num_workers, reprobe)
    return hw if hw is not None else new_profile(cfg, run_dir, num_workers, progress)


def new_profile(
    cfg: LeoConfig, run_dir: Path, num_workers: int, progress: ProgressFn | None = None
) -> HardwareProfile:
    """A probe of this machine, kept in the run folder and, measured on a quiet machine of
    one node, in this machine's store for later runs."""
    with stage(progress, "probe"):
        hw = run_probe(cfg, run_dir, quick=quick_probe())
    busy = hw.load is not None and hw.load.high(load_limit())
    if busy and hw.load is not None:
        print(busy_note(hw.load, run_dir), file=sys.stderr)
    if cfg.launch.nnodes > 1:
        return hw  # several machines: the run folder's alone
    store = machine_cache(num_workers, placement(cfg, workers_per_node(cfg)), cfg.run.cache_dir)
    with contextlib.suppress(OSError):  # an unwritable home only costs a probe next time
        hw.write(busy_cache(store) if busy else store)  # busy: for busy times only
    return hw


def find_profile(
    cfg: LeoConfig, run_dir: Path, given: Path | None, num_workers: int, reprobe: bool = False
) -> HardwareProfile | None:
    """A profile that needs no probe (see `hardware_profile`), or None: `given_profile`,
    else `saved_profile_for` (the hardware stage of launch/setup.py calls them in turn)."""
    own = RunDir(run_dir).hardware
    found = given_profile(cfg, own, given)
    if found is not None:
        return found
    threads = None if cfg.launch.nnodes > 1 else placement(cfg, workers_per_node(cfg))
    return saved_profile_for(cfg, own, num_workers, threads, reprobe)


def given_profile(cfg: LeoConfig, own: Path, given: Path | None) -> HardwareProfile | None:
    """The profile `given` (`--hardware`) or `cache.hardware` names, kept as the run folder's
    (`own`) too, so later stages use the same one; None where neither names one."""
    path = given or cfg.cache.hardware
    if path is None:
        return None
    hw = HardwareProfile.read(Path(path))
    if Path(path).resolve() != own.resolve():
        hw.write(own)
    return hw


def saved_profile_for(
    cfg: LeoConfig, own: Path, num_workers: int, threads: str | None, reprobe: bool = False
) -> HardwareProfile | None:
    """A saved profile measured as this run would measure it, or None: the run folder's
    (`own`); on several machines the one every node agrees to reuse (`threads` None: each
    node's may differ); else this machine's store's for `num_workers` and `threads`
    (`placement`), copied to `own`. `reprobe` takes none."""
    hw = None if reprobe else saved_profile(own)
    if cfg.launch.nnodes > 1:  # what every node decides alike (join_probe)
        return hw if hw is not None and fits_nodes(hw, cfg, num_workers) else None
    assert threads is not None, "one machine's profiles are stored by placement"
    if hw is not None and matches(hw, num_workers, threads):  # this host and torch too
        return hw
    store = machine_cache(num_workers, threads, cfg.run.cache_dir)
    machine = None if reprobe else saved_profile(store)
    if machine is not None and matches(machine, num_workers, threads):
        machine.write(own)
        return machine
    busy = None if reprobe else saved_profile(busy_cache(store))
    if busy is not None and matches(busy, num_workers, threads):
        load = busy_now()  # a probe now would be taken under load as well
        if load is not None:
            print(busy_reuse_note(load, busy_cache(store)), file=sys.stderr)
            busy.write(own)
            return busy
    if cfg.launch.device == "cuda" or (cfg.launch.device == "auto" and torch.cuda.is_available()):
        print(
            "warning: the hardware probe measures CPU kernels and the process group on the "
            "host, so the plan's predicted times do not describe GPU training; pass a profile "
            "with --hardware (or cache.hardware) or use cache.policy=degree or none.",
            file=sys.stderr,
        )
    return None


def unpinned_rates(cfg: LeoConfig) -> bool:
    """Whether per-rank rates are measured without pinning, with several workers on a host
    (which of them gets the faster cores is then the scheduler's choice, run by run)."""
    return cfg.launch.cpu_affinity is None and workers_per_node(cfg) > 1


def part_weigher(
    cfg: LeoConfig,
    run_dir: Path,
    hardware: Path | None = None,
    progress: ProgressFn | None = None,
) -> Weigher | None:
    """For unequal part weights (`measured` or a list): the weigher of the partition stage,
    from the run's hardware profile (`hardware`, or found, or probed now, before
    partitioning; see `weigher_for`); None otherwise."""
    if not weighted(cfg.partition):
        return None
    num = cfg.partition.num_parts
    return weigher_for(cfg, hardware_profile(cfg, run_dir, hardware, num, progress=progress))


def weigher_for(cfg: LeoConfig, hw: HardwareProfile) -> Weigher:
    """The weigher of unequal part weights priced with `hw`: the shares (`measured` only)
    and what each node weighs.

    Its key covers the profile and what the work is priced for (model, dtype, layer 0's
    level), so new rates or another model rebuild the parts.
    """
    if cfg.partition.part_weights == "measured" and unpinned_rates(cfg):
        print(
            "warning: partition.part_weights=measured with launch.cpu_affinity=null: unpinned "
            "workers share the cores as the scheduler decides, so a probe rank's rate need not "
            "be the training rank's; pin each worker to its cores with launch.cpu_affinity "
            "(e.g. [[0],[1]]) for shares that hold.",
            file=sys.stderr,
        )
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


def partition_cache_dir(cfg: LeoConfig, run_dir: Path) -> Path | None:
    """Where the partitions of the run in `run_dir` are kept: `run.cache_dir` (null:
    `leo-cache` beside the run folder); None (inside the run folder) for several machines,
    which share the run folder only."""
    return None if cfg.launch.nnodes > 1 else machine_cache_dir(cfg, run_dir)


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
    weigher = part_weigher(cfg, run_dir, hardware=hardware, progress=progress)
    part = cfg.partition
    return ensure_partitions(
        cfg.data, part, cfg.run.seed, run_dir, force, progress, verify, weigher=weigher,
        cache_dir=partition_cache_dir(cfg, run_dir),
    )  # fmt: skip


def ensure_plan(
    cfg: LeoConfig,
    run_dir: Path,
    hardware: Path | None = None,
    force: bool = False,
    always: bool = False,
    timer: RunTimer | None = None,
    verify_parts: bool = True,
    progress: ProgressFn | None = None,
    shared: bool = True,
    reprobe: bool | None = None,
) -> CachePlan | None:
    """The run's cache plan, made when missing or stale, with its hardware profile found or
    probed (`hardware_profile`), for callers outside the set-up pipeline (launch/setup.py,
    which takes the two stages apart).

    Training needs none with `cache.policy=none` (None is returned); `always` makes one
    anyway. `timer` gets the plan's seconds (`plan_s`, see `plan_for`); `reprobe` (default:
    `force`) measures the machine again first; the other arguments are `plan_for`'s.
    """
    if not cfg.cache.enabled and not always:
        return None
    again = force if reprobe is None else reprobe
    num_parts = int(read_meta(RunDir(run_dir).partitions)["num_parts"])
    hw = hardware_profile(cfg, run_dir, hardware, num_parts, reprobe=again, progress=progress)
    plan, reused_s = plan_for(cfg, run_dir, hw, force, verify_parts, progress, shared)
    seconds = plan.plan_s or 0.0 if reused_s is None else reused_s
    (timer or RunTimer()).add("plan_s", seconds, ran=reused_s is None)
    return plan


def plan_for(
    cfg: LeoConfig,
    run_dir: Path,
    hw: HardwareProfile,
    force: bool = False,
    verify_parts: bool = True,
    progress: ProgressFn | None = None,
    shared: bool = True,
    made_for: PlanInputs | None = None,
) -> tuple[CachePlan, float | None]:
    """The run's cache plan for the rates of `hw`: the run folder's or the shared cache's
    when made for the same inputs, else made now; and None when made now, else what the
    reused plan cost when it was made (its `plan_s`: accesses, policy, predictions, plot).

    Under `pipeline.mode=auto` it is the planned mode's plan (planner/auto_mode.py).
    `force` makes it again; `verify_parts=False` leaves the parts' checksums to the workers
    (see `part_accesses`); `progress` shows the plan while it is made; `shared=False` makes
    a new plan rather than take the shared cache's (the parts were just rebuilt), and keeps
    it there; `made_for`: what it is made for, where the caller has worked it out.
    """
    t0 = time.perf_counter()
    made_for = made_for or PlanInputs.of(cfg, read_meta(RunDir(run_dir).partitions))
    meta = made_for.meta
    key = plan_key(made_for.inputs, hw)
    existing = None if force else read_plan(run_dir)
    if existing is not None and existing.key == key:  # (the plan's facts, then the config's)
        sizes, rounded, attention = halo_sizes(meta), cfg.pipeline.rounds_rows, cfg.model.attention
        path, layers = RunDir(run_dir).plan, cfg.model.num_layers
        existing.check_fits(path, sizes, layers, attention, rounded)
        return existing, existing.plan_s or 0.0
    entry = plan_cache_entry(cfg, run_dir, key)
    cached = None if force or not shared or entry is None else _shared_plan(entry, key)
    if entry is not None and cached is not None:
        cached.check_fits(
            entry / PLAN, halo_sizes(meta), cfg.model.num_layers, cfg.model.attention,
            cfg.pipeline.rounds_rows,
        )  # fmt: skip
        _copy_plan(entry, run_dir, cached)
        return cached, cached.plan_s or 0.0
    with stage(progress, "plan"):
        plan = _new_plan(cfg, run_dir, hw, verify_parts, key, made_for)
    plan.plan_s = round(time.perf_counter() - t0, 4)  # kept in the file: a reuse's cost
    data = plan_bytes(plan)
    write_plan(run_dir, plan, data)
    if entry is not None:
        with contextlib.suppress(OSError, CacheError):  # an unwritable cache costs a plan later
            _copy_plan(run_dir, entry, plan, data)
    return plan, None


def plan_cache_entry(cfg: LeoConfig, run_dir: Path, key: str) -> Path | None:
    """Where a plan made for `key` is kept for other runs: `plans/<key>` in the partitions'
    cache (`partition_cache_dir`); None on several machines."""
    root = partition_cache_dir(cfg, run_dir)
    return None if root is None else Path(root) / "plans" / key[:24]


def _shared_plan(folder: Path, key: str) -> CachePlan | None:
    """The cache's plan for `key`, or None when it has none or what is there is unreadable
    (made again and written over)."""
    try:
        plan = read_plan(folder)
    except CacheError:
        return None
    return plan if plan is not None and plan.key == key else None


def _copy_plan(source: Path, target: Path, plan: CachePlan, data: bytes | None = None) -> None:
    """Write `plan` into the folder `target` with the plot `source` holds: the plot first,
    so a plan another run finds there has its plot (none in `source`: none in `target`).
    `data`: the plan's file as just written (not encoded again), where the caller has it."""
    target.mkdir(parents=True, exist_ok=True)
    plot, copy = source / RunDir.PLAN_PLOT, target / RunDir.PLAN_PLOT
    try:
        files.write_bytes(copy, plot.read_bytes())
    except OSError:
        copy.unlink(missing_ok=True)
    write_plan(target, plan, data)


def _new_plan(
    cfg: LeoConfig,
    run_dir: Path,
    hw: HardwareProfile,
    verify_parts: bool,
    key: str,
    made_for: PlanInputs,
) -> CachePlan:
    """A new plan for the run's parts (accesses, policy, predictions) and its plot."""
    meta, reach = made_for.meta, made_for.reach
    dataset = meta["dataset"]
    accesses = part_accesses(run_dir, int(meta["num_parts"]), verify_parts)
    shape = model_shape(
        cfg.model,
        int(dataset["num_features"]),
        int(dataset["num_classes"]),
        DTYPE_BYTES[cfg.train.dtype],
        halo_bytes(cfg),
    )
    keys = (key, made_for.inputs, made_for.graph)
    chunks = cfg.pipeline.num_chunks
    plan = make_plan(cfg.cache, accesses, shape, hw, keys, chunks, reach, made_for.priced)
    plot_plan(plan, RunDir(run_dir).plan_plot)
    return plan
