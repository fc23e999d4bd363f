"""Set-up fetches of the halo's rows (comm/exchange.py `fetch_halo`): in one all-to-all or in
rounds of at most `FETCH_ROUND_BYTES` sent, every halo row lands where its plan puts it, and
the static aggregate built on them holds the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import random_graph
from helpers.ranks import spawn_ranks

from leo_cli import kernels
from leo_cli.comm import exchange
from leo_cli.comm.levels import static_aggregate
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.kernels import variants
from leo_cli.models.local_graph import part_adjacency
from leo_cli.worker.assemble import halo_plan

CPU = torch.device("cpu")


def fetch_both_ways(
    rank: int, world: int, parts: list[LocalPart], x_all: np.ndarray
) -> dict[str, Any]:
    """Each rank's halo fetched at once and in rounds of 16 bytes (one or two rows), its
    all-to-alls counted, the static aggregate of either, and that aggregate's SpMM of the
    inner and halo rows put together from the whole graph's features (`x_all`)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = parts[rank]
    plan = halo_plan(part, CPU)
    ids = torch.from_numpy(part.inner_nodes).to(torch.float64)
    rows_NF = torch.stack([ids, -ids], dim=1)  # each row says whose it is
    adj = part_adjacency(part, "gcn", torch.float64, CPU, True)
    x_NF = torch.from_numpy(part.x).to(torch.float64)
    calls: list[int] = []
    moved = exchange.all_to_all_rows

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return moved(*args, **kwargs)

    exchange.all_to_all_rows = counted  # type: ignore[assignment]
    whole = torch.from_numpy(np.concatenate([x_all[part.inner_nodes], x_all[part.halo_nodes]]))
    with variants.serving(variants.AUTO):  # the aggregate's own SpMM (comm/levels.py)
        wanted = kernels.spmm(adj, whole.to(torch.float64))
    out: dict[str, Any] = {"halo": part.halo_nodes, "wanted": wanted.numpy()}
    for name, round_bytes in (("once", exchange.FETCH_ROUND_BYTES), ("rounds", 16)):
        exchange.FETCH_ROUND_BYTES = round_bytes
        calls.clear()
        out[name] = exchange.fetch_halo(rows_NF, plan).numpy()
        out[f"{name}_calls"] = len(calls)
        out[f"{name}_static"] = static_aggregate(adj, plan, x_NF, True).numpy()
    return out


@pytest.mark.dist
def test_the_halo_fetched_in_rounds_is_the_halo_fetched_at_once() -> None:
    g = random_graph(num_nodes=90, num_edges=400, seed=3)
    parts = build_parts(g, assign_parts(g, 3, "random", seed=0), 3)
    ranks = spawn_ranks(fetch_both_ways, 3, parts, g.x_NF)
    for part, got in zip(parts, ranks, strict=True):
        assert not isinstance(got, Exception), got
        want = got["halo"].astype(np.float64)
        assert part.num_halo > 2 and got["once_calls"] == 1 and got["rounds_calls"] > 2
        for name in ("once", "rounds"):
            assert np.array_equal(got[name], np.stack([want, -want], axis=1)), name
        assert np.array_equal(got["once_static"], got["wanted"])
        assert np.array_equal(got["rounds_static"], got["wanted"])
