"""L3 rows read in place, through a three-layer forward and backward (every layer's rows share
one pair of published copies): the same numbers as the dense reference, with every halo row
read in place, with every other one (the rest exchanged through the process group), and with
the pairs choosing apart (one rank reads every row of its peer, the other its L3 rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from test_modes import OWNER, WIDTH, dense_adjacency, hand_made, inputs

from leo_cli.comm.exchange import CommStats
from leo_cli.comm.levels import InPlaceSetting, RankLevels, build_levels
from leo_cli.comm.modes import Wiring, make_layer_aggregators
from leo_cli.graph.layout import build_parts
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
    setting = InPlaceSetting(WIDTH, 30.0, local_H, stats, owners)
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
