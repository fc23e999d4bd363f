"""Every mode of the registry, unit by unit: its aggregator against a dense reference on a small
hand-made halo (forward and backward, aggregating, transforming and gathering), and the same
column-block products in every mode.

Two gloo ranks own nodes 0-4 and 5-9 of a ten-node graph whose cut edges make every kind of
halo row: read by one edge, read by several, a node that is both boundary and halo. The
reference is the whole graph's normalised adjacency as a dense matrix.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock
from leo_cli.comm.exchange import CommStats
from leo_cli.comm.modes import Wiring, make_aggregator
from leo_cli.comm.shm import ReadOut, SharedMemory
from leo_cli.comm.views import L3, level_view
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.models.local_graph import part_adjacency
from leo_cli.registry import MODES, mode_of, pipeline_modes
from leo_cli.worker.assemble import halo_plan

pytestmark = pytest.mark.dist

WIDTH, OUT = 3, 2
# Inside each half a path; across: 4-5 (boundary both ways), 0-7 and 0-8 (node 0 read twice by
# rank 1), 2-9, 3-9 (node 9 read twice by rank 0).
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (5, 6), (6, 7), (7, 8), (8, 9)]
EDGES += [(4, 5), (0, 7), (0, 8), (2, 9), (3, 9)]
OWNER = np.array([0] * 5 + [1] * 5)


def hand_made() -> Graph:
    n = 10
    return Graph(
        name="hand-made",
        edge_index_2E=symmetrize(np.array(EDGES).T, n),
        x_NF=np.zeros((n, WIDTH), dtype=np.float32),
        y_N=np.zeros(n, dtype=np.int64),
        train_mask_N=np.ones(n, dtype=bool),
        val_mask_N=np.zeros(n, dtype=bool),
        test_mask_N=np.zeros(n, dtype=bool),
        num_classes=2,
    )


def dense_adjacency(g: Graph) -> torch.Tensor:
    """The whole graph's GCN-normalised adjacency (no self loops), as one part sees it."""
    whole = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    adj = part_adjacency(whole, "gcn", torch.float64, torch.device("cpu"))
    order = torch.from_numpy(np.asarray(whole.inner_nodes, dtype=np.int64))
    dense = torch.zeros(g.num_nodes, g.num_nodes, dtype=torch.float64)
    dense[order.unsqueeze(1), order.unsqueeze(0)] = adj.to_dense()
    return dense


def inputs(n: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(n, WIDTH, dtype=torch.float64, generator=gen),
        "w": torch.randn(OUT, WIDTH, dtype=torch.float64, generator=gen),
        "grad": torch.randn(n, OUT, dtype=torch.float64, generator=gen),
    }


def run_mode(
    name: str, part: LocalPart, world: int, global_in: dict[str, torch.Tensor], attention: bool
) -> dict:
    """Aggregate, transform-aggregate and gather this rank's rows in one mode; outputs and
    input gradients (the ones the reference gives for these rows). `attention`: an aggregator
    for attention layers (halo gradients return as partial sums in every mode; without it
    a transport may move the output gradient as rows instead)."""
    ids = torch.from_numpy(np.asarray(part.inner_nodes, dtype=np.int64))
    adj = part_adjacency(part, "gcn", torch.float64, torch.device("cpu"))
    local_H = torch.from_numpy(np.array(part.halo_owner_local))
    wiring = Wiring(CommStats(), local_H, WIDTH, torch.float64)
    agg = make_aggregator(
        mode_of(name), adj, halo_plan(part, torch.device("cpu")), wiring, [2], attention=attention
    )
    assert agg.grad_rows == (mode_of(name).wire.gradients_as_rows and not attention)
    if isinstance(agg.transport, SharedMemory):  # a gradients' segment only where one is read
        assert (agg.transport.grad_seg is None) == agg.grad_rows
    blocks = [agg.inner, *(c.block for r in agg.schedule(0).rounds for c in r)]
    assert all((b.bwd is None) == agg.grad_rows for b in blocks)  # no unused transposes
    out: dict[str, Any] = {"ids": ids.numpy()}
    x = global_in["x"][ids].clone().requires_grad_(True)
    grad = global_in["grad"][ids]
    y = agg.aggregate(x @ global_in["w"].t(), 0)
    (y * grad).sum().backward()
    out["aggregate"], out["aggregate_grad"] = y.detach().numpy(), x.grad.numpy().copy()
    x.grad = None
    w = global_in["w"].clone().requires_grad_(True)
    y2, h = agg.transform_aggregate(x, w, 1)
    (y2 * grad).sum().backward()
    out["transform"], out["transform_grad"] = y2.detach().numpy(), x.grad.numpy().copy()
    out["w_grad"] = w.grad.numpy().copy()
    if attention:
        full = agg.gather(x.detach() @ global_in["w"].t(), 0)
        out["gather_inner"] = full[: part.num_inner].numpy()
    out["bytes"] = agg.stats.bytes_sent
    return out


