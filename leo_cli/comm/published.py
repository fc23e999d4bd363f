"""Published rows: the rows a worker's same-host peers read in place, with no global barrier.

Every worker of a host owns one segment: int64 counters per stream (`seq`, the last exchange
it published; `ack`, the last exchange of each peer it finished reading) and `NUM_COPIES`
copies of its forward and backward rows. Writers wait for their readers' acks, readers for the
writer's `seq`, so no worker waits for any but the peers it reads from. Where the row copies
live: comm/row_areas.py.

Specification: docs/design/published-rows.md.
Legend: B rows this worker publishes, R_q rows it reads from owner q, W the widest width.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli.comm.row_areas import (
    HostAreas,
    PeerDeviceAreas,
    RowAreas,
    first_line,
    stop_together,
)
from leo_cli.comm.segments import create_segment
from leo_cli.errors import TrainError

NUM_COPIES = 1  # copies of every row area; a writer may run this many exchanges minus 1 ahead
FORWARD, BACKWARD = 0, 1


@dataclass(frozen=True)
class Layout:
    """Sizes of one worker's segment, the same arithmetic on every worker."""

    num_streams: int
    world_size: int
    published_rows: int  # B
    read_rows: list[int]  # R_q per owner q
    width: int  # W
    elem_size: int
    copies: int = NUM_COPIES
    host_rows: bool = True  # row copies in the host segment (CPU); else in device memory
    # Exchanges a writer may run ahead of its slowest reader: `copies` (None) is safe; more
    # only in tests (to show the race it lets through).
    lead: int | None = None

    @property
    def ahead(self) -> int:
        return self.copies if self.lead is None else self.lead

    @property
    def header(self) -> int:
        """Elements of int64 counters, padded to a whole number of 64-byte lines."""
        count = self.num_streams * (1 + self.world_size)
        return -(-count // 8) * 8

    def rows_bytes(self, rows: int) -> int:
        return self.copies * rows * self.width * self.elem_size

    @property
    def area_bytes(self) -> int:
        """Bytes of the row copies."""
        return self.rows_bytes(self.published_rows + sum(self.read_rows))

    @property
    def num_bytes(self) -> int:
        """Bytes of the host segment: the counters, and the row copies when on the host."""
        return self.header * 8 + (self.area_bytes if self.host_rows else 0)


class PublishedRows:
    """This worker's segment and the mapped segments of the same-host peers it reads."""

    def __init__(
        self,
        layouts: list[Layout | None],
        rank: int,
        dtype: torch.dtype,
        timeout_s: float,
        wait_hook: Callable[[], None] | None = None,
        device: torch.device | None = None,
    ) -> None:
        """Create this worker's segment, map every peer's (collective: every worker calls it).

        Args:
            layouts: every rank's layout; None for ranks on another host (never mapped).
            rank: this worker.
            dtype: of the rows.
            timeout_s: how long a wait may take before the job stops with a sentence.
            wait_hook: called at every poll of a wait (tests slow a reader down with it).
            device: where the rows are computed (CPU by default): row copies in the
                segments for CPU workers, in device memory that peers map otherwise
                (`rows_on_host`, `device_areas`).
        """
        device = device or torch.device("cpu")
        on_host = rows_on_host(device)
        layouts = [None if lay is None else replace(lay, host_rows=on_host) for lay in layouts]
        self.rank, self.dtype, self.timeout_s = rank, dtype, timeout_s
        self.layouts, self.wait_hook = layouts, wait_hook
        mine = layouts[rank]
        assert mine is not None, "a worker publishing rows is on its own host"
        self.segments = _map_host_segments(layouts, rank)
        headers = {q: _header_of(layouts[q]) * 8 for q in self.segments}
        self.counters = {q: seg[: headers[q]].view(torch.int64) for q, seg in self.segments.items()}
        self.areas = HostAreas(self.segments, headers) if on_host else device_areas(layouts, device)
        self.exchanges: dict[tuple[int, int], int] = {}  # (stream, writer) -> count so far

    # -- offsets ----------------------------------------------------------------------------

    def _seq(self, q: int, stream: int) -> Tensor:
        return self.counters[q][stream : stream + 1]

    def _ack(self, reader: int, stream: int, writer: int) -> Tensor:
        lay = self.layouts[reader]
        assert lay is not None
        i = lay.num_streams + stream * lay.world_size + writer
        return self.counters[reader][i : i + 1]

    def _rows(self, q: int, copy: int, first: int, count: int, width: int) -> Tensor:
        """Rows [first, first + count) of copy `copy` of q's row area, at `width`: contiguous
        from the region's start, which is placed at the widest width (`lay.width`), so regions
        stay disjoint whatever widths the layers give each of them."""
        lay = self.layouts[q]
        assert lay is not None
        assert width <= lay.width, f"rows of width {width} exceed the segment's {lay.width}"
        total = lay.published_rows + sum(lay.read_rows)
        start = (copy * total + first) * lay.width * lay.elem_size
        end = start + count * width * lay.elem_size
        return self.areas.area(q)[start:end].view(self.dtype).view(count, width)

    def forward_rows(self, q: int, copy: int, width: int) -> Tensor:
        """Owner q's published forward rows (B_q x width) in copy `copy`."""
        lay = self.layouts[q]
        assert lay is not None
        return self._rows(q, copy, 0, lay.published_rows, width)

    def backward_rows(self, reader: int, owner: int, copy: int, width: int) -> Tensor:
        """The gradients `reader` publishes for the rows it read from `owner` (R x width)."""
        lay = self.layouts[reader]
        assert lay is not None
        first = lay.published_rows + sum(lay.read_rows[:owner])
        return self._rows(reader, copy, first, lay.read_rows[owner], width)

    # -- the protocol ---------------------------------------------------------------------

    def next_exchange(self, stream: int, writer: int) -> int:
        """Count exchange of (stream, writer) as begun here; its number (1, 2, ...)."""
        key = (stream, writer)
        self.exchanges[key] = self.exchanges.get(key, 0) + 1
        return self.exchanges[key]

    def begin_write(self, stream: int, readers: list[int]) -> tuple[int, int]:
        """Wait until every reader is done with the copy exchange k will overwrite; (k, copy)."""
        k = self.next_exchange(stream, self.rank)
        mine = self.layouts[self.rank]
        assert mine is not None
        for r in readers:
            self._wait_count(self._ack(r, stream, self.rank), k - mine.ahead,
                             f"rank {r} to finish reading", stream)  # fmt: skip
        return k, k % self._copies(self.rank)

    def end_write(self, stream: int, k: int) -> None:
        """Exchange k of this worker's stream is written: readers may read it."""
        self.areas.fence()  # the rows are in memory before a reader is told so
        self._seq(self.rank, stream).fill_(k)

    def published(self, stream: int, writer: int) -> bool:
        """Whether `writer` has already published the exchange this worker reads next from it
        (no wait, nothing counted: `begin_read` still follows)."""
        return int(self._seq(writer, stream)) > self.exchanges.get((stream, writer), 0)

    def begin_read(self, stream: int, writer: int, wait: bool = True) -> tuple[int, int]:
        """Wait until `writer` has published exchange k of its stream; (k, copy)."""
        k = self.next_exchange(stream, writer)
        if wait:
            self._wait_count(self._seq(writer, stream), k,
                             f"rank {writer} to publish its rows", stream)  # fmt: skip
        return k, k % self._copies(writer)

    def _copies(self, q: int) -> int:
        lay = self.layouts[q]
        assert lay is not None
        return lay.copies

    def end_read(self, stream: int, writer: int, k: int) -> None:
        """This worker is done with exchange k of `writer`'s stream."""
        self.areas.fence()  # whatever reads the copy has finished before the writer may reuse it
        self._ack(self.rank, stream, writer).fill_(k)

    def _wait_count(self, counter: Tensor, at_least: int, what: str, stream: int) -> None:
        """Poll a counter of a mapped header until it reaches `at_least`."""
        deadline = time.monotonic() + self.timeout_s
        pause = 1e-6
        while int(counter) < at_least:
            if self.wait_hook is not None:
                self.wait_hook()
            if time.monotonic() > deadline:
                raise TrainError(
                    f"rank {self.rank} waited {self.timeout_s:g} s for {what} (stream "
                    f"{stream}); a peer stopped or is stalled (launch.timeout_s)."
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


def rows_on_host(device: torch.device) -> bool:
    """Whether the row copies live in the host segments (CPU workers) or in device memory."""
    return device.type == "cpu"


def device_areas(layouts: list[Layout | None], device: torch.device) -> RowAreas:
    """Row copies outside the host segments: GPU memory the host's peers map (collective)."""
    if device.type != "cuda":
        raise TrainError(f"published rows in device memory need a CUDA device, not {device}.")
    sizes = {q: lay.area_bytes for q, lay in enumerate(layouts) if lay is not None}
    return PeerDeviceAreas(sizes, device)


def _header_of(layout: Layout | None) -> int:
    assert layout is not None, "only same-host segments are mapped"
    return layout.header


def _map_host_segments(layouts: list[Layout | None], rank: int) -> dict[int, Tensor]:
    """Create this worker's segment, learn every same-host peer's name, map them all, and
    unlink the files once every worker has mapped them (collective)."""
    mine = layouts[rank]
    assert mine is not None
    name = create_segment(mine.num_bytes)
    segments: dict[int, Tensor] = {}
    try:
        names: list[Any] = [None] * len(layouts)
        dist.all_gather_object(names, name)
        failed = [q for q, n in enumerate(names) if isinstance(n, str) and n.startswith("!")]
        if failed:
            raise TrainError(
                f"workers {failed} cannot reserve their published rows in /dev/shm "
                f"({names[failed[0]][1:]}); free space there or use pipeline.transport="
                "process-group."
            )
        problem = ""
        for q, lay in enumerate(layouts):
            if lay is not None:
                try:
                    size = lay.num_bytes
                    segments[q] = torch.from_file(
                        str(names[q]), shared=True, size=size, dtype=torch.uint8
                    )
                except RuntimeError as exc:  # e.g. a peer of the same host name elsewhere
                    problem = problem or f"{names[q]}: {first_line(exc)}"
        stop_together(problem, "their peers' published rows")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
    return segments
