"""Run the trainer on P gloo ranks inside pytest (tests/ranks.py starts them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks import spawn_ranks

from leo_cli.comm.levels import RankLevels
from leo_cli.config import LeoConfig
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.types import DatasetInfo, Graph
from leo_cli.registry import mode_of
from leo_cli.train.assemble import Job, assemble
from leo_cli.train.auto_mode import choose, with_mode
from leo_cli.train.trainer import evaluate, train_step


def chunks_of(mode: str, chunks: int) -> list[str]:
    """`--set` of a chunk count, for the modes that chunk (the others refuse the key)."""
    return [f"pipeline.num_chunks={chunks}"] if mode_of(mode).chunks else []


def dataset_info(g: Graph) -> DatasetInfo:
    return DatasetInfo.of(g)


def spec_levels(spec: str | None, part: LocalPart) -> RankLevels | None:
    """Cache levels by name, for exactness tests: `none`, `static`, `half` (every other halo
        row replicated, every fourth fetched per edge), `all` (every halo row replicated), `l3`
        (every halo row fetched per edge), `overlap` (half replicated at layer 0, every row
    fetched per edge at the others); `static+` in front adds the static aggregate."""
    if spec is None:
        return None
    static = spec.startswith("static")
    rule = spec.removeprefix("static").removeprefix("+") or "none"
    h = list(range(part.num_halo))
    replicas = {"half": h[::2], "all": h, "overlap": h[::2]}.get(rule, [])
    l3 = {"half": h[1::4], "l3": h, "overlap": h}.get(rule, [])
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
    }


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
