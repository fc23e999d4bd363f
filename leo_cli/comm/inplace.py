"""L3 rows read in place: halo rows a worker reads straight out of their owner's published rows
inside its aggregation, and whose gradients it publishes for the owner to add up.

Only same-host pairs can map each other's segments (comm/published.py); an L3 row owned on
another host is fetched per reading edge through the process group instead (comm/views.py).
A reader's rows of one owner are a column block of its CSR that reads them by position, with
no copy; waiting for a late owner comes after the inner block's SpMM.

Specification: docs/design/published-rows.md.
Legend: N inner rows, B_q owner q's boundary rows, R_q rows read from q, E edges, F width.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock, segments, selected_columns_block
from leo_cli.comm.exchange import CommStats, HaloPlan, distinct_rows
from leo_cli.comm.published import BACKWARD, FORWARD, Layout, PublishedRows
from leo_cli.comm.views import halo_owner
from leo_cli.kernels.csr import compact_index_dtype, max_degree


@dataclass(frozen=True)
class OwnerRows:
    """The rows this worker reads in place from one owner."""

    owner: int
    block: ColumnBlock  # compact: rows reading them, columns 0..R_q-1 (backward)
    positions_C: Tensor  # (R_q) each column's position among the owner's published rows
    in_place: kernels.CSR  # (N x B_q) the same edges, columns indexing the published rows

    @property
    def num_rows(self) -> int:
        return int(self.positions_C.shape[0])


@dataclass
class InPlace:
    """One worker's L3 rows read in place, and the rows of its own that peers read so."""

    rows: PublishedRows
    rank: int
    boundary_B: Tensor  # this worker's published rows (local ids, sorted)
    reads: list[OwnerRows]  # owners this worker reads from
    read_by: dict[int, Tensor]  # reader -> this worker's local rows it reads (its order)
    stats: CommStats

    def stream(self, layer: int, direction: int) -> int:
        """One stream per direction, not per layer: every worker publishes and reads the
        layers in the same order (forward 0, 1, ...; backward ..., 1, 0), so exchanges line
        up, and one pair of copies serves every layer (a copy per layer would multiply the
        memory by the depth)."""
        del layer
        return direction

    # -- forward --------------------------------------------------------------------------

    def publish(self, rows_BF: Tensor, layer: int) -> None:
        """Make this worker's boundary rows of a layer readable by its in-place readers."""
        if not self.read_by:
            return
        s = self.stream(layer, FORWARD)
        with self.stats.waiting(rows_BF.device):  # until readers are done with this copy
            k, copy = self.rows.begin_write(s, readers=list(self.read_by))
        self.rows.forward_rows(self.rank, copy, rows_BF.shape[1]).copy_(rows_BF)
        self.rows.end_write(s, k)

    def aggregate(self, inner: ColumnBlock, h_NF: Tensor, layer: int) -> Tensor:
        """The inner block's sums plus every owner's rows read in place (waiting for each
        owner's rows of this layer).

        Where the first owner has not published yet, the inner block is summed first, so that
        local work hides the wait; else the op sums both at once. The sums are the same either
        way: the op's reference (CPU workers) is the local SpMM plus the remote one, in the
        training dtype (float32 or float64); on CUDA workers its kernel reads the peer GPU's
        rows through their symmetric-memory mapping (comm/row_areas.py)."""
        if not self.reads:
            return inner.forward(h_NF)
        s, width = self.stream(layer, FORWARD), h_NF.shape[1]
        out_NF: Tensor | None = None
        if not self.rows.published(s, self.reads[0].owner):
            out_NF = inner.forward(h_NF)
        for part in self.reads:
            with self.stats.waiting(h_NF.device):  # counted in comm_wait_s, like a transfer
                k, copy = self.rows.begin_read(s, part.owner)
            published = self.rows.forward_rows(part.owner, copy, width)
            if out_NF is None:  # the local rows and the first owner's, in one op
                out_NF = kernels.fused_aggregate(inner.fwd, h_NF, part.in_place, published)
            else:
                out_NF += kernels.spmm(part.in_place, published)
            self.rows.end_read(s, part.owner, k)
            self.stats.published_bytes += part.in_place.num_edges * width * h_NF.element_size()
        assert out_NF is not None
        return out_NF

    # -- backward -------------------------------------------------------------------------

    def publish_grads(self, grad_NF: Tensor, layer: int) -> None:
        """The gradients of the rows read in place, for their owners to add."""
        if not self.reads:
            return
        s, width = self.stream(layer, BACKWARD), grad_NF.shape[1]
        with self.stats.waiting(grad_NF.device):
            k, copy = self.rows.begin_write(s, readers=[p.owner for p in self.reads])
        for part in self.reads:
            region = self.rows.backward_rows(self.rank, part.owner, copy, width)
            region.copy_(part.block.backward(grad_NF))
            self.stats.published_bytes += region.numel() * region.element_size()
        self.rows.end_write(s, k)

    def add_returned(self, grad_NF: Tensor, layer: int) -> None:
        """grad += what every in-place reader computed for this worker's rows."""
        s = self.stream(layer, BACKWARD)
        for reader, rows_R in self.read_by.items():
            with self.stats.waiting(grad_NF.device):
                k, copy = self.rows.begin_read(s, reader)
            region = self.rows.backward_rows(reader, self.rank, copy, grad_NF.shape[1])
            grad_NF.index_add_(0, rows_R, region)
            self.rows.end_read(s, reader, k)


