"""The buffer estimate (planner/cost.py `mode_buffers`) against the jobs it describes: the
bytes of the column blocks and row lists each mode's assembled aggregator really holds, on
small graphs, compared between modes (what every mode holds alike is left out of both)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import random_graph
from helpers.ranks import dataset_info, spawn_ranks

from leo_cli.comm.blocks import selected_columns_block
from leo_cli.comm.levels import RankLevels
from leo_cli.config import load_config
from leo_cli.graph.layout import build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.models.local_graph import part_adjacency
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import (
    _part_csr_bytes,
    _replica_block_bytes,
    _transpose_bytes,
    mode_buffers,
)
from leo_cli.planner.make import model_shape
from leo_cli.planner.plan import RankCache
from leo_cli.planner.reach import Reach
from leo_cli.worker.assemble import assemble, every_row_l3

# (mode, extra settings, every row read in place)
RUNS = [
    ("blocking", [], False),
    ("shared-memory", [], False),
    ("leo", ["pipeline.transport=process-group"], False),
    ("leo", ["pipeline.transport=shared-memory"], True),
    ("fine-grained", ["pipeline.transport=shared-memory"], True),
    ("fine-grained", ["pipeline.transport=process-group"], False),
]
SETTINGS = ["model.input_dropout=0.5", "model.hidden_channels=16"]


def held_bytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages reachable from `obj` through attributes,
    sequences and dicts, but those mapped from a file (shared segments, the part's map)."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    todo = [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen or isinstance(x, (int, float, str, bool, type(None), torch.dtype)):
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            if not getattr(s, "filename", None):
                storages[s.data_ptr()] = s.nbytes()
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif hasattr(x, "__dict__") and not isinstance(x, torch.nn.Module):
            todo.extend(vars(x).values())
    return sum(storages.values())


def _held_per_run(rank: int, world: int, parts: list[Any], info: Any) -> list[int]:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = []
    for mode, extra, _ in RUNS:
        cfg = load_config(None, [f"pipeline.mode={mode}", *SETTINGS, *extra])
        job = assemble(cfg, parts[rank], info, world, torch.device("cpu"))
        out.append(held_bytes(job.graph.aggregator))
    return out


@pytest.mark.dist
@pytest.mark.parametrize("num_edges", [1200, 6000])
def test_structures_of_each_mode_match_its_assembled_aggregator(num_edges: int) -> None:
    g = random_graph(num_nodes=600, num_edges=num_edges, num_features=24, seed=5)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    info = dataset_info(g)
    held = spawn_ranks(_held_per_run, 2, parts, info)
    for r in held:
        assert not isinstance(r, Exception), r
    cfg = load_config(None, SETTINGS)
    shape = model_shape(cfg.model, info.num_features, info.num_classes, 4)
    accesses = [PartAccess.from_part(p) for p in parts]
    none = [RankCache() for _ in parts]
    every = Reach(~np.eye(2, dtype=bool), every_row=True)
    estimates = [
        mode_buffers(accesses, none, shape, mode, every if in_place else None).structures
        for mode, _, in_place in RUNS
    ]
    for r in range(2):  # each run against blocking's: what every mode holds drops out
        for i, (mode, extra, _) in enumerate(RUNS[1:], start=1):
            really = held[r][i] - held[r][0]
            estimated = estimates[i][r] - estimates[0][r]
            assert abs(estimated - really) <= 0.01 * abs(really) + 64, (mode, extra, r)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_the_parts_csr_is_what_set_up_holds_of_it(model: str) -> None:
    """Set-up's part CSR (forward-only where the views of rows read in place replace it,
    else with its transpose) against `_part_csr_bytes` and `_transpose_bytes`."""
    g = random_graph(num_nodes=600, num_edges=3000, num_features=8, seed=2)
    part = build_parts(g, assign_parts(g, 2, "range", 0), 2)[0]
    cfg = load_config(None, [f"model.name={model}"])
    shape = model_shape(cfg.model, 8, 3, 4)
    access = PartAccess.from_part(part)
    cpu = torch.device("cpu")
    alone = held_bytes(part_adjacency(part, model, torch.float32, cpu, transpose=False))
    both = held_bytes(part_adjacency(part, model, torch.float32, cpu, transpose=True))
    assert alone == _part_csr_bytes(access, shape)
    assert both - alone == _transpose_bytes(access, shape)


@pytest.mark.parametrize("replicas", [[], [0, 3]])
def test_a_per_edge_modes_listed_rows_are_what_set_up_holds_of_them(replicas: list[int]) -> None:
    """A per-edge mode's set-up against a bulk one's, both with the part's transpose: the
    difference is its list of every halo row but the replicas (`every_row_l3`), as held."""
    g = random_graph(num_nodes=600, num_edges=3000, num_features=8, seed=2)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    shape = model_shape(load_config(None, []).model, 8, 3, 4)
    accesses = [PartAccess.from_part(p) for p in parts]
    caches = [RankCache(replica_rows=np.array(replicas, dtype=np.int64)) for _ in parts]
    held = [held_bytes(every_row_l3(RankLevels(False, replicas, []), a.num_halo)) for a in accesses]
    per_edge = mode_buffers(accesses, caches, shape, "fine-grained").setup
    bulk = mode_buffers(accesses, caches, shape, "blocking").setup
    assert all(h > 0 for h in held)
    assert [a - b for a, b in zip(per_edge, bulk, strict=True)] == held


def test_the_replicas_block_is_what_fetch_replicas_holds_of_it() -> None:
    """The replicas' column block (comm/levels.py `fetch_replicas`, from the part's CSR with
    its transpose) against `_replica_block_bytes`, every halo row replicated: each row
    reading the halo reads a replica, so the estimate's readers are exact."""
    g = random_graph(num_nodes=600, num_edges=3000, num_features=8, seed=2)
    part = build_parts(g, assign_parts(g, 2, "range", 0), 2)[0]
    shape = model_shape(load_config(None, []).model, 8, 3, 4)
    access = PartAccess.from_part(part)
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"), transpose=True)
    rows = np.arange(access.num_halo, dtype=np.int64)
    block = selected_columns_block(adj, torch.from_numpy(rows + access.num_inner))
    assert held_bytes(block) == _replica_block_bytes(access, RankCache(replica_rows=rows), shape)
