"""L3 rows read in place: halo rows a worker reads straight out of their owner's published rows
inside its aggregation; their gradients travel the same way, as rows.

Only same-host pairs can map each other's segments (comm/published.py); an L3 row owned on
another host is fetched per reading edge through the process group instead (comm/views.py).
A reader's rows of one owner are a CSR over its rows whose columns are the owner's published
rows, read by position, with no copy; waiting for a late owner comes after the inner block's
SpMM. The backward reads the output gradient as rows (`Aᵀ·g` is an aggregation on a symmetric
graph, comm/aggregate.py `backward_rows`): owners publish their boundary rows of it on the
same stream, and readers aggregate them through the same CSRs, which therefore need no
transpose. Where some worker replicates rows at layer 0 (their gradient must not reach their
owner), readers instead publish the gradients of the rows they read as partial sums, from a
column block per owner, for the owners to add (`grads_as_rows` False).

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
from leo_cli.comm.blocks import ColumnBlock, selected_columns_block
from leo_cli.comm.dist import all_gather_
from leo_cli.comm.exchange import CommStats, HaloPlan, distinct_rows
from leo_cli.comm.published import BACKWARD, FORWARD, Layout, PublishedRows
from leo_cli.comm.views import halo_owner
from leo_cli.kernels.csr import compact_index_dtype, kept_row_pointers


@dataclass(frozen=True)
class OwnerRows:
    """The rows this worker reads in place from one owner."""

    owner: int
    positions_C: Tensor  # (R_q) each row's position among the owner's published rows
    in_place: kernels.CSR  # (N x B_q) forward-only: the edges reading them, by position
    block: ColumnBlock | None = None  # their column block (compact): partial sums' backward

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
    grads_as_rows: bool = True  # else the gradients of the rows read return as partial sums

    def stream(self, layer: int, direction: int = FORWARD) -> int:
        """One stream for every layer: every worker publishes and reads the layers in the same
        order (forward 0, 1, ...; backward ..., 1, 0), so exchanges line up, and one area of
        rows serves them all (an area per layer would multiply the memory by the depth).
        Gradients as rows share the forward's stream and area; partial sums have their own."""
        del layer
        return FORWARD if self.grads_as_rows else direction

    def publish(self, rows_XF: Tensor, layer: int, index_B: Tensor) -> None:
        """Make this worker's boundary rows of a layer (or of its output gradient) readable by
        its in-place readers, once they have read the previous exchange out: the rows
        `index_B` of `rows_XF`, gathered straight into the area (no copy of them first)."""
        if not self.read_by:
            return
        s = self.stream(layer, FORWARD)
        with self.stats.waiting(rows_XF.device):  # until readers are done with the area
            k, copy = self.rows.begin_write(s, readers=list(self.read_by))
        area = self.rows.forward_rows(self.rank, copy, rows_XF.shape[1])
        torch.index_select(rows_XF, 0, index_B, out=area)
        self.rows.end_write(s, k)

    def aggregate(self, inner: ColumnBlock, h_NF: Tensor, layer: int) -> Tensor:
        """The inner block's sums plus every owner's rows read in place (waiting for each
        owner's rows of this exchange).

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
                kernels.spmm_add_(out_NF, part.in_place, published)
            self.rows.end_read(s, part.owner, k)
            self.stats.published_bytes += part.in_place.num_edges * width * h_NF.element_size()
        assert out_NF is not None
        return out_NF

    def publish_grads(self, grad_NF: Tensor, layer: int) -> None:
        """The gradients of the rows read in place, as partial sums for their owners to add
        (`grads_as_rows` False)."""
        if not self.reads:
            return
        s, width = self.stream(layer, BACKWARD), grad_NF.shape[1]
        with self.stats.waiting(grad_NF.device):
            k, copy = self.rows.begin_write(s, readers=[p.owner for p in self.reads])
        for part in self.reads:
            assert part.block is not None, "partial sums need the rows' column block"
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
    setting: tuple[int, torch.dtype, float],
    stats: CommStats,
    grads_as_rows: bool = True,
) -> InPlace:
    """Set up the in-place reads of the halo positions `rows_H` (sorted; owners on this host).

    Collective: every worker calls it, with its own rows (possibly none). Each reader tells
    its owners which rows of their blocks it reads, and each owner answers with their
    positions among its published rows (one exchange each way, of those rows only).

    Args:
        adj: the part's CSR (inner rows, `[inner | halo]` columns).
        plan: its halo plan.
        rows_H: halo positions read in place.
        setting: (widest width, dtype, timeout in seconds); every layer shares the
            segments (see `InPlace.stream`).
        stats: where in-place bytes are counted.
        grads_as_rows: gradients travel as rows (no backward rows in the segments, no column
            blocks); else as partial sums (see the module docstring).
    """
    width, dtype, timeout_s = setting
    world, rank = dist.get_world_size(), dist.get_rank()
    device = adj.indptr.device  # index tensors follow the part's CSR (CPU or its GPU)
    rows_H = rows_H.to(device)
    boundary_B = distinct_rows(plan.send_idx_S, plan.num_inner)
    owner_R = halo_owner(plan, rows_H)
    read_counts = torch.bincount(owner_R, minlength=world)
    # Every rank's published rows and the rows it reads from each owner (q, 1 + o).
    counts = all_gather_(torch.cat([read_counts.new_tensor([boundary_B.shape[0]]), read_counts]))
    published_rows, reads_from = counts[:, 0].tolist(), counts[:, 1:]
    read_by, position_R = answer_readers(plan, rows_H, owner_R, boundary_B, reads_from)
    hosts = same_host_ranks(world)
    elem = torch.empty(0, dtype=dtype).element_size()

    def read_rows(q: int) -> list[int]:  # none where gradients travel as rows
        return [0 if grads_as_rows else int(c) for c in reads_from[q].tolist()]

    layouts: list[Layout | None] = [
        Layout(2, world, published_rows[q], read_rows(q), width, elem) if hosts[q] else None
        for q in range(world)
    ]
    published = PublishedRows(layouts, rank, dtype, timeout_s, device=device)
    owners = {q: published_rows[q] for q in torch.nonzero(read_counts).squeeze(1).tolist()}
    reads = owners_in_place(adj, plan.num_inner, rows_H, owner_R, position_R, owners)
    if not grads_as_rows:
        reads = [
            OwnerRows(r.owner, r.positions_C, r.in_place,
                      selected_columns_block(adj, rows_H[owner_R == r.owner] + plan.num_inner))
            for r in reads
        ]  # fmt: skip
    return InPlace(published, rank, boundary_B, reads, read_by, stats, grads_as_rows)


def answer_readers(
    plan: HaloPlan, rows_H: Tensor, owner_R: Tensor, boundary_B: Tensor, reads_from: Tensor
) -> tuple[dict[int, Tensor], Tensor]:
    """(reader -> this worker's local rows it reads, in its order; the position of each of
    this worker's rows `rows_H` among its owner's published rows). Collective.

    Readers send owners the rows they read as places in the owner's block of their halo
    (owner_R sorted: blocks go out in rank order); an owner finds the local row through its
    send list and the position through a table of its published rows `boundary_B`, and
    sends the positions back. `reads_from[q, o]`: how many rows rank q reads from rank o.
    """
    rank, device = dist.get_rank(), rows_H.device
    sent = reads_from[rank].tolist()
    asked = reads_from[:, rank].tolist()
    block_R = rows_H - torch.tensor(plan.recv_offsets(), device=device)[owner_R]
    places = block_R.new_empty(sum(asked))
    dist.all_to_all_single(places, block_R, asked, sent)
    reader_S = torch.repeat_interleave(
        torch.arange(len(asked), device=device), torch.tensor(asked, device=device)
    )
    send_offsets = torch.tensor(plan.send_offsets(), device=device)
    local_S = plan.send_idx_S.index_select(0, send_offsets[reader_S] + places)
    position_N = torch.full((plan.num_inner,), -1, dtype=torch.int64, device=device)
    position_N[boundary_B] = torch.arange(boundary_B.shape[0], device=device)
    answer_S = position_N.index_select(0, local_S)
    position_R = torch.empty_like(rows_H)
    dist.all_to_all_single(position_R, answer_S, sent, asked)
    # Checked after the exchange, by owners and readers alike: no rank waits in it for one
    # that stopped.
    published = bool((answer_S >= 0).all()) and bool((position_R >= 0).all())
    assert published, "rows read in place are published (boundary) rows"
    read_by = dict(zip(range(len(asked)), torch.split(local_S, asked), strict=True))
    return {r: rows for r, rows in read_by.items() if rows.numel() > 0}, position_R


def owners_in_place(
    adj: kernels.CSR,
    num_inner: int,
    rows_H: Tensor,
    owner_R: Tensor,
    position_R: Tensor,
    published_rows: dict[int, int],
) -> list[OwnerRows]:
    """Every owner's CSR of the rows read from it in place, from one pass over the part's
    edges (not one per owner): the edges reading `rows_H` (halo positions, sorted), at each
    row's position among its owner's published rows (`position_R`; owner q publishes
    `published_rows[q]`), each owner's in the part's order, so its CSR holds the arrays a
    column block of its rows would. A per-column table of owners, read once per edge that
    reads the halo, finds them; per owner only its own edges are touched (no sort, no row id
    per edge: its row pointers are where the part's fall among its edges)."""
    device = adj.indptr.device
    world = max(published_rows, default=-1) + 1
    owner_C = torch.full((adj.num_cols,), -1, dtype=owner_dtype(world), device=device)
    owner_C[rows_H + num_inner] = owner_R.to(owner_C.dtype)
    widest = max(published_rows.values(), default=0)
    position_C = torch.zeros(adj.num_cols, dtype=position_dtype(widest), device=device)
    position_C[rows_H + num_inner] = position_R.to(position_C.dtype)
    edges_E = torch.nonzero(adj.indices >= num_inner).squeeze(1)  # every edge reading the halo
    owner_E = owner_C.index_select(0, adj.indices.index_select(0, edges_E))
    read_E = owner_E >= 0
    if not bool(read_E.all()):  # every edge read in place (all of them where every row is)
        kept_E = torch.nonzero(read_E).squeeze(1)
        edges_E, owner_E = edges_E.index_select(0, kept_E), owner_E.index_select(0, kept_E)
    out = []
    for q in sorted(published_rows):
        e_E = edges_E.index_select(0, torch.nonzero(owner_E == q).squeeze(1))
        indptr = kept_row_pointers(adj.indptr, e_E)
        cols_E = position_C.index_select(0, adj.indices.index_select(0, e_E))
        num_cols = published_rows[q]
        csr = kernels.CSR.from_arrays(
            indptr, cols_E, adj.values.index_select(0, e_E), num_cols,
            index_dtype=compact_index_dtype(indptr, cols_E, num_cols), validate=False,
            transpose=False,
        )  # fmt: skip
        out.append(OwnerRows(q, position_R[owner_R == q], csr))
    return out


def position_dtype(rows: int) -> torch.dtype:
    """int32 where every position among `rows` published rows fits in it, else int64."""
    return torch.int32 if rows <= torch.iinfo(torch.int32).max else torch.int64


def owner_dtype(world: int) -> torch.dtype:
    """The narrowest signed dtype holding every rank and -1 (one byte per edge up to 127)."""
    return torch.int8 if world <= 127 else torch.int16 if world <= 32767 else torch.int32
