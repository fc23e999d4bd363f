"""Every mode runs the same computation: the same column-block products, forward and backward.

Modes differ only in how and when halo rows move (comm/transport.py), so a benchmark's ratio
between two modes measures communication, and `compute-only` is the exact modes' computation
with the transfers removed. Counted here on real gloo ranks: every SpMM of an aggregation goes
through a column block, the blocks cover every local edge once per direction, and blocking,
shared-memory, compute-only and one-chunk leo run the very same list of products.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import random_graph
from dist_harness import spawn_ranks

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock
from leo_cli.comm.modes import make_aggregator
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.models.local_graph import part_adjacency
from leo_cli.train.assemble import halo_plan

pytestmark = pytest.mark.dist

MODES = ("blocking", "leo", "fine-grained", "shared-memory", "compute-only")
WIDTH = 3


def count_products(calls: list[tuple[Any, ...]]) -> None:
    """Record every block product and every SpMM (patched on the class and the module)."""
    block_fwd, block_bwd, spmm = ColumnBlock.forward, ColumnBlock.backward, kernels.spmm

    def fwd(self: ColumnBlock, x: torch.Tensor) -> torch.Tensor:
        calls.append(("forward", self.fwd.num_rows, self.num_cols, self.num_edges, x.shape[1]))
        return block_fwd(self, x)

    def bwd(self: ColumnBlock, grad: torch.Tensor) -> torch.Tensor:
        calls.append(("backward", self.fwd.num_rows, self.num_cols, self.num_edges, grad.shape[1]))
        return block_bwd(self, grad)

    def counted_spmm(adj: kernels.CSR, x: torch.Tensor) -> torch.Tensor:
        calls.append(("spmm", adj.num_edges))
        return spmm(adj, x)

    ColumnBlock.forward = fwd  # type: ignore[method-assign]
    ColumnBlock.backward = bwd  # type: ignore[method-assign]
    kernels.spmm = counted_spmm


def aggregate_every_mode(rank: int, world: int, parts: list[LocalPart]) -> dict[str, Any]:
    """Each mode's aggregation of the same rows, its input gradient and the products it ran."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = parts[rank]
    adj, _ = part_adjacency(part, "gcn", torch.float64, torch.device("cpu"))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(part.num_inner, WIDTH, dtype=torch.float64, generator=gen)
    grad = torch.randn(part.num_inner, WIDTH, dtype=torch.float64, generator=gen)
    calls: list[tuple[Any, ...]] = []
    count_products(calls)
    out: dict[str, Any] = {"edges": adj.num_edges}
    for mode in MODES:
        agg = make_aggregator(
            mode,
            adj,
            halo_plan(part, torch.device("cpu")),
            world,
            num_chunks=[1],
            width=WIDTH,
            halo_local_H=torch.from_numpy(np.array(part.halo_owner_local)),
        )
        h = x.clone().requires_grad_(True)
        calls.clear()
        y = agg.aggregate(h, 0)
        (y * grad).sum().backward()
        out[mode] = {"y": y.detach().numpy(), "grad": h.grad.numpy(), "calls": list(calls)}
    return out


def test_every_mode_runs_the_same_block_products() -> None:
    g = random_graph(num_nodes=80, num_edges=320, num_features=WIDTH, seed=7)
    parts = build_parts(g, assign_parts(g, 2, "random", seed=0), 2)
    by_rank = spawn_ranks(aggregate_every_mode, 2, parts)
    for r, res in enumerate(by_rank):
        assert not isinstance(res, Exception), res
        ref = res["blocking"]
        ref_blocks = sorted(c for c in ref["calls"] if c[0] != "spmm")
        for mode in MODES:
            calls = res[mode]["calls"]
            spmm_calls = [c for c in calls if c[0] == "spmm"]
            blocks = [c for c in calls if c[0] != "spmm"]
            # Every SpMM is a block's, and the blocks read every local edge once per direction.
            assert len(spmm_calls) == len(blocks), (mode, r)
            for direction in ("forward", "backward"):
                edges = sum(c[3] for c in blocks if c[0] == direction)
                assert edges == res["edges"], (mode, r, direction)
            if mode != "fine-grained":  # its halo has one column per remote edge
                assert sorted(blocks) == ref_blocks, (mode, r)
            if mode != "compute-only":
                np.testing.assert_allclose(res[mode]["y"], ref["y"], rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(res[mode]["grad"], ref["grad"], rtol=1e-12, atol=1e-12)
