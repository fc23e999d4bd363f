"""Assembling one worker's job: partition -> halo plan -> exchanger -> graph, data, model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leo_cli.comm.exchange import HaloPlan, make_exchanger
from leo_cli.config import LeoConfig
from leo_cli.graph.layout import LocalPart
from leo_cli.graph.stage import partition_dir
from leo_cli.graph.storage import read_part
from leo_cli.models.gnn import GNN, build_model
from leo_cli.models.graph import LocalGraph, build_local_graph
from leo_cli.train.trainer import WorkerData

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Job:
    plan: HaloPlan
    graph: LocalGraph
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


def assemble(
    cfg: LeoConfig, part: LocalPart, dataset: dict[str, Any], world_size: int, device: torch.device
) -> Job:
    """Build a job from an in-memory part (used by workers and by the single-process oracle)."""
    dtype = DTYPES[cfg.train.dtype]
    plan = halo_plan(part, device)
    exchanger = make_exchanger(cfg.pipeline.mode, plan, world_size)
    graph = build_local_graph(part, cfg.model.name, dtype, exchanger, device)
    data = WorkerData.from_part(part, int(dataset["num_train"]), dtype, device)
    model = build_model(
        cfg.model, int(dataset["num_features"]), int(dataset["num_classes"]), cfg.run.seed
    ).to(device=device, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    return Job(plan, graph, data, model, opt)


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
