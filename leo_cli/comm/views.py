"""Other layouts of a worker's halo: rows dropped (kept as replicas), rows fetched per edge.

The halo of a part is one row per remote source node, deduplicated (level L2). A view
re-lays it out: each remote edge either reads a deduplicated row (L2), its own row fetched
for that edge alone (L3, MGG's scheme), or no exchanged row at all (its source is replicated
locally, L1). Owners learn once, at set-up, which of their rows each new halo row is, so a
view is just another (CSR, HaloPlan) pair for the same exchange code.

Legend: N inner rows, H halo rows of the part, K halo rows of the view, E edges, P peers.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.exchange import HaloPlan
from leo_cli.kernels.csr import (
    columns_below,
    kept_transpose,
    max_degree,
    row_of_edges,
    through_columns,
)

L1, L2, L3 = 1, 2, 3  # replicated, deduplicated halo buffer, fetched per edge
IN_PLACE = 4  # L3 read in place from a same-host owner's published rows (comm/inplace.py)


def _exchange_counts(counts: list[int], device: torch.device) -> list[int]:
    """What every peer tells this worker: out[q] = counts[me] as peer q computed it."""
    send = torch.tensor(counts, dtype=torch.int64, device=device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return [int(c) for c in recv.tolist()]


def halo_owner(plan: HaloPlan, halo_H: Tensor) -> Tensor:
    """Peer owning each halo position (halo columns are contiguous per owner)."""
    offsets = torch.tensor(plan.recv_offsets(), device=halo_H.device)
    return torch.searchsorted(offsets[1:], halo_H, right=True)


def remap_halo(
    adj: kernels.CSR, plan: HaloPlan, rows_K: Tensor, edge_cols: Tensor, transpose: bool = True
) -> tuple[kernels.CSR, HaloPlan]:
    """The view whose halo rows are `rows_K` (original halo positions, grouped by owner,
    repeats allowed) and whose remote edges read `edge_cols` (view halo column, or -1: the
    edge leaves the CSR).

    Args:
        adj: the part's CSR, inner rows and `[inner | halo]` columns.
        plan: its halo plan.
        rows_K: (K) halo position behind each view halo row, owners in increasing order.
        edge_cols: (E_remote) for every edge with a halo column (CSR order), its view column
            in `0..K-1`, or -1.
        transpose: give the view's CSR its transpose; without, a forward-only CSR (for
            aggregators whose backward reads gradients as rows).
    """
    n, num_cols = plan.num_inner, plan.num_inner + int(rows_K.shape[0])
    # Column temporaries in the CSR's own index dtype where the view's columns fit in it.
    dtype = adj.indices.dtype if num_cols <= torch.iinfo(adj.indices.dtype).max else torch.int64
    new_cols = adj.indices.to(dtype, copy=True)
    remote_E = torch.nonzero(new_cols >= n).squeeze(1)
    new_cols[remote_E] = torch.where(edge_cols >= 0, n + edge_cols, -1).to(dtype)
    del remote_E
    keep_E = new_cols >= 0
    # The view's transpose from the part's (no sort), where its columns keep their order.
    transposed = kept_transpose(adj, keep_E, new_cols, num_cols) if transpose else None
    rows_E = row_of_edges(adj.indptr, dtype)[keep_E]
    view_adj = kernels.CSR.from_coo(
        rows_E, new_cols[keep_E], adj.values[keep_E], adj.num_rows, num_cols, rows_sorted=True,
        transpose=transpose and transposed is None,
    )  # fmt: skip
    if transposed is not None:
        view_adj = with_transpose(view_adj, *transposed)
    return view_adj, remap_plan(plan, rows_K)


def with_transpose(
    adj: kernels.CSR, t_indptr: Tensor, t_indices: Tensor, t_perm: Tensor
) -> kernels.CSR:
    """A forward-only CSR given its transpose, in its own index dtype."""
    dtype = adj.indices.dtype
    return dataclasses.replace(
        adj, t_indptr=t_indptr.to(dtype), t_indices=t_indices.to(dtype), t_perm=t_perm.to(dtype),
        t_max_degree=max_degree(t_indptr),
    )  # fmt: skip


def remap_plan(plan: HaloPlan, rows_K: Tensor) -> HaloPlan:
    """The halo plan of a view whose halo rows are `rows_K` (see `remap_halo`), without its
    CSR: owners learn which of their rows each view row is. Collective."""
    n, device = plan.num_inner, rows_K.device
    owner_K = halo_owner(plan, rows_K)
    recv_counts = torch.bincount(owner_K, minlength=len(plan.recv_counts)).tolist()
    recv_offsets = torch.tensor(plan.recv_offsets(), device=device)
    wanted = rows_K - recv_offsets[owner_K]  # position inside this worker's block of the owner
    send_counts = _exchange_counts(recv_counts, device)
    positions = wanted.new_empty(sum(send_counts))
    dist.all_to_all_single(positions, wanted, send_counts, recv_counts)
    # An owner's rows for reader r are send_idx[block r]; map positions through that block.
    send_offsets = torch.tensor(plan.send_offsets(), device=device)
    counts = torch.tensor(send_counts, device=device)
    reader = torch.repeat_interleave(torch.arange(len(send_counts), device=device), counts)
    send_idx = plan.send_idx_S[send_offsets[reader] + positions]
    return HaloPlan(n, send_idx, send_counts, recv_counts)


def remote_edges(adj: kernels.CSR, num_inner: int) -> Tensor:
    """(E_remote) halo position read by every edge with a halo column, in CSR order."""
    cols_E = adj.indices.long()
    return cols_E[cols_E >= num_inner] - num_inner


def level_view(
    adj: kernels.CSR,
    plan: HaloPlan,
    level_H: Tensor,
    same_csr: kernels.CSR | None = None,
    transpose: bool = True,
) -> tuple[kernels.CSR, HaloPlan]:
    """The view of a per-row level assignment: L2 rows once, L3 rows once per reading edge,
    L1 and in-place rows left out (their edges leave the CSR: replicas and rows read in place
    are aggregated elsewhere). Collective (`remap_plan`).

    `same_csr`: the CSR of a view already made from the same levels (only the plan, which
    is collective, is made again); without `transpose`, a forward-only CSR (for L2 rows
    alone, read through a column table: `l2_view`).
    """
    if not transpose and not bool((level_H == L3).any()):  # L2 rows only: a table suffices
        rows_K = torch.nonzero(level_H == L2).squeeze(1)
        view_adj = same_csr if same_csr is not None else l2_view(adj, plan.num_inner, rows_K)
        return view_adj, remap_plan(plan, rows_K)
    rows_K, edge_cols = view_layout(adj, plan, level_H)
    if same_csr is not None:
        return same_csr, remap_plan(plan, rows_K)
    return remap_halo(adj, plan, rows_K, edge_cols, transpose)


def l2_view(adj: kernels.CSR, num_inner: int, rows_K: Tensor) -> kernels.CSR:
    """The forward-only CSR of a view whose halo rows are the L2 rows `rows_K` (halo
    positions, sorted), the other halo columns' edges left out: the arrays `remap_halo`
    gives for them, by one gather of a column table instead of a pass per level."""
    num_cols = num_inner + int(rows_K.shape[0])
    if rows_K.numel() == 0:  # the inner columns alone (every halo row read elsewhere)
        return columns_below(adj, num_inner)
    col_of_C = torch.full((adj.num_cols,), -1, dtype=adj.indices.dtype, device=adj.device)
    col_of_C[:num_inner] = torch.arange(num_inner, dtype=col_of_C.dtype, device=adj.device)
    col_of_C[num_inner + rows_K] = torch.arange(
        num_inner, num_cols, dtype=col_of_C.dtype, device=adj.device
    )
    return through_columns(adj, col_of_C, num_cols)


def view_layout(adj: kernels.CSR, plan: HaloPlan, level_H: Tensor) -> tuple[Tensor, Tensor]:
    """The halo rows (`rows_K`) and remote edges' columns (`edge_cols`) of a level view, as
    `remap_halo` takes them.

    Per owner, the view's rows are its L2 rows (in halo order), then one row per edge that
    reads one of its L3 rows (in CSR order), so every owner's rows stay contiguous.
    """
    halo_e = remote_edges(adj, plan.num_inner)
    device = halo_e.device
    num_halo = plan.num_halo
    owner_H = halo_owner(plan, torch.arange(num_halo, device=device))
    l2_H = torch.nonzero(level_H == L2).squeeze(1)
    l3_e = torch.nonzero(level_H[halo_e] == L3).squeeze(1)
    # Sort key: owner first, then L2 rows before L3 edges, then halo / CSR order.
    key_l2 = owner_H[l2_H] * 2 * (num_halo + halo_e.shape[0] + 1) + l2_H
    key_l3 = owner_H[halo_e[l3_e]] * 2 * (num_halo + halo_e.shape[0] + 1)
    key_l3 = key_l3 + num_halo + 1 + l3_e
    order = torch.sort(torch.cat([key_l2, key_l3])).indices
    rows_K = torch.cat([l2_H, halo_e[l3_e]])[order]
    view_col = torch.empty_like(order)
    view_col[order] = torch.arange(order.shape[0], device=device)
    col_of_l2_row = torch.full((num_halo,), -1, dtype=torch.int64, device=device)
    col_of_l2_row[l2_H] = view_col[: l2_H.shape[0]]
    edge_cols = col_of_l2_row[halo_e]
    edge_cols[l3_e] = view_col[l2_H.shape[0] :]
    return rows_K, edge_cols
