"""Column blocks of a worker's CSR, so that each source of rows is aggregated on its own.

The columns are cut into the inner block and one block per peer and chunk (a `Schedule`), so an
aggregation (comm/aggregate.py) sums the inner rows while halo rows are in flight and adds each
chunk as it lands: `A·h = Σ_b A[:, b]·h[b]`. A halo block keeps one row per reading row; a
block runs its CSR and its transpose forward only, so neither keeps the edge permutation. An
aggregator whose backward reads the gradient as rows (comm/aggregate.py) builds no transposes.

Specification: docs/design/aggregation.md.
Legend: N inner rows, R rows of a block, C columns of a block, E edges, F width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.exchange import HaloPlan, chunk_bounds
from leo_cli.kernels.csr import INT32_MAX, compact_index_dtype, max_degree, row_of_edges


@dataclass(frozen=True)
class ColumnBlock:
    """Columns `[col_start, col_end)` of a CSR, with their transpose for the backward pass.

    Attributes:
        col_start: first column of the block in the full CSR.
        col_end: one past its last column.
        rows_R: (R) rows of the full CSR that have edges in the block (int32 where row ids
            fit), or None when the block keeps every row (the inner block).
        fwd: (R x C) CSR of the block, without `t_perm` (forward only).
        bwd: (C x R) its transpose, for gradients flowing back to the block's columns; without
            `t_perm` too. None in a forward-only block.
    """

    col_start: int
    col_end: int
    rows_R: Tensor | None
    fwd: kernels.CSR
    bwd: kernels.CSR | None

    @property
    def num_cols(self) -> int:
        return self.col_end - self.col_start

    @property
    def num_edges(self) -> int:
        return self.fwd.num_edges

    def forward(self, x_CF: Tensor) -> Tensor:
        """A[:, block] · x: (R x F), or (N x F) for a block that keeps every row. Not
        differentiable through the op (no `t_perm`): `block_product` is."""
        return kernels.spmm(self.fwd, x_CF)

    def backward(self, grad_NF: Tensor) -> Tensor:
        """A[:, block]^T · grad: the gradient of the block's (C x F) input rows."""
        assert self.bwd is not None, "a forward-only block has no transpose"
        grad_RF = grad_NF if self.rows_R is None else grad_NF.index_select(0, self.rows_R)
        return kernels.spmm(self.bwd, grad_RF)

    def add_into(self, out_NF: Tensor, x_CF: Tensor) -> None:
        """out += A[:, block] · x (in place; only the block's rows change)."""
        if self.rows_R is None:
            kernels.spmm_add_(out_NF, self.fwd, x_CF)
        else:
            out_NF.index_add_(0, self.rows_R, self.forward(x_CF))


class _BlockProduct(torch.autograd.Function):
    """x -> A[:, block]·x, its backward over the block's precomputed transpose (no per-call
    gather of transposed edge values, unlike the op's own autograd)."""

    @staticmethod
    def forward(ctx: Any, x_CF: Tensor, block: ColumnBlock) -> Tensor:
        ctx.block = block
        return block.forward(x_CF)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.block.backward(grad), None


def block_product(block: ColumnBlock, x_CF: Tensor) -> Tensor:
    """A[:, block]·x, differentiable in x (edge values are constants)."""
    out: Tensor = _BlockProduct.apply(x_CF, block)  # type: ignore[no-untyped-call]
    return out


def forward_only(csr: kernels.CSR) -> kernels.CSR:
    """The same CSR without its edge permutation: it can run forward, not backward."""
    return dataclasses.replace(csr, t_perm=csr.t_perm.new_empty(0))


def block_of(
    start: int,
    end: int,
    rows_R: Tensor | None,
    fwd: kernels.CSR,
    bwd: kernels.CSR | None = None,
    transpose: bool = True,
) -> ColumnBlock:
    """A block from its CSR (and its transpose `bwd` where it is known): the transpose built
    once, neither keeping `t_perm`, and the row ids in the CSR's (compact) index dtype where
    they fit. Without `transpose`, no transpose at all (none kept from `fwd` either)."""
    if bwd is None and transpose:
        bwd = forward_only(fwd.transpose())  # reads fwd.t_perm once, before it is dropped
    if rows_R is not None and (rows_R.shape[0] == 0 or int(rows_R.max()) <= INT32_MAX):
        rows_R = rows_R.to(fwd.indices.dtype)
    if not transpose:
        none = fwd.indices.new_empty(0)
        fwd = dataclasses.replace(fwd, t_indptr=none, t_indices=none, t_max_degree=-1)
        bwd = None
    return ColumnBlock(start, end, rows_R, forward_only(fwd), bwd)