def every_mode(rank: int, world: int, parts: list[LocalPart], g_in: dict) -> dict[str, Any]:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return {
        (name, attention): run_mode(name, parts[rank], world, g_in, attention)
        for name in pipeline_modes()
        for attention in (True, False)
    }


def test_every_mode_matches_the_dense_reference() -> None:
    g = hand_made()
    parts = build_parts(g, OWNER, 2)
    g_in = inputs(g.num_nodes)
    A = dense_adjacency(g)
    h = g_in["x"] @ g_in["w"].t()
    ref_y = A @ h
    ref_grad = (A.t() @ g_in["grad"]) @ g_in["w"]
    by_rank = spawn_ranks(every_mode, 2, parts, g_in)
    for res in by_rank:
        assert not isinstance(res, Exception), res
        ids = torch.from_numpy(res[pipeline_modes()[0], True]["ids"])
        own = torch.zeros(g.num_nodes, dtype=torch.bool)
        own[ids] = True
        local_A = A * own.unsqueeze(0)  # what a worker computes with zeros for its halo
        for (name, attention), got in res.items():
            mode, msg = mode_of(name), f"{name} attention={attention}"
            y_ref, grad_ref = (ref_y, ref_grad) if mode.exact else (local_A @ h, None)
            np.testing.assert_allclose(got["aggregate"], y_ref[ids], atol=1e-12, err_msg=msg)
            np.testing.assert_allclose(got["transform"], y_ref[ids], atol=1e-12, err_msg=msg)
            if attention:
                np.testing.assert_allclose(got["gather_inner"], h[ids], atol=1e-12, err_msg=msg)
            if grad_ref is not None:
                for key in ("aggregate_grad", "transform_grad"):
                    np.testing.assert_allclose(got[key], grad_ref[ids], atol=1e-12, err_msg=msg)
            assert (got["bytes"] > 0) == (mode.transport != "none"), msg
    # Weight gradients summed over ranks are the whole graph's.
    for key in by_rank[0]:
        if mode_of(key[0]).exact:
            w_grad = sum(res[key]["w_grad"] for res in by_rank)
            np.testing.assert_allclose(w_grad, g_in["grad"].t() @ A @ g_in["x"], atol=1e-12)


