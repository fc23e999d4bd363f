"""The rank side of the hardware probe:
`python -m leo_cli.train.probe_worker OUT_JSON [--quick] [--timeout-s S] [--heartbeat-dir D]`.

`run_probe` (train/probe.py) starts it through the launcher that starts training workers, so
the probe sees what training sees: the same worker count, the same threads per worker
(OMP_NUM_THREADS), the same process group. Every rank measures the compute rates at the same
moments as the others (on a machine with fewer cores than workers, they share them as in
training), then the links between them; rank 0 writes the profile (compute rates: the slowest
rank's, per call). It lives in train/ rather than cache/ because it joins two layers: the
measurements of cache/ and the dropout of models/.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from leo_cli import kernels
from leo_cli.cache.hardware import FORMAT_VERSION, HardwareProfile, ProbeSizes
from leo_cli.cache.probe import (
    ALONE,
    DEFAULT_SIZES,
    GROUP,
    QUICK_SIZES,
    measure_compute,
    measure_links,
)
from leo_cli.comm.dist import DistEnv, init_process_group
from leo_cli.models.dropout import counter_dropout
from leo_cli.train.heartbeat import start_heartbeat
from leo_cli.train.worker import die_with_parent


def probe(env: DistEnv, sizes: ProbeSizes, quick: bool) -> HardwareProfile:
    """Measure compute rates (all ranks at once), then the links; the same result on every rank."""
    start = time.perf_counter()
    group = env.world_size > 1
    compute = measure_compute(sizes, counter_dropout, GROUP if group else ALONE)
    compute_s = time.perf_counter() - start
    links = measure_links(sizes, same_host=env.local_world_size == env.world_size)
    if env.rank == 0:  # lands in the probe's log
        print(f"compute {compute_s:.1f} s, links {time.perf_counter() - start - compute_s:.1f} s")
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
        quick=quick,
        probe_s=time.perf_counter() - start,
        sizes=sizes,
        compute=compute,
        links=links,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leo_cli.train.probe_worker")
    parser.add_argument("out", type=Path, help="where rank 0 writes the hardware profile (JSON)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (tests): rough rates")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    parser.add_argument("--heartbeat-dir", type=Path, help="folder the launcher watches")
    args = parser.parse_args(argv)
    die_with_parent()
    env = DistEnv.from_env()
    if args.heartbeat_dir is not None:
        start_heartbeat(args.heartbeat_dir, env.rank)
    if env.world_size > 1:
        init_process_group(env, "gloo", args.timeout_s)
    profile = probe(env, QUICK_SIZES if args.quick else DEFAULT_SIZES, args.quick)
    if env.rank == 0:
        profile.write(args.out)
    if env.world_size > 1:
        dist.barrier()  # nobody tears the group down while a peer still talks to it
    return 0


@record
def entry() -> None:
    code = main()
    # As the training worker: skip gloo's teardown, which sometimes aborts a finished process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
