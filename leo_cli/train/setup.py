"""Assembling one worker's job: partition -> halo plan -> aggregator -> graph, data, model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leo_cli.comm.aggregate import Aggregator
from leo_cli.comm.dist import all_reduce_
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.grads import GradReducer, make_grad_reducer
from leo_cli.comm.modes import auto_chunks, make_aggregator
from leo_cli.config import LeoConfig
from leo_cli.config.schema import ModelConfig
from leo_cli.graph.layout import LocalPart
from leo_cli.graph.stage import partition_dir
from leo_cli.graph.storage import read_part
from leo_cli.kernels import CSR
from leo_cli.models.gnn import GNN, build_model
from leo_cli.models.graph import LocalGraph, build_local_graph
from leo_cli.train.trainer import WorkerData

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Job:
    plan: HaloPlan
    graph: LocalGraph
    reducer: GradReducer
    data: WorkerData
    model: GNN
    optimizer: torch.optim.Optimizer


def halo_plan(part: LocalPart, device: torch.device) -> HaloPlan:
    return HaloPlan(
        num_inner=part.num_inner,
        send_idx_S=torch.from_numpy(np.array(part.send_idx)).to(device),
        send_counts=[int(c) for c in part.send_counts],
        recv_counts=[int(c) for c in part.recv_counts],
    )


def exchange_width(model: ModelConfig, num_features: int, num_classes: int) -> int:
    """The widest rows any layer exchanges: each layer sends the narrower of its two widths."""
    widths = [num_features] + [model.hidden_channels] * (model.num_layers - 1) + [num_classes]
    return max(min(a, b) for a, b in zip(widths, widths[1:], strict=False))


def chunk_count(setting: str | int, plan: HaloPlan, width: int, dtype: torch.dtype) -> int:
    """Chunks per peer: the setting, or the heuristic's count agreed on by all workers (the
    largest any wants), since both ends of a transfer must cut it the same way."""
    if setting != "auto":
        return int(setting)
    wanted = torch.tensor([auto_chunks(plan, width, dtype)], dtype=torch.int64)
    return int(all_reduce_(wanted, op="max").item())


def assemble(
    cfg: LeoConfig, part: LocalPart, dataset: dict[str, Any], world_size: int, device: torch.device
) -> Job:
    """Build a job from an in-memory part (used by workers and by the single-process oracle)."""
    dtype = DTYPES[cfg.train.dtype]
    plan = halo_plan(part, device)
    width = exchange_width(cfg.model, int(dataset["num_features"]), int(dataset["num_classes"]))
    num_chunks = chunk_count(cfg.pipeline.num_chunks, plan, width, dtype)
    halo_local = torch.from_numpy(np.array(part.halo_owner_local)).to(device)

    def aggregator_for(adj: CSR) -> Aggregator:
        return make_aggregator(
            cfg.pipeline.mode,
            adj,
            plan,
            world_size,
            num_chunks=num_chunks,
            width=width,
            halo_local_H=halo_local,
        )

    graph = build_local_graph(part, cfg.model.name, dtype, device, aggregator_for)
    data = WorkerData.from_part(part, int(dataset["num_train"]), dtype, device)
    model = build_model(
        cfg.model, int(dataset["num_features"]), int(dataset["num_classes"]), cfg.run.seed
    ).to(device=device, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    reducer = make_grad_reducer(model, cfg.pipeline.mode)
    return Job(plan, graph, reducer, data, model, opt)


def build_job(
    run_dir: Path,
    cfg: LeoConfig,
    meta: dict[str, Any],
    rank: int,
    world_size: int,
    device: torch.device,
) -> Job:
    part = read_part(partition_dir(run_dir), rank)
    return assemble(cfg, part, meta["dataset"], world_size, device)
