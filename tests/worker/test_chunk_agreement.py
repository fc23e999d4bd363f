"""Both ends of a chunked transfer cut it the same way: `auto` chunk counts are agreed on."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from leo_cli.comm import modes
from leo_cli.comm.exchange import HaloPlan
from leo_cli.worker.assemble import chunk_counts

pytestmark = pytest.mark.dist

# Rank r sends ROWS[r][q] rows to q (and receives the transpose): ranks 0 and 1 exchange a
# lot, rank 2 little, so alone they would cut their transfers into different chunk counts.
ROWS = [[0, 1000, 10], [1000, 0, 10], [10, 10, 0]]


def _auto(rank: int, world: int) -> int:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    modes.AUTO_CHUNK_BYTES = 4096  # a few rows per chunk, so the two ranks want different counts
    send = ROWS[rank]
    recv = [ROWS[q][rank] for q in range(world)]
    plan = HaloPlan(5, torch.zeros(sum(send), dtype=torch.int64), send, recv)
    alone = modes.auto_chunks(plan, 16)
    agreed = chunk_counts("auto", None, plan, 16)[0]
    return alone * 1000 + agreed


def test_auto_chunk_counts_agree_across_ranks() -> None:
    got = spawn_ranks(_auto, 3)
    assert not any(isinstance(g, Exception) for g in got), got
    assert len({g // 1000 for g in got}) > 1  # what each rank would pick alone differs
    agreed = {g % 1000 for g in got}
    assert len(agreed) == 1 and agreed == {modes.AUTO_MAX_CHUNKS}
    empty = HaloPlan(0, torch.zeros(0, dtype=torch.int64), [0], [0])
    assert chunk_counts(3, [2, 5], empty, 16) == [3]
    assert chunk_counts("auto", [2, 5], empty, 16) == [2, 5]
