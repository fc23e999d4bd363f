"""Published rows without a barrier: a reader sees every exchange whole, however slow it is,
because a writer waits for the readers' acknowledgements of the copy it overwrites (one copy,
the default: of the previous exchange; two: of the one before); a writer that runs further
ahead than its copies allow, or a reader that skips the readiness wait, would not (shown, so
the tests have teeth)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from leo_cli.comm.published import FORWARD, Layout, PublishedRows

pytestmark = pytest.mark.dist

ROWS, WIDTH, EXCHANGES = 64, 4, 12


def layout(copies: int, lead: int | None = None) -> Layout:
    return Layout(2, 2, ROWS, [0, 0], WIDTH, 8, copies, lead=lead)


def writer_and_slow_reader(
    rank: int,
    world: int,
    copies: int,
    wait: bool,
    writer_pause: float = 0.0,
    lead: int | None = None,
) -> list[Any]:
    """Rank 0 publishes exchange k as rows full of k, as fast as it may (or pausing
    `writer_pause` seconds before each); rank 1 reads each exchange in two halves with a pause
    between them and reports what it saw."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lays = [layout(copies, lead), layout(copies, lead)]
    rows = PublishedRows(lays, rank, torch.float64, timeout_s=30)
    stream = 2 * 0 + FORWARD
    seen: list[Any] = []
    for _ in range(EXCHANGES):
        if rank == 0:
            time.sleep(writer_pause)
            k, copy = rows.begin_write(stream, readers=[1])
            rows.forward_rows(0, copy, WIDTH).fill_(float(k))
            rows.end_write(stream, k)
            continue
        k, copy = rows.begin_read(stream, writer=0, wait=wait)
        buf = rows.forward_rows(0, copy, WIDTH)
        first = buf[: ROWS // 2].clone()
        time.sleep(0.02)  # a slow reader: the writer may run ahead meanwhile
        second = buf[ROWS // 2 :].clone()
        rows.end_read(stream, 0, k)
        seen.append((k, sorted({*first.flatten().tolist(), *second.flatten().tolist()})))
    dist.barrier()
    return seen


def torn(seen: list[Any]) -> list[Any]:
    """Exchanges the reader did not see whole and as published."""
    return [(k, values) for k, values in seen if values != [float(k)]]


def test_every_exchange_is_read_whole_with_two_copies() -> None:
    seen = spawn_ranks(writer_and_slow_reader, 2, 2, True)[1]
    assert not isinstance(seen, Exception), seen
    assert len(seen) == EXCHANGES and torn(seen) == []


def test_every_exchange_is_read_whole_with_one_copy() -> None:
    seen = spawn_ranks(writer_and_slow_reader, 2, 1, True)[1]
    assert not isinstance(seen, Exception), seen
    assert len(seen) == EXCHANGES and torn(seen) == []


def test_a_writer_ahead_of_its_copies_overwrites_a_slow_read() -> None:
    seen = spawn_ranks(writer_and_slow_reader, 2, 1, True, 0.0, 2)[1]
    assert not isinstance(seen, Exception), seen
    assert torn(seen), "one copy, two exchanges ahead, should have let the writer overwrite a read"


def test_a_reader_that_skips_the_readiness_wait_reads_stale_rows() -> None:
    # A writer slower than the reader: an impatient reader runs ahead of what is published
    # (without the pause a loaded machine may slow the reader enough to hide it).
    seen = spawn_ranks(writer_and_slow_reader, 2, 2, False, 0.1)[1]
    assert not isinstance(seen, Exception), seen
    assert torn(seen), "reading before the writer published should have seen old rows"


def asks_before_reading(rank: int, world: int) -> list[tuple[bool, bool]]:
    """Rank 1 asks whether rank 0 has published its next exchange before and after rank 0
    publishes it (barriers order the two), then reads it. Twice."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = PublishedRows([layout(2), layout(2)], rank, torch.float64, timeout_s=30)
    seen = []
    for _ in range(2):
        early = rows.published(FORWARD, 0) if rank == 1 else False
        dist.barrier()
        if rank == 0:
            k, _ = rows.begin_write(FORWARD, readers=[1])
            rows.end_write(FORWARD, k)
        dist.barrier()
        if rank == 1:
            late = rows.published(FORWARD, 0)
            k, _ = rows.begin_read(FORWARD, writer=0)
            rows.end_read(FORWARD, 0, k)
            seen.append((early, late))
    dist.barrier()
    return seen


def test_a_reader_can_ask_whether_the_next_exchange_is_published() -> None:
    """What the aggregation asks before it decides to sum its local rows first."""
    seen = spawn_ranks(asks_before_reading, 2)[1]
    assert not isinstance(seen, Exception), seen
    assert seen == [(False, True), (False, True)]


def regions_after_writes(rank: int, world: int, widths: tuple[int, int]) -> list[float]:
    """Fill copy 0's forward rows, then its backward rows, at their widths; the values left."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = PublishedRows([Layout(2, 1, 5, [3], 8, 8, 2)], rank, torch.float64, timeout_s=30)
    forward, backward = widths
    for copy in (0, 1):
        rows.forward_rows(0, copy, forward).fill_(1.0 + copy)
        rows.backward_rows(0, 0, copy, backward).fill_(3.0 + copy)
    seen = [rows.forward_rows(0, c, forward).unique().tolist() for c in (0, 1)]
    seen += [rows.backward_rows(0, 0, c, backward).unique().tolist() for c in (0, 1)]
    return seen


@pytest.mark.parametrize("widths", [(8, 2), (2, 8), (8, 8), (3, 5)])
def test_forward_and_backward_regions_are_disjoint_for_any_widths(
    widths: tuple[int, int],
) -> None:
    """A layer whose forward rows are wider than its gradients (or narrower) overwrites
    nothing of the other region, in either copy."""
    assert spawn_ranks(regions_after_writes, 1, widths) == [[[1.0], [2.0], [3.0], [4.0]]]