def column_block(
    adj: kernels.CSR, start: int, end: int, *, compact: bool, transpose: bool = True
) -> ColumnBlock:
    """The block of columns `[start, end)` of adj; compact keeps only rows with edges there;
    without `transpose`, a forward-only block (no transpose built).

    The whole CSR as a non-compact block reuses adj's arrays (no copy of its edges).
    """
    if not compact and start == 0 and end == adj.num_cols:
        return block_of(start, end, None, adj, transpose=transpose)
    if adj.t_perm.shape[0] == adj.num_edges:  # the transpose names the block's edges
        return _sliced(adj, start, end, compact, transpose)
    keep_E = _in_columns(adj, start, end)  # forward-only: scan every edge
    cols_E = adj.indices[keep_E] - start
    return _scanned(adj, (start, end), keep_E, cols_E, compact, transpose=transpose)


def _in_columns(adj: kernels.CSR, start: int, end: int) -> Tensor:
    """(E) whether each edge of adj lies in columns `[start, end)`."""
    return adj.indices < end if start == 0 else (adj.indices >= start) & (adj.indices < end)


def _scanned(
    adj: kernels.CSR,
    span: tuple[int, int],
    keep_E: Tensor,
    cols_E: Tensor,
    compact: bool,
    t_edges: tuple[Tensor, Tensor, Tensor] | None = None,
    transpose: bool = True,
) -> ColumnBlock:
    """The block `span` of the edges `keep_E` marks (`cols_E`: their block columns) found by
    a scan of every edge; its transpose taken from adj's (`t_edges`, see `_assembled`), or,
    for a forward-only adj (None), by sorting the block's edges (none without `transpose`)."""
    values_E = adj.values[keep_E]
    if t_edges is not None:
        rows = _rows_kept(adj, keep_E, compact)
        return _assembled(adj, span, rows, (cols_E, values_E), t_edges, transpose)
    rows_E = row_of_edges(adj.indptr, adj.indices.dtype)[keep_E]
    rows_R, rows_E, num_rows = _compact(rows_E, adj.num_rows, compact)
    num_cols = span[1] - span[0]
    fwd = kernels.CSR.from_coo(
        rows_E, cols_E, values_E, num_rows, num_cols, rows_sorted=True, transpose=transpose
    )
    return block_of(span[0], span[1], rows_R, fwd, transpose=transpose)


def _compact(rows_E: Tensor, num_rows: int, compact: bool) -> tuple[Tensor | None, Tensor, int]:
    """(rows_R, rows_E, R): with `compact`, the rows that have edges (sorted `rows_E`) and
    each edge's row among them; without, every row (None) and `rows_E` as given."""
    if not compact:
        return None, rows_E, num_rows
    rows_R, rows_E = torch.unique_consecutive(rows_E, return_inverse=True)
    return rows_R, rows_E, int(rows_R.shape[0])


# A block holding at least this share of a CSR's edges finds them by one scan of every edge
# (a mask, sequential); a smaller one sorts its edge positions, read from the transpose.
SCAN_SHARE = 0.25


def _sliced(
    adj: kernels.CSR, start: int, end: int, compact: bool, transpose: bool = True
) -> ColumnBlock:
    """The block of columns `[start, end)` of a CSR with its transpose: the transpose's rows
    `[start, end)` are the block's transpose, in the order the block's own stable sort would
    give, so the arrays equal the forward-only path's (`from_coo`) without a sort of every
    edge: its edges are found by a scan where they are many, else by sorting their
    positions. Without `transpose` the block keeps its forward CSR only."""
    lo, hi = int(adj.t_indptr[start]), int(adj.t_indptr[end])
    t_edges = (adj.t_indptr[start : end + 1] - lo, adj.t_indices[lo:hi], adj.t_perm[lo:hi])
    if hi - lo >= SCAN_SHARE * adj.num_edges:
        keep_E = _in_columns(adj, start, end)
        cols_E = adj.indices[keep_E] - start
        return _scanned(adj, (start, end), keep_E, cols_E, compact, t_edges, transpose)
    edges_E = torch.sort(adj.t_perm[lo:hi]).values  # their positions, in adj's order
    int32 = adj.indptr.dtype == torch.int32
    rows_E = torch.searchsorted(adj.indptr, edges_E, right=True, out_int32=int32) - 1
    cols_E = adj.indices.index_select(0, edges_E) - start
    values_E = adj.values.index_select(0, edges_E)
    rows_R, rows_E, num_rows = _compact(rows_E, adj.num_rows, compact)
    rows = rows_R, torch.bincount(rows_E, minlength=num_rows)
    return _assembled(adj, (start, end), rows, (cols_E, values_E), t_edges, transpose)


