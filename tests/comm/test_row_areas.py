"""Published rows in device memory (CUDA workers, comm/row_areas.py), emulated on the CPU.

A GPU's copy into a worker's rows, and a kernel reading a peer's, are only enqueued when the
call returns. `StagedAreas` behaves so: a worker's writes land in its row area, where peers
read them, only at a fence. With it the protocol must still deliver every exchange whole (the
fences of `end_write`), the fences must come before each sequence number and acknowledgement
is written, and the three-layer in-place aggregation must equal the dense reference. Areas whose
fence does nothing show that the emulation has teeth. Around symmetric memory (a stand-in for
its module here): each host's group, one allocation size for its members, group ranks mapped
to global ones, and a failure on one rank stopping every rank. The symmetric-memory calls
themselves need two GPUs (scripts/gpu-check-train.sh).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from test_inplace import check_three_layers, three_layers
from test_published import EXCHANGES, ROWS, WIDTH, layout, torn

from leo_cli.comm import published
from leo_cli.comm.published import FORWARD, Layout, PublishedRows, _map_host_segments
from leo_cli.comm.row_areas import HostAreas, PeerDeviceAreas
from leo_cli.errors import TrainError

pytestmark = pytest.mark.dist


class StagedAreas:
    """Row copies in their own segments, as device buffers are apart from the counters; this
    worker's writes are staged and reach its area (and its readers) only at `fence()`."""

    def __init__(self, layouts: list[Layout | None], rank: int, lands: bool = True) -> None:
        rows = [None if lay is None else published.replace(lay, host_rows=True) for lay in layouts]
        segments = _map_host_segments(rows, rank)
        headers = {q: lay.header * 8 for q, lay in enumerate(rows) if lay is not None}
        self.host = HostAreas(segments, headers)
        self.rank, self.lands = rank, lands
        self.staged = self.host.area(rank).clone()
        self.on_fence: list[Any] = []  # called at every fence (what the tests record)

    def area(self, q: int) -> torch.Tensor:
        return self.staged if q == self.rank else self.host.area(q)

    def fence(self) -> None:
        for hook in self.on_fence:
            hook()
        if self.lands:
            self.host.area(self.rank).copy_(self.staged)


def emulate_device(lands: bool = True) -> None:
    """Make PublishedRows keep its rows in `StagedAreas`, as on CUDA workers (in a rank)."""
    published.rows_on_host = lambda device: False
    published.device_areas = lambda layouts, device: StagedAreas(layouts, dist.get_rank(), lands)


