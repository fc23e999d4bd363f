"""The rank harness: start P gloo ranks inside pytest (torch.multiprocessing on localhost,
forkserver; results back through a queue, a hung rank failing the test instead of hanging it),
and run the trainer on them (partitioned training against single-process training, for the
exactness tests)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from helpers.ports import free_port
from leo_cli.comm.levels import RankLevels
from leo_cli.config import LeoConfig
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.types import DatasetInfo, Graph
from leo_cli.planner.auto_mode import choose, with_mode
from leo_cli.registry import mode_of
from leo_cli.worker.assemble import Job, assemble
from leo_cli.worker.step import evaluate, train_step

# Ranks fork from a server that imported torch (and, with a CPU-only torch, the trainer) once:
# a spawned rank imports them again, about 3 s of a core per rank and test, and 2 s more for
# torch._dynamo (torch.optim's own optimizers import it; LEO's ops and Adam do not while nothing
# compiles, leo_cli/util/dynamo.py). The server runs no
# torch ops and never initialises a GPU, so forking it is safe; with a GPU build of torch the
# trainer is not preloaded (importing leo_cli.kernels can load the CUDA kernels and touch the
# GPU, which a forked child could not use). The server starts with the first test that starts
# ranks, and what modules decide at import (LEO_KERNELS, OMP_NUM_THREADS, TORCH_*) is decided
# in that environment: a test that needs another one at import time starts its ranks with
# `start_method="spawn"`. Each rank gets the calling test's environment when it starts.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy"]
if torch.version.cuda is None and torch.version.hip is None:
    PRELOAD += ["leo_cli.worker.assemble", "leo_cli.worker.step"]
mp.set_forkserver_preload(PRELOAD)


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


def chunks_of(mode: str, chunks: int) -> list[str]:
    """`--set` of a chunk count, for the modes that chunk (the others refuse the key)."""
    return [f"pipeline.num_chunks={chunks}"] if mode_of(mode).chunks else []


def dataset_info(g: Graph) -> DatasetInfo:
    return DatasetInfo.of(g)


def spec_levels(spec: str | None, part: LocalPart) -> RankLevels | None:
    """Cache levels by name, for exactness tests: `none`, `static`, `half` (every other halo
        row replicated, every fourth fetched per edge), `all` (every halo row replicated), `l3`
        (every halo row fetched per edge), `overlap` (half replicated at layer 0, every row
    fetched per edge at the others), `uneven` (`half` on part 0, every fourth row fetched
    per edge elsewhere: layer 0's view differs from the others' on part 0 only); `static+` in
    front adds the static aggregate."""
    if spec is None:
        return None
    static = spec.startswith("static")
    rule = spec.removeprefix("static").removeprefix("+") or "none"
    if rule == "uneven":
        rule = "half" if part.rank == 0 else "quarter"
    h = list(range(part.num_halo))
    replicas = {"half": h[::2], "all": h, "overlap": h[::2]}.get(rule, [])
    l3 = {"half": h[1::4], "quarter": h[1::4], "l3": h, "overlap": h}.get(rule, [])
    return RankLevels(static, replicas, l3)


def run_job(
    cfg: LeoConfig,
    part: LocalPart,
    info: DatasetInfo,
    world: int,
    num_steps: int,
    spec: str | None = None,
) -> dict[str, Any]:
    """Train num_steps epochs; return losses, final logits by global id and parameters. A config
    left at `pipeline.mode=auto` runs what `leo train` would choose without a plan."""
    cfg = with_mode(cfg, choose(cfg, None, world).mode)
    job = assemble(cfg, part, info, world, torch.device("cpu"), spec_levels(spec, part))
    grads = first_gradients(job, cfg.run.seed)
    losses = [
        train_step(job.model, job.optimizer, job.reducer, job.graph, job.data, cfg.run.seed, e)[0]
        for e in range(1, num_steps + 1)
    ]
    acc = evaluate(job.model, job.graph, job.data)
    job.model.eval()
    with torch.no_grad():
        logits = job.model(job.data.x_NF, job.graph)
    return {
        "losses": losses,
        "ids": part.inner_nodes.copy(),
        "logits": logits.numpy(),
        "params": [p.detach().numpy().copy() for p in job.model.parameters()],
        "acc": acc,
        "bytes": job.graph.aggregator.stats.remote_bytes,
        "published": job.graph.aggregator.stats.published_bytes,
        "grads": grads,
        "split": splits_its_update(job.graph.aggregator),
    }


def splits_its_update(agg: Any) -> bool:
    """Whether every layer's aggregator splits its update boundary-first (comm/aggregate.py
    `splits_update`)."""
    layers = [agg.first, agg.rest] if hasattr(agg, "first") else [agg]
    return all(getattr(a, "overlap", False) for a in layers)


def first_gradients(job: Job, seed: int) -> list[np.ndarray]:
    """Summed weight gradients of the first (dropout) forward/backward, before any step."""
    job.model.train()
    logits = job.model(job.data.x_NF, job.graph, seed=seed, epoch=1)
    d = job.data
    loss = F.cross_entropy(logits[d.train_N], d.y_N[d.train_N], reduction="sum")
    job.reducer.start()
    (loss / d.num_train_global).backward()
    job.reducer.finish()
    grads = [p.grad.numpy().copy() for p in job.model.parameters() if p.grad is not None]
    job.model.zero_grad(set_to_none=True)
    return grads


def _train_configs(
    rank: int,
    world: int,
    cfgs: list[LeoConfig],
    parts: list[LocalPart],
    info: DatasetInfo,
    num_steps: int,
    specs: list[str | None],
) -> list[dict[str, Any]]:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return [
        run_job(cfg, parts[rank], info, world, num_steps, spec)
        for cfg, spec in zip(cfgs, specs, strict=True)
    ]


def run_many(
    cfgs: list[LeoConfig],
    g: Graph,
    world: int,
    num_steps: int,
    method: str = "metis",
    owner: np.ndarray | None = None,
    specs: list[str | None] | None = None,
) -> list[list[dict[str, Any]]]:
    """Partition g into `world` parts (or use the given owner of every node) and train every
    config on that many gloo ranks (one process group for all configs, to pay the start-up
    once), with the cache levels `specs` names (see spec_levels). Results [config][rank]."""
    if owner is None:
        owner = assign_parts(g, world, method, seed=0)
    parts = build_parts(g, owner, world)
    specs = specs or [None] * len(cfgs)
    info = dataset_info(g)
    if world == 1:
        return [
            [run_job(cfg, parts[0], info, 1, num_steps, spec)]
            for cfg, spec in zip(cfgs, specs, strict=True)
        ]
    by_rank = spawn_ranks(_train_configs, world, cfgs, parts, info, num_steps, specs)
    for result in by_rank:
        if isinstance(result, Exception):
            raise result
    return [[by_rank[r][i] for r in range(world)] for i in range(len(cfgs))]


def run_distributed(
    cfg: LeoConfig, g: Graph, world: int, num_steps: int, method: str = "metis"
) -> list[dict[str, Any]]:
    """One config on `world` ranks; results by rank."""
    return run_many([cfg], g, world, num_steps, method)[0]


def global_logits(results: list[dict[str, Any]], num_nodes: int) -> np.ndarray:
    width = results[0]["logits"].shape[1]
    out = np.full((num_nodes, width), np.nan)
    for r in results:
        out[r["ids"]] = r["logits"]
    return out
