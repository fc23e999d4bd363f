"""The workers' entry point under `launch.nnodes: MIN:MAX`:
`python -m leo_cli.elastic.entry <worker arguments> --node-rank N`.

When a machine is lost, the elastic agents of the others restart their workers in a smaller
world than the run folder's partitions were made for. Before training, those workers re-form
the run for their count in a process group of their own: a hardware profile measured by the
group itself where the plan or the part sizes need one and the run folder has none for it
(the probe's own launch cannot run inside workers), then partitions, a cache plan and the
resolved config, made by node 0's first worker (node 0 hosts the rendezvous, so it is always
there, and the config's data and run paths are its own) while the others wait. Then each
trains as a worker does (a `Trainer`, leo_cli/worker/trainer.py), resuming from the last
checkpoint: every mode gives one process's numbers whatever the worker count, so the run keeps
its numbers.

Every attempt checks, in a group of its own, that each rank is where its entry of the
hardware profile was measured (torch's c10d rendezvous orders machines its own way, not by
`launch.node_rank` as the probe's launch does); where one is not, the run is re-formed the
same way for the same count (profile measured by the group, plan made again). A worker of a
run of fixed size starts leo_cli/worker/entry.py directly and imports none of this (the
partitioner, the probe), though the server it may be forked from holds the probe
(launch/preload.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from leo_cli.comm.dist import DistEnv, all_gather_, init_process_group
from leo_cli.config import LeoConfig, load_config, write_resolved
from leo_cli.errors import LeoError, TrainError
from leo_cli.graph.partition_cache import ensure_partitions
from leo_cli.graph.storage import read_meta
from leo_cli.harness.process import Harness, die_with_parent, leave
from leo_cli.launch.stages import ensure_plan, find_profile, needs_profile, part_weigher
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.profile.measure import DEFAULT_SIZES, QUICK_SIZES
from leo_cli.planner.profile.probe import agreed_quick, all_ranks_same, probe
from leo_cli.planner.profile.store import quick_probe, saved_profile
from leo_cli.registry import mode_of
from leo_cli.run_dir import RunDir, read_json
from leo_cli.util import files
from leo_cli.worker.entry import parse_args
from leo_cli.worker.memory import fix_mmap_threshold
from leo_cli.worker.trainer import Trainer


def regrouped_config(cfg: LeoConfig, env: DistEnv, run_dir: Path) -> LeoConfig:
    """The run's config for the workers there are: one part each, on the machines they are
    on (node 0's per-node keys, with the run folder as this worker sees it)."""
    nodes = max(1, env.world_size // max(env.local_world_size, 1))
    launch = cfg.launch.model_copy(update={"nnodes": nodes, "min_nodes": None, "node_rank": 0})
    part = cfg.partition.model_copy(update={"num_parts": env.world_size})
    run = cfg.run.model_copy(update={"out_dir": run_dir})
    return cfg.model_copy(update={"launch": launch, "partition": part, "run": run})


def leader_of(env: DistEnv, node_rank: int) -> int:
    """The global rank of node 0's first worker (every rank learns it)."""
    rows = all_gather_(torch.tensor([node_rank, env.local_rank], dtype=torch.int64))
    ranks = [r for r in range(env.world_size) if rows[r].tolist() == [0, 0]]
    return ranks[0] if ranks else 0  # node 0 hosts the rendezvous: it is always there


def remake(cfg: LeoConfig, run: RunDir, env: DistEnv, leader: int, store: Any) -> None:
    """Profile (measured by the group when needed), partitions, plan and resolved config for
    `env.world_size` workers (collective; the leader writes and says so in the group's
    `store`)."""
    new = regrouped_config(cfg, env, run.root)
    found: list[Any] = [None]
    if env.rank == leader and new.cache.hardware is None:
        hw = find_profile(new, run.root, None, env.world_size)
        found = [None if hw is None else hw.model_dump(mode="json")]
    dist.broadcast_object_list(found, src=leader)
    measure = False
    quick = agreed_quick(env, quick_probe(), src=leader)  # the sizes the leader's node asks
    if needs_profile(new) and new.cache.hardware is None:  # alike on every rank
        hw = None if found[0] is None else HardwareProfile.model_validate(found[0])
        hw = hw if hw is not None and hw.quick == quick else None
        measure = not all_ranks_same(env, hw)  # each rank knows its own host only
    if measure:  # every rank measures, as the probe's own workers would
        profile = probe(env, QUICK_SIZES if quick else DEFAULT_SIZES, quick)
        if env.rank == leader:
            profile.write(run.hardware)
    if env.rank == leader:
        hardware = new.cache.hardware or (run.hardware if run.hardware.is_file() else None)
        partition_apart(new, run.root, hardware)
        run.plan.unlink(missing_ok=True)  # made for the other count's parts
        ensure_plan(new, run.root, hardware=hardware, verify_parts=False, shared=False)
        write_resolved(new)
        store.set(DONE_KEY, "1")
    else:
        wait_for_leader(run, leader, cfg.launch.timeout_s, store)
    dist.barrier()  # the others read what the leader wrote


def partition_apart(cfg: LeoConfig, run_dir: Path, hardware: Path | None) -> None:
    """The regroup's partitions, made in a child process (spawned: no copy of this worker's
    threads): pymetis holds the GIL while it runs, which would stop this worker's heartbeat
    thread, and the watch would end a large graph's partitioning as a hung worker.

    The child dies with this worker (a worker ended mid-regroup leaves no partitioning
    behind to write into the run folder later).

    Raises:
        TrainError: the child died or failed other than on bad input (killed, out of
            memory); its LeoErrors come back as such.
    """
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent) as pool:
            pool.submit(_partition, cfg, run_dir, hardware).result()
    except LeoError:
        raise
    except (BrokenProcessPool, MemoryError, OSError) as exc:
        raise TrainError(
            f"the process re-partitioning {run_dir} for fewer workers failed "
            f"({type(exc).__name__}: out of memory?); its log is under the run's logs/."
        ) from None


def _partition(cfg: LeoConfig, run_dir: Path, hardware: Path | None) -> None:
    """In the child: the partitions for `cfg`'s worker count, in the run folder (machines
    that join again see it)."""
    weigher = part_weigher(cfg, run_dir, hardware=hardware)
    ensure_partitions(
        cfg.data, cfg.partition, cfg.run.seed, run_dir, verify=False, weigher=weigher,
        cache_dir=None,
    )  # fmt: skip


DONE_KEY = "remade"
WAIT_STEP_S = 2.0


def wait_for_leader(run: RunDir, leader: int, timeout_s: float, store: Any) -> None:
    """Wait while the leader partitions and plans, which may take longer than
    `launch.timeout_s` on a large graph: as long as its heartbeat file keeps changing (it
    is alive and not stalled), not in a collective that would time out."""
    beat = run.root / RunDir.HEARTBEATS / f"rank_{leader}"
    seen, since = None, time.monotonic()
    while not store.check([DONE_KEY]):
        time.sleep(WAIT_STEP_S)
        try:
            mtime: float | None = beat.stat().st_mtime
        except OSError:
            mtime = None
        if mtime != seen:
            seen, since = mtime, time.monotonic()
        elif time.monotonic() - since > timeout_s:
            raise TrainError(
                f"worker rank {leader} stopped responding while it re-partitioned the run for "
                f"fewer workers (no heartbeat for launch.timeout_s={timeout_s:g} s); its log "
                f"is under {run.logs}."
            )


def regroup(run: RunDir, env: DistEnv, node_rank: int) -> None:
    """Re-form the run for `env.world_size` workers when its resolved config (written last)
    or its partitions are for another count, or when the ranks are not where the profile's
    were (c10d orders the machines its own way); nothing otherwise."""
    cfg = load_config(run.config)
    before = cfg.partition.num_parts
    resized = before != env.world_size or read_meta(run.partitions)["num_parts"] != before
    profiled = needs_profile(cfg) and cfg.cache.hardware is None
    if not (resized or profiled):
        return
    t0 = time.perf_counter()
    # The group's store: this attempt's prefix, so no earlier attempt's keys.
    group_store = init_process_group(env, "gloo", cfg.launch.timeout_s, None, "leo/r")
    try:
        if not resized and all_ranks_same(env, saved_profile(run.hardware)):
            return
        leader = leader_of(env, node_rank)
        remake(cfg, run, env, leader, group_store)
        if env.rank == leader and resized:
            state = run.read_latest()
            epoch = 0 if state is None else int(state["epoch"])
            exact = mode_of(cfg.pipeline.mode).exact
            note = regroup_note(before, env.world_size, epoch, exact)
            took = round(time.perf_counter() - t0, 3)
            files.write_json(run.regrouped, {"at": time.time(), "regroup_s": took, "note": note})
        dist.barrier()
    finally:
        dist.destroy_process_group()  # the worker joins its own group


def regroup_note(before: int, after: int, epoch: int, exact: bool) -> str:
    """What `leo train` says when the run goes on with another worker count."""
    change = "a machine was lost" if after < before else "a machine joined"
    since = f"the checkpoint of epoch {epoch}" if epoch else "the start (no checkpoint yet)"
    same = f"; the numbers stay those of {before} workers" if exact else ""
    return (
        f"{change}: going on with {after} workers (were {before}), re-partitioned for "
        f"{after}, from {since}{same}."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leo_cli.elastic.entry",
        description="the worker of a run that may change its worker count; other arguments "
        "are the worker's (python -m leo_cli.worker.entry --help)",
    )
    parser.add_argument("run_dir", type=Path, help="run folder holding resolved_config.yaml")
    parser.add_argument("--node-rank", type=int, default=0, help="this machine's launch.node_rank")
    args, rest = parser.parse_known_args(argv)
    fix_mmap_threshold()  # before the regroup's temporaries come and go (worker/memory.py)
    run = RunDir(args.run_dir)

    # A fresh start has cleared earlier runs' checkpoints, so whatever checkpoint there is was
    # written by this run: every attempt resumes (torch does not count a restart that only
    # changes the machines as one). Global rank 0 may be on any machine (c10d's order): the
    # launch's stamp comes from node 0's .setup.json, written before its agent started.
    flags = ["--resume"] if "--resume" not in rest else []
    if "--launched-at" not in rest:
        stamp = read_json(run.setup_file).get("launched_at")
        flags += ["--launched-at", repr(stamp)] if isinstance(stamp, float) else []

    with Harness(heartbeat_dir=run.root, errors_dir=run.errors) as rank:
        regroup(run, rank.env, args.node_rank)
        fix_mmap_threshold()  # the worker's set-up starts here, after the regroup's
        trainer = Trainer(parse_args([str(args.run_dir), *rest, *flags]), rank.env)
        trainer.train()
        trainer.finish()
    return rank.code


@record
def entry() -> NoReturn:
    leave(main())


if __name__ == "__main__":
    entry()
