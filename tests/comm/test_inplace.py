"""L3 rows read in place, through a three-layer forward and backward (every layer's rows share
one pair of published copies): the same numbers as the dense reference, with every halo row
read in place, with every other one (the rest exchanged through the process group), and with
the pairs choosing apart (one rank reads every row of its peer, the other its L3 rows); and
what owners and readers learn of each other's rows at set-up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from test_modes import OWNER, WIDTH, dense_adjacency, hand_made, inputs

from leo_cli.comm.dist import all_gather_
from leo_cli.comm.exchange import CommStats, distinct_rows
from leo_cli.comm.inplace import answer_readers
from leo_cli.comm.levels import InPlaceSetting, RankLevels, build_levels
from leo_cli.comm.modes import Wiring, make_layer_aggregators
from leo_cli.comm.views import halo_owner
from leo_cli.graph.layout import build_parts
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.models.local_graph import part_adjacency
from leo_cli.registry import mode_of
from leo_cli.worker.assemble import halo_plan

pytestmark = pytest.mark.dist


def three_layers(rank: int, world: int, parts: Any, g_in: Any, every: int, whole: bool) -> Any:
    """Three iterations of a three-layer forward and backward on the leo aggregators with
    every `every`-th halo row read in place; `whole`: rank 0 reads every row of rank 1 in
    place (a pair `pipeline.transport=auto` chose so), rank 1 its L3 rows of rank 0 only."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = parts[rank]
    ids = torch.from_numpy(np.asarray(part.inner_nodes, dtype=np.int64))
    adj = part_adjacency(part, "gcn", torch.float64, torch.device("cpu"))
    plan = halo_plan(part, torch.device("cpu"))
    local_H = torch.from_numpy(np.array(part.halo_owner_local, dtype=np.int64))
    stats = CommStats()
    rows = list(range(plan.num_halo))[::every]
    lv = RankLevels(False, [], rows)
    x = g_in["x"][ids]
    halo_ids = torch.from_numpy(np.array(part.halo_nodes))
    owners = frozenset({1}) if whole and rank == 0 else frozenset()
    setting = InPlaceSetting(WIDTH, 30.0, stats, owners)
    levels = build_levels(adj, plan, x, halo_ids, lv, True, setting)
    assert levels.in_place is not None
    read = plan.num_halo if owners else len(rows)  # the hand-made graph's halo is one owner's
    assert sum(o.num_rows for o in levels.in_place.reads) == read
    wiring = Wiring(stats, local_H, WIDTH, torch.float64)
    agg = make_layer_aggregators(
        mode_of("leo"), levels.layer0, levels.others, wiring, [2], in_place=levels.in_place
    )
    outs = []
    for _ in range(3):
        xx = x.clone().requires_grad_(True)
        y0, _ = agg.transform_aggregate(xx, g_in["w"], 0)  # width 2
        y1 = agg.aggregate(torch.relu(y0), 1)
        y2 = agg.aggregate(y1 * 2, 2)
        (y2.sum(1) * g_in["grad"][ids][:, 0]).sum().backward()
        outs.append((y2.detach().numpy(), xx.grad.numpy()))
    dist.barrier()
    return ids.numpy(), outs


def reference(A: torch.Tensor, g_in: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x = g_in["x"].clone().requires_grad_(True)
    y0 = A @ (x @ g_in["w"].t())
    y1 = A @ torch.relu(y0)
    y2 = A @ (y1 * 2)
    (y2.sum(1) * g_in["grad"][:, 0]).sum().backward()
    return y2.detach(), x.grad


def check_three_layers(run: Any, every: int, whole: bool) -> None:
    """`run` (three_layers or a variant of it) at two ranks equals the dense reference."""
    g = hand_made()
    parts, g_in = build_parts(g, OWNER, 2), inputs(g.num_nodes)
    ref, ref_grad = reference(dense_adjacency(g), g_in)
    for res in spawn_ranks(run, 2, parts, g_in, every, whole):
        assert not isinstance(res, Exception), res
        ids, outs = res
        for y, grad_x in outs:
            np.testing.assert_allclose(y, ref[ids].numpy(), atol=1e-12)
            np.testing.assert_allclose(grad_x, ref_grad[ids].numpy(), atol=1e-12)


@pytest.mark.parametrize(("every", "whole"), [(1, False), (2, False), (2, True)])
def test_rows_read_in_place_through_three_layers(every: int, whole: bool) -> None:
    check_three_layers(three_layers, every, whole)


def answered(rank: int, world: int, parts: Any, every: int) -> Any:
    """What `answer_readers` gives this rank for every `every`-th halo row."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    plan = halo_plan(parts[rank], torch.device("cpu"))
    rows_H = torch.arange(0, plan.num_halo, every)
    owner_R = halo_owner(plan, rows_H)
    boundary_B = distinct_rows(plan.send_idx_S, plan.num_inner)
    read = torch.bincount(owner_R, minlength=world)
    counts = all_gather_(torch.cat([read.new_tensor([boundary_B.shape[0]]), read]))
    read_by, position_R = answer_readers(plan, rows_H, owner_R, boundary_B, counts[:, 1:])
    dist.barrier()
    return {r: rows.numpy() for r, rows in read_by.items()}, position_R.numpy()


@pytest.mark.parametrize("every", [1, 3])
def test_owners_answer_each_reader_with_its_rows_and_their_positions(every: int) -> None:
    """Readers learn each row's position among its owner's published rows, owners which of
    their rows each reader reads (in the reader's order), from the halo plans alone: what the
    owner-local ids of the halo give (`halo_owner_local`, the published rows sorted)."""
    rng = np.random.default_rng(3)
    n, world = 60, 3
    edges = symmetrize(rng.integers(0, n, (2, 240)), n)
    g = Graph(
        name="random", edge_index_2E=edges, x_NF=np.zeros((n, 2), dtype=np.float32),
        y_N=np.zeros(n, dtype=np.int64), train_mask_N=np.ones(n, dtype=bool),
        val_mask_N=np.zeros(n, dtype=bool), test_mask_N=np.zeros(n, dtype=bool), num_classes=2,
    )  # fmt: skip
    parts = build_parts(g, rng.integers(0, world, n), world)
    results = spawn_ranks(answered, world, parts, every)
    for res in results:
        assert not isinstance(res, Exception), res
    published = [np.unique(np.asarray(p.send_idx)) for p in parts]
    for r, part in enumerate(parts):
        rows_H = np.arange(part.num_halo)[::every]
        owner_R = np.asarray(part.halo_owner)[rows_H]
        local_R = np.asarray(part.halo_owner_local)[rows_H]
        position_R = results[r][1]
        for q in range(world):
            at = owner_R == q
            np.testing.assert_array_equal(published[q][position_R[at]], local_R[at])
            read_by = results[q][0]
            if at.any():
                np.testing.assert_array_equal(read_by[r], local_R[at])
            else:
                assert r not in read_by