def writer_and_slow_reader(rank: int, world: int, lands: bool) -> list[Any]:
    """Rank 0 publishes exchange k as rows full of k; rank 1 reads each in two halves with a
    pause between them. Every fence records the worker's counters as they were then."""
    emulate_device(lands)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = PublishedRows([layout(2), layout(2)], rank, torch.float64, timeout_s=30)
    assert isinstance(rows.areas, StagedAreas)
    assert rows.layouts[rank] is not None and not rows.layouts[rank].host_rows  # type: ignore[union-attr]
    assert rows.segments[rank].numel() == rows.layouts[rank].header * 8  # type: ignore[union-attr]
    at_fence: list[tuple[int, int]] = []  # (seq of the writer's stream, the reader's ack)

    def record() -> None:
        counters = (rows._seq(0, FORWARD), rows._ack(1, FORWARD, 0))
        at_fence.append((int(counters[0]), int(counters[1])))

    rows.areas.on_fence.append(record)
    seen: list[Any] = []
    for _ in range(EXCHANGES):
        if rank == 0:
            k, copy = rows.begin_write(FORWARD, readers=[1])
            rows.forward_rows(0, copy, WIDTH).fill_(float(k))
            rows.end_write(FORWARD, k)
            seq = at_fence[-1][0]  # this worker's seq when end_write fenced
            seen.append(("fenced before seq", k, seq == k - 1))
            continue
        k, copy = rows.begin_read(FORWARD, writer=0)
        buf = rows.forward_rows(0, copy, WIDTH)
        first = buf[: ROWS // 2].clone()
        time.sleep(0.01)
        second = buf[ROWS // 2 :].clone()
        rows.end_read(FORWARD, 0, k)
        ack = at_fence[-1][1]  # this worker's ack of rank 0's stream when end_read fenced
        seen.append(("fenced before ack", k, ack == k - 1))
        seen.append((k, sorted({*first.flatten().tolist(), *second.flatten().tolist()})))
    dist.barrier()
    return seen


def test_staged_rows_are_read_whole_and_fenced_before_seq_and_ack() -> None:
    writer, reader = spawn_ranks(writer_and_slow_reader, 2, True)
    assert not isinstance(writer, Exception), writer
    assert not isinstance(reader, Exception), reader
    order = [s for s in writer + reader if isinstance(s[0], str)]
    assert len(order) == 2 * EXCHANGES and all(ok for _, _, ok in order), order
    reads = [s for s in reader if not isinstance(s[0], str)]
    assert len(reads) == EXCHANGES and torn(reads) == []


def test_writes_that_never_land_are_seen_stale() -> None:
    """The emulation's teeth: a fence that does nothing (rows that stay in the stream) leaves
    readers the old rows."""
    reader = spawn_ranks(writer_and_slow_reader, 2, False)[1]
    assert not isinstance(reader, Exception), reader
    assert torn([s for s in reader if not isinstance(s[0], str)])


def three_layers_on_device(rank: int, world: int, *args: Any) -> Any:
    emulate_device()
    return three_layers(rank, world, *args)


@pytest.mark.parametrize(("every", "whole"), [(1, False), (2, True)])
def test_in_place_aggregation_with_device_rows_equals_the_reference(
    every: int, whole: bool
) -> None:
    """The three-layer forward and backward of tests/comm/test_inplace.py with the row copies
    apart from the counters and staged until the fence, as on CUDA workers."""
    check_three_layers(three_layers_on_device, every, whole)


class FakeSymmetricMemory:
    """`torch.distributed._symmetric_memory` as far as PeerDeviceAreas uses it, on the CPU:
    a member's buffer is full of its group rank; `fail` makes one call raise."""

    def __init__(self, group_rank: int, fail: str = "", remote: bool = True) -> None:
        self.group_rank, self.fail, self.remote = group_rank, fail, remote
        self.sizes: list[int] = []  # what every call of `empty` asked for

    def empty(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        self.sizes.append(size)
        if self.fail == "empty":
            raise RuntimeError("out of memory\nmore")
        return torch.full((size,), self.group_rank, dtype=dtype)

    def enable_symm_mem_for_group(self, name: str) -> None:
        pass

    def rendezvous(self, buffer: torch.Tensor, group: Any) -> Any:
        if self.fail == "rendezvous":
            raise RuntimeError("peer access is not supported between these GPUs")
        members = dist.get_process_group_ranks(group)
        me = members.index(dist.get_rank())

        class Handle:  # torch 2.13's calls
            rank = me

            def get_remote_tensor(self, peer: int, sizes: Any, dtype: Any) -> torch.Tensor:
                return (
                    buffer[: sizes[0]]
                    if peer == me
                    else torch.full(tuple(sizes), peer, dtype=dtype)
                )

        class OlderHandle:  # get_buffer only; `offset` misplaces this worker's own view
            rank, offset = me, 1 if self.fail == "offset" else 0

            def get_buffer(self, peer: int, sizes: Any, dtype: Any, at: int) -> torch.Tensor:
                if peer == me:
                    return buffer[self.offset : self.offset + sizes[0]]
                return torch.full(tuple(sizes), peer, dtype=dtype)

        return Handle() if self.remote else OlderHandle()


def map_two_hosts(rank: int, world: int, failing: int, fail: str, remote: bool = True) -> Any:
    """Ranks 0, 2 on one host and 1, 3 on another (not contiguous, so group ranks differ
    from global ones); rank `failing` fails at `fail`; `remote`: torch 2.13's handle, else
    one with get_buffer alone."""
    import sys

    dist.init_process_group("gloo", rank=rank, world_size=world)
    members = [0, 2] if rank % 2 == 0 else [1, 3]
    fake = FakeSymmetricMemory(members.index(rank), fail if rank == failing else "", remote)
    sys.modules["torch.distributed._symmetric_memory"] = fake  # type: ignore[assignment]
    torch.distributed._symmetric_memory = fake  # type: ignore[attr-defined]
    sizes = {q: 100 * (q + 1) for q in members}  # unequal areas: the largest is allocated
    try:
        areas = PeerDeviceAreas(sizes, torch.device("cpu"))
    except TrainError as exc:
        return str(exc)
    return fake.sizes, {q: (areas.area(q).numel(), int(areas.area(q)[0])) for q in members}


@pytest.mark.parametrize("remote", [True, False])
def test_each_host_maps_its_members_by_group_rank_at_one_size(remote: bool) -> None:
    outs = spawn_ranks(map_two_hosts, 4, -1, "", remote)
    assert outs[0] == ([300], {0: (100, 0), 2: (300, 1)})
    assert outs[2] == ([300], {0: (100, 0), 2: (300, 1)})
    assert outs[1] == ([400], {1: (200, 0), 3: (400, 1)})
    assert outs[3] == ([400], {1: (200, 0), 3: (400, 1)})


@pytest.mark.parametrize("fail", ["empty", "rendezvous", "offset"])
def test_a_rank_that_cannot_map_stops_every_rank_with_its_reason(fail: str) -> None:
    outs = spawn_ranks(map_two_hosts, 4, 3, fail, fail != "offset")
    reason = {
        "empty": "out of memory",
        "rendezvous": "peer access is not supported",
        "offset": "placed this worker's rows at an offset",
    }[fail]
    for out in outs:
        assert isinstance(out, str) and out.startswith("workers [3] cannot map"), out
        assert reason in out and "pipeline.transport=process-group" in out
