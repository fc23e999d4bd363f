"""Start P gloo ranks inside pytest: torch.multiprocessing on localhost (forkserver), results back
through a queue, a hung rank failing the test instead of hanging it."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Ranks fork from a server that imported torch (and, with a CPU-only torch, the trainer) once:
# a spawned rank imports them again, about 3 s of a core per rank and test, and 2 s more for
# torch._dynamo (the first call of a torch.library custom op imports it). The server runs no
# torch ops and never initialises a GPU, so forking it is safe; with a GPU build of torch the
# trainer is not preloaded (importing leo_cli.kernels can load the CUDA kernels and touch the
# GPU, which a forked child could not use). The server starts with the first test that starts
# ranks, and what modules decide at import (LEO_KERNELS, OMP_NUM_THREADS, TORCH_*) is decided
# in that environment: a test that needs another one at import time starts its ranks with
# `start_method="spawn"`. Each rank gets the calling test's environment when it starts.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy"]
if torch.version.cuda is None and torch.version.hip is None:
    PRELOAD += ["leo_cli.train.assemble", "leo_cli.train.trainer"]
mp.set_forkserver_preload(PRELOAD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(
    target: Callable[..., Any],
    world: int,
    *args: Any,
    limit_s: float = 120,
    start_method: str = "forkserver",
) -> list[Any]:
    """Run `target(rank, world, *args)` on `world` processes; results by rank.

    MASTER_ADDR/MASTER_PORT point at a free local port; an exception a rank raises comes back
    as its result. A rank that never answers fails the test after `limit_s` instead of hanging.
    """
    queue = mp.get_context(start_method).SimpleQueue()
    context = mp.start_processes(
        _rank_main,
        args=(world, free_port(), dict(os.environ), target, args, queue),
        nprocs=world,
        join=False,
        start_method=start_method,
    )
    # Read results before joining: a large result blocks its writer until the pipe drains.
    by_rank: dict[int, Any] = {}
    deadline = time.monotonic() + limit_s
    while len(by_rank) < world:
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            raise AssertionError(f"ranks {sorted(set(range(world)) - set(by_rank))} hung")
        if queue.empty():
            context.join(timeout=0.1)  # raises if a worker crashed, instead of hanging
        else:
            rank, result = queue.get()
            by_rank[rank] = result
    while not context.join():
        pass
    return [by_rank[r] for r in range(world)]


def _rank_main(
    rank: int,
    world: int,
    port: int,
    environ: dict[str, str],
    target: Callable[..., Any],
    args: Any,
    queue: Any,
) -> None:
    torch.set_num_threads(1)
    # Forked from the server, not from pytest: the test's environment as it is now.
    os.environ.clear()
    os.environ.update(environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        result = target(rank, world, *args)
    except Exception as exc:  # the test inspects it
        result = exc
    queue.put((rank, result))
    # As the real workers do: gloo's threads can abort a process while the group or the
    # interpreter is torn down after a clean finish, so sync and leave without either.
    if dist.is_initialized() and not isinstance(result, Exception):
        dist.barrier()
    os._exit(0)
