"""One interface for a layer's aggregation, one implementation per `pipeline.mode`.

An aggregator owns both the communication and the SpMM of a layer, so that a mode can
overlap them (DESIGN.md §2.2). Every mode computes exactly `A·[h | halo(h)]`, the numbers the
single-process run gives, except `compute-only`, which skips the exchange on purpose.
Legend: N inner rows, H halo rows, E local edges, F in-width, O out-width.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.exchange import CommStats, HaloPlan, exchange_halo

# Modes whose numbers equal single-process training (compute-only is for benchmarks only).
EXACT_MODES = ("leo", "blocking", "fine-grained", "shared-memory")
MODES = (*EXACT_MODES, "compute-only")


class Aggregator(Protocol):
    """`A·[h | halo(h)]` for the rows of one worker, with gradients flowing back to owners."""

    stats: CommStats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        """Σ_j a_ij h_j over in-edges, halo rows included; h is this worker's inner rows."""
        ...

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """(A·[h | halo(h)], h) with h = x·Wᵀ (update-first layers)."""
        ...


class _Base:
    """Update-first as 'transform, then aggregate'; modes that overlap the two override it."""

    stats: CommStats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        raise NotImplementedError

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        h_NO = F.linear(x_NF, weight_OF)
        return self.aggregate(h_NO, layer), h_NO


class LocalAggregator(_Base):
    """A single worker owns every node: no halo, one SpMM."""

    def __init__(self, adj: kernels.CSR) -> None:
        assert adj.num_cols == adj.num_rows, "a single-worker graph has no halo columns"
        self.adj, self.stats = adj, CommStats()

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return kernels.spmm(self.adj, h_NF)


class BlockingAggregator(_Base):
    """Exchange the whole halo, wait, then one SpMM (DGL/PyG-style; the exact reference).

    With an edge-level plan and CSR (`fine_grained_view`) the same code is MGG's scheme:
    every remote edge brings its own row, so bytes follow remote edges, not halo rows.
    """

    def __init__(self, adj: kernels.CSR, plan: HaloPlan) -> None:
        self.adj, self.plan, self.stats = adj, plan, plan.stats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return kernels.spmm(self.adj, exchange_halo(h_NF, self.plan))


class ComputeOnlyAggregator(_Base):
    """The halo is never exchanged (zeros instead): the time perfect overlap would reach.

    Numbers are wrong on purpose; `leo bench` uses it as the floor of the other modes.
    """

    def __init__(self, adj: kernels.CSR, plan: HaloPlan) -> None:
        self.adj, self.num_halo, self.stats = adj, plan.num_halo, plan.stats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        halo_HF = h_NF.new_zeros((self.num_halo, h_NF.shape[1]))
        return kernels.spmm(self.adj, torch.cat([h_NF, halo_HF]))


def _exchange_counts(counts: list[int], device: torch.device) -> list[int]:
    """What every peer tells this worker: out[q] = counts[me] as peer q computed it."""
    send = torch.tensor(counts, dtype=torch.int64, device=device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return [int(c) for c in recv.tolist()]


def fine_grained_view(adj: kernels.CSR, plan: HaloPlan) -> tuple[kernels.CSR, HaloPlan]:
    """MGG's scheme as data: one halo column (and one transferred row) per remote edge.

    Remote edges are grouped by owner (CSR order within an owner); each becomes its own
    column. Owners learn, once, which of their rows each remote edge reads (an all-to-all of
    positions in the reader's halo block), so every later exchange is a plain all-to-all.
    """
    n, device = plan.num_inner, adj.device
    cols_E = adj.indices.long()
    remote_E = torch.nonzero(cols_E >= n).squeeze(1)
    halo_col = cols_E[remote_E] - n
    recv_offsets = torch.tensor(plan.recv_offsets(), device=device)
    owner = torch.searchsorted(recv_offsets[1:], halo_col, right=True)
    order = torch.sort(owner, stable=True).indices
    new_cols = cols_E.clone()
    new_cols[remote_E[order]] = n + torch.arange(order.shape[0], device=device)
    edge_adj = kernels.CSR.from_arrays(
        adj.indptr, new_cols, adj.values, num_cols=n + int(order.shape[0])
    )
    recv_counts = torch.bincount(owner, minlength=len(plan.recv_counts)).tolist()
    # Position of each requested row inside this worker's halo block of its owner.
    wanted = (halo_col - recv_offsets[owner])[order]
    send_counts = _exchange_counts(recv_counts, device)
    positions = wanted.new_empty(sum(send_counts))
    dist.all_to_all_single(positions, wanted, send_counts, recv_counts)
    # An owner's rows for reader r are send_idx[block r]; map positions through that block.
    send_offsets = torch.tensor(plan.send_offsets(), device=device)
    reader = torch.repeat_interleave(
        torch.arange(len(send_counts), device=device), torch.tensor(send_counts, device=device)
    )
    send_idx = plan.send_idx_S[send_offsets[reader] + positions]
    edge_plan = HaloPlan(n, send_idx, send_counts, recv_counts, plan.stats)
    return edge_adj, edge_plan