def slow_reader(rank: int, world: int, parts: list[LocalPart], g_in: dict) -> dict[str, Any]:
    """Three shared-memory aggregations in a row, rank 1 reading each chunk late: rank 0 must
    not write the next exchange into the one copy before rank 1 has read this one out."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = parts[rank]
    ids = torch.from_numpy(np.asarray(part.inner_nodes, dtype=np.int64))
    adj = part_adjacency(part, "gcn", torch.float64, torch.device("cpu"))
    local_H = torch.from_numpy(np.array(part.halo_owner_local))
    wiring = Wiring(CommStats(), local_H, WIDTH, torch.float64)
    plan = halo_plan(part, torch.device("cpu"))
    agg = make_aggregator(mode_of("shared-memory"), adj, plan, wiring, [1])
    if rank == 1:
        read = ReadOut.read

        def late(self: ReadOut, c: Any) -> torch.Tensor:
            time.sleep(0.3)
            return read(self, c)

        ReadOut.read = late  # type: ignore[method-assign]
    h = g_in["x"][ids] @ g_in["w"].t()
    return {"ids": ids.numpy(), "out": [agg.aggregate(h * k, 0).numpy() for k in (1, 2, 3)]}


def test_shared_memory_writes_only_once_every_reader_is_done() -> None:
    g = hand_made()
    parts = build_parts(g, OWNER, 2)
    g_in = inputs(g.num_nodes)
    ref = dense_adjacency(g) @ (g_in["x"] @ g_in["w"].t())
    for res in spawn_ranks(slow_reader, 2, parts, g_in):
        assert not isinstance(res, Exception), res
        for k, got in zip((1, 2, 3), res["out"], strict=True):
            np.testing.assert_allclose(got, k * ref[res["ids"]], atol=1e-12)


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


def products_of_every_mode(rank: int, world: int, parts: list[LocalPart]) -> dict[str, Any]:
    """Each mode's aggregation of the same rows, and the products it ran (one chunk)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = parts[rank]
    adj = part_adjacency(part, "gcn", torch.float64, torch.device("cpu"))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(part.num_inner, WIDTH, dtype=torch.float64, generator=gen)
    grad = torch.randn(part.num_inner, WIDTH, dtype=torch.float64, generator=gen)
    calls: list[tuple[Any, ...]] = []
    count_products(calls)
    out: dict[str, Any] = {"edges": adj.num_edges}
    local_H = torch.from_numpy(np.array(part.halo_owner_local))
    for name in pipeline_modes():
        wiring = Wiring(CommStats(), local_H, WIDTH, torch.float64)
        plan = halo_plan(part, torch.device("cpu"))
        view = (adj, plan)
        if MODES[name].per_edge_rows:  # every row L3 (worker/assemble.py every_row_l3), per edge
            view = level_view(adj, plan, torch.full((plan.num_halo,), L3, dtype=torch.int64))
        agg = make_aggregator(mode_of(name), *view, wiring, [1])
        h = x.clone().requires_grad_(True)
        calls.clear()
        (agg.aggregate(h, 0) * grad).sum().backward()
        out[name] = list(calls)
    return out


def test_every_mode_runs_the_same_block_products() -> None:
    """Modes differ only in how rows move: every SpMM is a column block's, the blocks read
    every local edge once per direction, and the modes that keep one row per halo node run
    the very same list of products (compute-only: the exact modes' computation); a transport
    moving the output gradient as rows runs the forward's products over it."""
    from conftest import random_graph

    g = random_graph(num_nodes=80, num_edges=320, num_features=WIDTH, seed=7)
    parts = build_parts(g, np.arange(g.num_nodes) % 2, 2)
    for r, res in enumerate(spawn_ranks(products_of_every_mode, 2, parts)):
        assert not isinstance(res, Exception), res
        reference = None
        for name in pipeline_modes():
            calls = [c for c in res[name] if c[0] != "spmm"]
            assert len(res[name]) == 2 * len(calls), (name, r)  # each block product one SpMM
            if MODES[name].wire.gradients_as_rows:  # the backward aggregates gradient rows
                half = len(calls) // 2
                assert all(c[0] == "forward" for c in calls), (name, r)
                calls = calls[:half] + [("backward", *c[1:]) for c in calls[half:]]
            blocks = sorted(calls)
            for direction in ("forward", "backward"):
                edges = sum(c[3] for c in blocks if c[0] == direction)
                assert edges == res["edges"], (name, r, direction)
            if not MODES[name].per_edge_rows:  # per-edge rows: one column per remote edge
                reference = reference or blocks
                assert blocks == reference, (name, r)
