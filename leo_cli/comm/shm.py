"""The unified-memory baseline (`pipeline.mode=shared-memory`; LEO-UVM / MGG-UVM in the paper).

All embeddings of one host live in one shared /dev/shm segment. Per layer each worker writes
its rows, all pass a barrier, then each reads its halo rows out of their owners' regions and
aggregates them through the same column blocks as every mode (comm/aggregate.py). Backward
moves the output gradient as rows the same way (`Aᵀ·g` is an aggregation on a symmetric
graph); only attention layers write halo gradients into a second segment for their owners.
Each segment holds one copy: a barrier before writing (every peer has read the last
exchange out) and one after.

Specification: docs/design/aggregation.md.
Legend: N inner rows, H halo rows, T rows of all workers of the host, F width, S rows sent.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli.comm.blocks import Chunk, Schedule
from leo_cli.comm.dist import all_gather_
from leo_cli.comm.exchange import CommStats, HaloPlan, offsets
from leo_cli.comm.row_areas import first_line, stop_together
from leo_cli.comm.segments import create_segment
from leo_cli.comm.transport import GradOf, Landed, sent_slices
from leo_cli.errors import TrainError

SHM_DIR = "/dev/shm"
GRAD_COPIES = 1  # copies of the gradients' segment (a barrier before each write)


def open_segment(num_elements: int, dtype: torch.dtype) -> Tensor:
    """A flat tensor mapped from one /dev/shm file by every worker (rank 0 creates it).

    The space is reserved up front (a full /dev/shm then fails here with a sentence, instead
    of killing a worker with SIGBUS on first write), and the file is unlinked once everyone
    has mapped it; a worker that cannot map it stops every worker with its reason. A worker
    killed before that leaves the file: its name says whose it is, and the launcher and later
    runs remove it (comm/segments.py).
    """
    num_bytes = max(num_elements, 1) * torch.empty(0, dtype=dtype).element_size()
    names: list[Any] = [None]
    if dist.get_rank() == 0:
        names[0] = create_segment(num_bytes)
    dist.broadcast_object_list(names, src=0)
    if names[0].startswith("!"):
        raise TrainError(
            f"cannot reserve {num_bytes / 2**20:.0f} MiB in {SHM_DIR} ({names[0][1:]}); free "
            "space there (or enlarge it) or use pipeline.mode=leo."
        )
    try:
        problem = ""
        try:
            segment = torch.from_file(names[0], shared=True, size=max(num_elements, 1), dtype=dtype)
        except RuntimeError as exc:
            problem = f"{names[0]}: {first_line(exc)}"
        # In place of a barrier: a rank that could not map it stops everyone, at once.
        what, fix = f"the shared {SHM_DIR} segment", "check /dev/shm or use pipeline.mode=leo"
        stop_together(problem, what, fix)
    finally:
        if dist.get_rank() == 0:
            with contextlib.suppress(OSError):
                os.unlink(names[0])
    return segment


class SharedMemory:
    """The shared-memory transport: segment + barrier, no copies through the process group."""

    def __init__(
        self,
        plan: HaloPlan,
        stats: CommStats,
        halo_local_H: Tensor,
        width: int,
        dtypes: tuple[torch.dtype, torch.dtype | None],
    ) -> None:
        """Args:
        plan: the halo plan (send lists per peer, receive counts per peer).
        stats: where the bytes moved and the time waited are counted.
        halo_local_H: owner-local row of every halo node.
        width: the widest row any layer exchanges (sizes the segment).
        dtypes: the rows' (they may travel narrower: `pipeline.halo_dtype`) and the halo
            gradients', or None where no halo gradient returns as a partial sum (no
            gradients' segment: the backward moves rows).
        """
        self.plan, self.stats = plan, stats
        self.width, self.rank = width, dist.get_rank()
        mine = torch.tensor([plan.num_inner, plan.num_halo, *plan.recv_offsets()])
        counts = [[int(v) for v in row] for row in all_gather_(mine).tolist()]
        inner_off = offsets([c[0] for c in counts])
        halo_off = offsets([c[1] for c in counts])
        self.rows_T, self.halo_T = inner_off[-1], halo_off[-1]
        self.my_inner_off = inner_off[self.rank]
        self.my_halo_off = halo_off[self.rank]
        owner_H = torch.repeat_interleave(
            torch.arange(len(plan.recv_counts)), torch.tensor(plan.recv_counts)
        )
        inner_start = torch.tensor(inner_off[:-1], dtype=torch.int64)
        # Where each of my halo rows lives in the segment, and where my readers put the
        # gradients of my rows (reader r's block for me starts at its recv offset of me).
        self.halo_rows_H = inner_start[owner_H] + halo_local_H.cpu()
        self.grad_rows_S = torch.cat(
            [
                halo_off[r] + counts[r][2 + self.rank] + torch.arange(plan.send_counts[r])
                for r in range(len(plan.send_counts))
                if dtypes[1] is not None  # no gradients' segment: nothing to read there
            ]
            or [torch.zeros(0, dtype=torch.int64)]
        ).long()
        self.fwd_seg = open_segment(self.rows_T * width, dtypes[0])
        self.grad_seg = (
            None
            if dtypes[1] is None
            else open_segment(GRAD_COPIES * self.halo_T * width, dtypes[1])
        )
        self._grad_count = 0

    def view(self, segment: Tensor, copy: int, rows: int, width: int) -> Tensor:
        """Copy `copy` (0 or 1) of a segment as a (rows x width) matrix (at most the width
        it was reserved at: a wider one would run into the next copy)."""
        assert width <= self.width, f"rows {width} wide in a segment reserved {self.width} wide"
        start = copy * rows * self.width
        return segment[start : start + rows * width].view(rows, width)

    def barrier(self) -> None:
        with self.stats.waiting(torch.device("cpu")):
            dist.barrier()

    def send_rows(self, rows_XF: Tensor, sched: Schedule, by_position: bool) -> ReadOut:
        """Once every peer has read the last exchange out, write my rows into the segment,
        wait for everyone's; my halo is read out chunk by chunk as the aggregation reaches
        it (`ReadOut`)."""
        assert not by_position, "every row is published: the whole update comes first"
        t0 = time.perf_counter()
        width = rows_XF.shape[1]
        seg = self.view(self.fwd_seg, 0, self.rows_T, width)
        self.barrier()  # one copy: nobody still reads the last exchange's rows
        seg[self.my_inner_off : self.my_inner_off + rows_XF.shape[0]].copy_(rows_XF)
        self.barrier()
        self.stats.bytes_sent += self.plan.send_idx_S.numel() * width * rows_XF.element_size()
        self.stats.transfer_s += time.perf_counter() - t0
        return ReadOut(self, seg, sched, rows_XF.device)

    def send_grads(self, sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Landed:
        """Once every peer has read the last exchange out, write my halo gradients into my
        region, wait, read what my readers wrote for me."""
        assert self.grad_seg is not None, "built without a gradients' segment"
        width = like_F.shape[1]
        seg = self.view(self.grad_seg, self._grad_count % GRAD_COPIES, self.halo_T, width)
        self._grad_count += 1
        mine_HF = seg[self.my_halo_off : self.my_halo_off + self.plan.num_halo]
        if GRAD_COPIES == 1:
            self.barrier()  # one copy: nobody still reads the last exchange's gradients
        for chunks in sched.rounds:
            for c in chunks:
                mine_HF[c.recv_start : c.recv_end].copy_(grad_of(c))
        t0 = time.perf_counter()
        self.barrier()
        self.stats.bytes_sent += self.plan.num_halo * width * like_F.element_size()
        back_SF = seg.index_select(0, self.grad_rows_S).to(like_F.device)
        self.stats.transfer_s += time.perf_counter() - t0
        return sent_slices(back_SF, sched)


class ReadOut:
    """Halo rows read out of the segment one chunk at a time, when the aggregation reaches
    the chunk: one chunk's buffer alive at a time, not the whole halo's (1.68M rows of 64
    floats per worker at products scale). Every chunk is read before the worker's next
    exchange, whose first barrier keeps the segment unchanged until then."""

    def __init__(
        self, shm: SharedMemory, seg_TF: Tensor, sched: Schedule, device: torch.device
    ) -> None:
        self.shm, self.seg_TF, self.sched, self.device = shm, seg_TF, sched, device

    def read(self, c: Chunk) -> Tensor:
        t0 = time.perf_counter()
        rows = self.shm.halo_rows_H[c.recv_start : c.recv_end]
        halo = self.seg_TF.index_select(0, rows).to(self.device)
        self.shm.stats.transfer_s += time.perf_counter() - t0
        return halo

    def wait(self, r: int) -> Iterator[Tensor]:
        return (self.read(c) for c in self.sched.rounds[r])

    def finish(self) -> None:
        pass