def _rows_kept(adj: kernels.CSR, keep_E: Tensor, compact: bool) -> tuple[Tensor | None, Tensor]:
    """(rows_R, counts_R) of the edges `keep_E` marks: with `compact` the rows that keep
    some (else None: every row) and how many each keeps, by one running count."""
    if keep_E.numel() == 0:
        counts_R = torch.zeros(adj.num_rows, dtype=torch.int64, device=adj.device)
    else:
        seen_E = torch.cumsum(keep_E, 0, dtype=adj.indptr.dtype)  # kept edges up to each
        last_R = adj.indptr.long() - 1  # the edge before each row pointer (-1: none)
        upto_R = seen_E.index_select(0, last_R.clamp(min=0)).masked_fill(last_R < 0, 0)
        counts_R = torch.diff(upto_R)
    if not compact:
        return None, counts_R
    rows_R = torch.nonzero(counts_R).squeeze(1)
    return rows_R, counts_R.index_select(0, rows_R)


def _own(t: Tensor) -> Tensor:
    """`t` in storage of its own where it is a slice of a larger array (adj's transpose):
    a block kept for the run must not keep the part's whole transposed index alive."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def _assembled(
    adj: kernels.CSR,
    span: tuple[int, int],
    rows: tuple[Tensor | None, Tensor],
    edges: tuple[Tensor, Tensor],
    t_edges: tuple[Tensor, Tensor, Tensor],
    transpose: bool = True,
) -> ColumnBlock:
    """The block `span` of adj from its rows (`rows_R` or None, edges per row), its edges'
    block columns and values (in adj's order) and its transpose taken from adj's
    (pointers, adj's rows, positions of the edges in adj; unused without `transpose`)."""
    rows_R, counts_R = rows
    cols_E, values_E = edges
    t_indptr, t_rows, t_perm = t_edges
    num_rows, cols = int(counts_R.shape[0]), span[1] - span[0]
    indptr = torch.cat([counts_R.new_zeros(1), torch.cumsum(counts_R, 0)])
    dtype = compact_index_dtype(indptr, cols_E, cols)
    if not transpose:
        fwd = kernels.CSR.from_arrays(
            indptr, cols_E, values_E, cols, index_dtype=dtype, validate=False, transpose=False
        )
        return block_of(span[0], span[1], rows_R, fwd, transpose=False)
    if rows_R is not None:  # full rows -> the block's compact rows, by a lookup table
        table = torch.empty(adj.num_rows, dtype=dtype, device=adj.device)
        table[rows_R] = torch.arange(num_rows, dtype=dtype, device=adj.device)
        t_rows = table.index_select(0, t_rows)
    t_values = adj.values.index_select(0, t_perm)
    indptr, cols_E, t_indptr, t_rows = (
        _own(t.to(dtype)) for t in (indptr, cols_E, t_indptr, t_rows)
    )
    empty = cols_E.new_empty(0)
    degree, t_degree = max_degree(indptr), max_degree(t_indptr)
    fwd = kernels.CSR(
        indptr, cols_E, values_E, num_rows, cols, t_indptr, t_rows, empty, degree, t_degree
    )
    bwd = kernels.CSR(
        t_indptr, t_rows, t_values, cols, num_rows, indptr, cols_E, empty, t_degree, degree
    )
    return block_of(span[0], span[1], rows_R, fwd, bwd)


def selected_columns_block(adj: kernels.CSR, cols_C: Tensor) -> ColumnBlock:
    """The block of the columns `cols_C` (sorted, distinct, any positions), compact,
    renumbered 0..C-1.

    Used for replicated halo rows and rows read in place, which are not contiguous in the
    part's column order. A CSR with its transpose gives the block's transpose from its own
    (the selected columns' rows, no sort); a forward-only one sorts the block's edges.
    """
    num_cols = int(cols_C.shape[0])
    col_of = torch.full((adj.num_cols,), -1, dtype=adj.indices.dtype, device=adj.device)
    col_of[cols_C] = torch.arange(num_cols, dtype=col_of.dtype, device=adj.device)
    block_col_E = col_of.index_select(0, adj.indices)  # -1: a column not selected
    keep_E = block_col_E >= 0
    t_edges = None
    if adj.t_perm.shape[0] == adj.num_edges:
        at_E, t_indptr = segments(adj.t_indptr, cols_C)
        assert int(t_indptr[-1]) == int(keep_E.sum()), "selected columns must be distinct"
        t_edges = (t_indptr, adj.t_indices.index_select(0, at_E), adj.t_perm.index_select(0, at_E))
    return _scanned(adj, (0, num_cols), keep_E, block_col_E[keep_E], True, t_edges)


def segments(indptr: Tensor, rows_C: Tensor) -> tuple[Tensor, Tensor]:
    """(positions, pointers) of the rows `rows_C` of a CSR laid end to end: every edge
    position of row `rows_C[0]`, then of `rows_C[1]`, ...; and their (C+1) pointers."""
    rows_C = rows_C.long()
    starts_C = indptr.index_select(0, rows_C).long()
    lengths_C = indptr.index_select(0, rows_C + 1).long() - starts_C
    pointers = torch.cat([lengths_C.new_zeros(1), torch.cumsum(lengths_C, 0)])
    total = int(pointers[-1])
    shift_E = torch.repeat_interleave(starts_C - pointers[:-1], lengths_C, output_size=total)
    return shift_E.add_(torch.arange(total, device=indptr.device)), pointers


@dataclass(frozen=True)
class Chunk:
    """One chunk between this worker and a peer: rows sent and halo columns received.

    Attributes:
        peer: the other worker.
        send_idx: inner rows sent to the peer in this chunk.
        send_pos: the same rows as positions among the boundary rows (boundary-first update).
        send_start: where they sit in the plan's `send_idx_S` (`send_end`: one past them).
        recv_start: halo rows `[recv_start, recv_end)` arrive in this chunk.
        block: columns `N + [recv_start, recv_end)` of the CSR.
    """

    peer: int
    send_idx: Tensor
    send_pos: Tensor
    send_start: int
    send_end: int
    recv_start: int
    recv_end: int
    block: ColumnBlock

    @property
    def num_send(self) -> int:
        return self.send_end - self.send_start


@dataclass(frozen=True)
class Schedule:
    """The rounds in which chunks move and are aggregated, for one chunk count: round c holds
    chunk c of every peer (peers with nothing to move in it are left out)."""

    num_chunks: int
    num_halo: int
    rounds: list[list[Chunk]]


def build_schedule(
    adj: kernels.CSR, plan: HaloPlan, boundary_B: Tensor, k: int, transpose: bool = True
) -> Schedule:
    """Cut every peer's rows into k chunks; round c holds chunk c of every peer.

    `boundary_B`: the sorted boundary rows (the positions of `send_pos`); without `transpose`
    the chunks' blocks are forward-only.
    """
    send_off, recv_off = plan.send_offsets(), plan.recv_offsets()
    n, rounds = plan.num_inner, []
    for c in range(k):
        chunks: list[Chunk] = []
        rounds.append(chunks)
        for peer in range(len(plan.send_counts)):
            s = chunk_bounds(plan.send_counts[peer], k)
            r = chunk_bounds(plan.recv_counts[peer], k)
            if s[c + 1] == s[c] and r[c + 1] == r[c]:
                continue
            send_lo, send_hi = send_off[peer] + s[c], send_off[peer] + s[c + 1]
            send_idx = plan.send_idx_S[send_lo:send_hi]
            lo, hi = recv_off[peer] + r[c], recv_off[peer] + r[c + 1]
            chunks.append(
                Chunk(
                    peer,
                    send_idx,
                    torch.searchsorted(boundary_B, send_idx),
                    send_lo,
                    send_hi,
                    lo,
                    hi,
                    column_block(adj, n + lo, n + hi, compact=True, transpose=transpose),
                )
            )
    return Schedule(k, plan.num_halo, [chunks for chunks in rounds if chunks])
