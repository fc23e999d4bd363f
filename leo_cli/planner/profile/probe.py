"""The hardware probe's ranks: `python -m leo_cli.planner.profile.probe OUT`.

The probe sees what training sees: the same worker count, the same threads
per worker (OMP_NUM_THREADS), the same cores (`launch.cpu_affinity`, applied by harness/process.py),
the same process group, on every node of a multi-node job (each node's launcher starts its
probe workers, as it starts training workers). Every rank measures the compute rates at the
same moments as the others (on a machine with fewer cores than workers, they share them as in
training) and keeps its own; then the links between them; rank 0 writes the profile (every
rank's rates, and the slowest rank's). The launcher starts it (launch/probe.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from leo_cli import kernels
from leo_cli.comm.dist import DistEnv, init_process_group
from leo_cli.harness.placement import AFFINITY_ENV
from leo_cli.harness.process import ALLOCATOR_ENV, LINK_ENV, rank_entry, run_rank
from leo_cli.models.dropout import counter_dropout
from leo_cli.planner.profile.hardware import (
    FORMAT_VERSION,
    ComputeRates,
    HardwareProfile,
    ProbeSizes,
    RankRates,
    slowest_rates,
)
from leo_cli.planner.profile.measure import (
    ALONE,
    DEFAULT_SIZES,
    EACH,
    QUICK_SIZES,
    measure_compute,
    measure_links,
)
from leo_cli.planner.profile.store import same_rank, saved_profile
from leo_cli.run_dir import RunDir


def probe(env: DistEnv, sizes: ProbeSizes, quick: bool) -> HardwareProfile:
    """Measure compute rates (all ranks at once, each keeping its own), then the links; the
    same result on every rank."""
    start = time.perf_counter()
    group = env.world_size > 1
    compute = measure_compute(sizes, counter_dropout, EACH if group else ALONE)
    ranks = gather_ranks(env, compute)
    compute_s = time.perf_counter() - start
    links = measure_links(sizes, same_host=env.local_world_size == env.world_size)
    if env.rank == 0:  # lands in the probe's log
        print(f"compute {compute_s:.1f} s, links {time.perf_counter() - start - compute_s:.1f} s")
    placement = os.environ.get(AFFINITY_ENV)
    return HardwareProfile(
        format_version=FORMAT_VERSION,
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        device="cpu",
        torch_version=torch.__version__,
        kernels_backend=kernels.backend_name(),
        dtype="float32",
        world_size=env.world_size,
        threads_per_worker=torch.get_num_threads(),
        nnodes=max(1, env.world_size // max(env.local_world_size, 1)),
        cpu_affinity=json.loads(placement)["cores"] if placement else None,
        allocator=os.environ.get(ALLOCATOR_ENV, "system"),
        quick=quick,
        probe_s=time.perf_counter() - start,
        sizes=sizes,
        compute=slowest_rates([r.compute for r in ranks]),
        ranks=ranks,
        links=links,
    )


def gather_ranks(env: DistEnv, compute: ComputeRates) -> list[RankRates]:
    """Every rank's placement and rates, in rank order, on every rank."""
    pinned = bool(os.environ.get(AFFINITY_ENV))
    mine = RankRates(
        rank=env.rank,
        hostname=socket.gethostname(),
        cores=sorted(os.sched_getaffinity(0)) if pinned else None,
        threads=torch.get_num_threads(),
        compute=compute,
        link=os.environ.get(LINK_ENV),
    ).model_dump(mode="json")
    everyone: list[object] = [mine]
    if env.world_size > 1:
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, mine)
    return [RankRates.model_validate(r) for r in everyone]


def agreed_quick(env: DistEnv, quick: bool, src: int = 0) -> bool:
    """Rank `src`'s `quick` (the tiny sizes), on every rank: ranks of several machines read
    their own environments (`LEO_PROBE_QUICK`), and ranks measuring other sizes would wait
    for each other's collectives (collective)."""
    if env.world_size == 1:
        return quick
    flag = torch.tensor([int(quick)])
    dist.broadcast(flag, src=src)
    return bool(flag)


def all_ranks_same(env: DistEnv, hw: HardwareProfile | None) -> bool:
    """Whether every rank finds its entry of `hw` measured where it runs now (`same_rank`),
    decided alike on every rank."""
    mine = torch.tensor([int(hw is not None and same_rank(hw, env.rank))])
    if env.world_size > 1:
        dist.all_reduce(mine)
    return int(mine) == env.world_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leo_cli.planner.profile.probe")
    parser.add_argument("out", type=Path, help="where rank 0 writes the hardware profile (JSON)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (tests): rough rates; rank 0's decides"
    )
    parser.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    parser.add_argument("--heartbeat-dir", type=Path, help="folder the launcher watches")
    parser.add_argument(
        "--keep-if-same",
        action="store_true",
        help="leave OUT as it is when every rank's entry was measured where it runs now",
    )
    args = parser.parse_args(argv)

    def body(env: DistEnv) -> int:
        if env.world_size > 1:
            init_process_group(env, "gloo", args.timeout_s)
        quick = agreed_quick(env, args.quick)  # the probe's rank 0 decides
        if args.keep_if_same:
            kept = saved_profile(args.out)
            if all_ranks_same(env, kept if kept is not None and kept.quick == quick else None):
                if env.world_size > 1:
                    dist.barrier()
                return 0
        profile = probe(env, QUICK_SIZES if quick else DEFAULT_SIZES, quick)
        if env.rank == 0:
            profile.write(args.out)
        if env.world_size > 1:
            dist.barrier()  # nobody tears the group down while a peer still talks to it
        return 0

    work_dir = args.heartbeat_dir  # the launcher reads user errors from <work_dir>/.errors
    errors_dir = None if work_dir is None else RunDir(work_dir).errors
    return run_rank(body, heartbeat_dir=work_dir, errors_dir=errors_dir)


@record
def entry() -> None:
    rank_entry(main)


if __name__ == "__main__":
    entry()