def same_host_ranks(world_size: int) -> list[bool]:
    """Which ranks run on this worker's host (collective): torchrun's node (`GROUP_RANK`, the
    grouping the plan assumes: rank // workers per node), else the host name."""
    hosts: list[Any] = [None] * world_size
    node = os.environ.get("GROUP_RANK")
    dist.all_gather_object(hosts, f"node {node}" if node is not None else socket.gethostname())
    mine = hosts[dist.get_rank()]
    return [h == mine for h in hosts]


def build_in_place(
    adj: kernels.CSR,
    plan: HaloPlan,
    rows_H: Tensor,
    halo_local_H: Tensor,
    setting: tuple[int, torch.dtype, float],
    stats: CommStats,
) -> InPlace:
    """Set up the in-place reads of the halo positions `rows_H` (sorted; owners on this host).

    Collective: every worker calls it, with its own rows (possibly none).

    Args:
        adj: the part's CSR (inner rows, `[inner | halo]` columns).
        plan: its halo plan.
        rows_H: halo positions read in place.
        halo_local_H: owner-local row of every halo position.
        setting: (widest width, dtype, timeout in seconds); every layer shares the
            segments (see `InPlace.stream`).
        stats: where in-place bytes are counted.
    """
    width, dtype, timeout_s = setting
    world, rank = dist.get_world_size(), dist.get_rank()
    device = adj.indptr.device  # index tensors follow the part's CSR (CPU or its GPU)
    rows_H, halo_local_H = rows_H.to(device), halo_local_H.to(device)
    boundary_B = distinct_rows(plan.send_idx_S, plan.num_inner)
    boundaries: list[Any] = [None] * world
    dist.all_gather_object(boundaries, boundary_B.cpu().numpy())  # arrays pickle as bytes
    owner_R = halo_owner(plan, rows_H)
    owners = torch.unique(owner_R).tolist()
    wanted = {q: halo_local_H[rows_H[owner_R == q]].cpu().numpy() for q in owners}
    asked: list[Any] = [None] * world
    dist.all_gather_object(asked, wanted)
    hosts = same_host_ranks(world)
    layouts: list[Layout | None] = [
        Layout(
            2, world, len(boundaries[q]),
            [len(asked[q].get(owner, [])) for owner in range(world)],
            width, torch.empty(0, dtype=dtype).element_size(),
        ) if hosts[q] else None
        for q in range(world)
    ]  # fmt: skip
    published = PublishedRows(layouts, rank, dtype, timeout_s, device=device)
    reads = [
        owner_rows(
            adj,
            plan,
            rows_H[owner_R == q],
            q,
            torch.from_numpy(boundaries[q]).to(device=device, dtype=torch.int64),
            halo_local_H,
        )  # fmt: skip
        for q in sorted(wanted)
    ]
    read_by = {
        r: torch.from_numpy(asked[r][rank]).to(device=device, dtype=torch.int64)
        for r in range(world)
        if len(asked[r].get(rank, ())) > 0
    }
    return InPlace(published, rank, boundary_B, reads, read_by, stats)


def owner_rows(
    adj: kernels.CSR,
    plan: HaloPlan,
    rows_C: Tensor,
    owner: int,
    boundary_B: Tensor,
    halo_local_H: Tensor,
) -> OwnerRows:
    """The column block of the rows read from one owner, and its in-place twin."""
    n = plan.num_inner
    block = selected_columns_block(adj, rows_C + n)
    positions_C = torch.searchsorted(boundary_B, halo_local_H[rows_C])
    assert bool((boundary_B[positions_C] == halo_local_H[rows_C]).all()), "L3 rows are boundary"
    in_place = reading_in_place(block, positions_C, adj.num_rows, int(boundary_B.shape[0]))
    return OwnerRows(owner, block, positions_C, in_place)


def reading_in_place(
    block: ColumnBlock, positions_C: Tensor, num_rows: int, num_cols: int
) -> kernels.CSR:
    """The block's edges over every row, reading column c at `positions_C[c]` (the owner's
    published rows, `num_cols` of them): forward only (published rows take no gradient
    through it; the block's own transpose serves the backward), its transpose rows taken
    from the block's, so no edge is sorted."""
    assert block.rows_R is not None and block.bwd is not None
    rows_R = block.rows_R.long()
    counts_N = torch.zeros(num_rows, dtype=torch.int64, device=rows_R.device)
    counts_N[rows_R] = torch.diff(block.fwd.indptr).long()
    indptr = torch.cat([counts_N.new_zeros(1), torch.cumsum(counts_N, 0)])
    indices = positions_C.long().index_select(0, block.fwd.indices)  # to `fit` below
    by_position = torch.argsort(positions_C)  # the transpose's rows in published order
    at_E, _ = segments(block.bwd.indptr, by_position)
    t_counts = torch.zeros(num_cols, dtype=torch.int64, device=rows_R.device)
    t_counts[positions_C] = torch.diff(block.bwd.indptr).long()
    t_indptr = torch.cat([t_counts.new_zeros(1), torch.cumsum(t_counts, 0)])
    t_indices = rows_R.index_select(0, block.bwd.indices.index_select(0, at_E).long())
    fit = compact_index_dtype(indptr, indices, num_cols)
    return kernels.CSR(
        indptr.to(fit), indices.to(fit), block.fwd.values, num_rows, num_cols,
        t_indptr.to(fit), t_indices.to(fit), indices.new_empty(0).to(fit),
        max_degree(indptr), max_degree(t_indptr),
    )  # fmt: skip
