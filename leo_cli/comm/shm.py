"""The unified-memory baseline (`pipeline.mode=shared-memory`; LEO-UVM / MGG-UVM in the paper).

All embeddings of one host live in one shared segment (a file in /dev/shm that every worker
maps). Per layer each worker writes its rows, all pass a barrier, then each reads its halo
rows directly from their owners' regions (on the CPU the SpMM itself reads the segment; on a
GPU the halo rows are staged through host memory, as unified memory would page them).
Backward mirrors it: each reader writes the gradients of its halo rows into its own region,
a barrier, then every owner sums what its readers wrote for its rows.

Buffers alternate between two copies, so one barrier per exchange suffices: a worker writes
exchange k only after passing barrier k-1, which every peer reaches after finishing its reads
of exchange k-2 (the same copy).
Attention layers (`gather`) read their halo rows out of the segment the same way and compute
on `[h | halo]`; their halo gradients go back through the gradient segment.
Legend: N inner rows, H halo rows, T rows of all workers of the host, F width, S rows sent.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import AggregatorBase
from leo_cli.comm.dist import all_gather_
from leo_cli.comm.exchange import HaloPlan, offsets
from leo_cli.comm.segments import segment_name
from leo_cli.errors import TrainError

SHM_DIR = "/dev/shm"


def open_segment(num_elements: int, dtype: torch.dtype) -> Tensor:
    """A flat tensor mapped from one /dev/shm file by every worker (rank 0 creates it).

    The space is reserved up front (a full /dev/shm then fails here with a sentence, instead
    of killing a worker with SIGBUS on first write), and the file is unlinked once everyone
    has mapped it. A worker killed before that leaves the file: its name says whose it is,
    and the launcher and later runs remove it (comm/segments.py).
    """
    num_bytes = max(num_elements, 1) * torch.empty(0, dtype=dtype).element_size()
    names: list[Any] = [None]
    if dist.get_rank() == 0:
        names[0] = _create(num_bytes)
    dist.broadcast_object_list(names, src=0)
    if names[0].startswith("!"):
        raise TrainError(
            f"cannot reserve {num_bytes / 2**20:.0f} MiB in {SHM_DIR} ({names[0][1:]}); free "
            "space there (or enlarge it) or use pipeline.mode=leo."
        )
    try:
        segment = torch.from_file(names[0], shared=True, size=max(num_elements, 1), dtype=dtype)
        dist.barrier()
    finally:
        if dist.get_rank() == 0:
            with contextlib.suppress(OSError):
                os.unlink(names[0])
    return segment


def _create(num_bytes: int) -> str:
    """A new file of num_bytes reserved bytes in /dev/shm; "!reason" when that fails."""
    name = str(segment_name())  # says whose it is (comm/segments.py)
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, num_bytes)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(name)
        return f"!{exc.strerror or exc}"
    return name


class SharedMemoryAggregator(AggregatorBase):
    """Shared segment + barrier: no copies through the process group at all."""

    def __init__(self, adj: kernels.CSR, plan: HaloPlan, halo_local_H: Tensor, width: int) -> None:
        """Args:
        adj: the local CSR (inner rows, `[inner | halo]` columns).
        plan: the halo plan (send lists per peer, receive counts per peer).
        halo_local_H: owner-local row of every halo node.
        width: the widest row any layer exchanges (sizes the segment).
        """
        self.adj, self.plan, self.stats = adj, plan, plan.stats
        self.device, self.width, self.rank = adj.device, width, dist.get_rank()
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
            ]
        ).long()
        self.seg_adj = self._segment_csr() if self.device.type == "cpu" else None
        self.adj_t = adj.transpose()
        dtype = adj.values.dtype
        self.fwd_seg = open_segment(2 * self.rows_T * width, dtype)
        self.grad_seg = open_segment(2 * self.halo_T * width, dtype)
        self._fwd_count = self._grad_count = 0

    def _segment_csr(self) -> kernels.CSR:
        """The local CSR with columns renumbered to segment rows (read in place)."""
        col_map = torch.cat(
            [self.my_inner_off + torch.arange(self.plan.num_inner), self.halo_rows_H]
        )
        cols = col_map[self.adj.indices.long()]
        return kernels.CSR.from_arrays(self.adj.indptr, cols, self.adj.values, self.rows_T)

    def view(self, segment: Tensor, copy: int, rows: int, width: int) -> Tensor:
        """Copy `copy` (0 or 1) of a segment as a (rows x width) matrix."""
        start = copy * rows * self.width
        return segment[start : start + rows * width].view(rows, width)

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        out: Tensor = _SharedHalo.apply(h_NF, self)  # type: ignore[no-untyped-call]
        return out

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self.adj, self.plan

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        out: Tensor = _SharedGather.apply(h_NF, self)  # type: ignore[no-untyped-call]
        return out

    def barrier(self) -> None:
        with self.stats.waiting(torch.device("cpu")):
            dist.barrier()

    def publish(self, h_NF: Tensor) -> Tensor:
        """Write my rows into the next copy of the segment and wait for everyone's."""
        seg = self.view(self.fwd_seg, self._fwd_count % 2, self.rows_T, h_NF.shape[1])
        self._fwd_count += 1
        seg[self.my_inner_off : self.my_inner_off + h_NF.shape[0]].copy_(h_NF)
        self.barrier()
        self.stats.bytes_sent += self.plan.send_idx_S.numel() * h_NF.shape[1] * h_NF.element_size()
        return seg

    def gather_rows(self, h_NF: Tensor) -> Tensor:
        """`[h | halo]`, the halo rows read out of their owners' regions."""
        t0 = time.perf_counter()
        seg = self.publish(h_NF)
        halo_HF = seg.index_select(0, self.halo_rows_H).to(h_NF.device)
        self.stats.transfer_s += time.perf_counter() - t0
        return torch.cat([h_NF, halo_HF])

    def forward_rows(self, h_NF: Tensor) -> Tensor:
        """Publish my rows, wait for everyone's, aggregate reading the segment."""
        t0 = time.perf_counter()
        seg = self.publish(h_NF)
        if self.seg_adj is not None:
            out = kernels.spmm(self.seg_adj, seg)
        else:
            halo = seg.index_select(0, self.halo_rows_H).to(h_NF.device)
            out = kernels.spmm(self.adj, torch.cat([h_NF, halo]))
        self.stats.transfer_s += time.perf_counter() - t0
        return out

    def backward_rows(self, grad_NF: Tensor) -> Tensor:
        """Gradient of my rows from that of the aggregation."""
        return self.return_grads(kernels.spmm(self.adj_t, grad_NF))

    def return_grads(self, grad_all: Tensor) -> Tensor:
        """Publish my halo gradients, wait, sum what my readers wrote for my rows."""
        t0 = time.perf_counter()
        n, width = self.plan.num_inner, grad_all.shape[1]
        seg = self.view(self.grad_seg, self._grad_count % 2, self.halo_T, width)
        self._grad_count += 1
        seg[self.my_halo_off : self.my_halo_off + self.plan.num_halo].copy_(grad_all[n:])
        self.barrier()
        self.stats.bytes_sent += self.plan.num_halo * width * grad_all.element_size()
        mine = seg.index_select(0, self.grad_rows_S).to(grad_all.device)
        grad_h = grad_all[:n].index_add_(0, self.plan.send_idx_S, mine)
        self.stats.transfer_s += time.perf_counter() - t0
        return grad_h


class _SharedHalo(torch.autograd.Function):
    """h -> A·[h | halo(h)] through the shared segment, gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, h_NF: Tensor, agg: SharedMemoryAggregator) -> Tensor:
        ctx.agg = agg
        return agg.forward_rows(h_NF)

    @staticmethod
    def backward(ctx: Any, grad_NF: Tensor) -> tuple[Tensor, None]:
        return ctx.agg.backward_rows(grad_NF.contiguous()), None


class _SharedGather(torch.autograd.Function):
    """h -> `[h | halo(h)]` read from the shared segment, halo gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, h_NF: Tensor, agg: SharedMemoryAggregator) -> Tensor:
        ctx.agg = agg
        return agg.gather_rows(h_NF)

    @staticmethod
    def backward(ctx: Any, grad_full: Tensor) -> tuple[Tensor, None]:
        return ctx.agg.return_grads(grad_full.clone()), None  # summed into in place
