"""The CSR adjacency the kernels take: arrays, shape, and a transpose built once per graph.

Aggregation runs over in-edges: row i of the CSR is a destination node, its columns are the
source nodes whose features it sums. The backward pass of `out = A @ x` is `grad_x = A^T @
grad_out`, another SpMM over the transpose. Building that transpose means sorting every edge by
column; doing it once here, instead of in every backward pass, makes the reference SpMM faster
than autograd's own CSR backward on the CPU (docs/results.md).

Shape suffixes: R rows, C columns, E edges; (R+1) and (C+1) are pointer arrays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from leo_cli.errors import KernelError

_INDEX_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class CSR:
    """A sparse matrix in compressed sparse row form, with its transpose precomputed.

    Attributes:
        indptr: (R+1) row pointers; the edges of row i are `indptr[i]:indptr[i+1]`.
        indices: (E) column of every edge, grouped by row; duplicates are summed.
        values: (E) weight of every edge (floating point).
        num_rows: R.
        num_cols: C; the features multiplied by this matrix have C rows.
        t_indptr: (C+1) row pointers of the transpose.
        t_indices: (E) columns of the transpose (original rows), grouped by original column.
        t_perm: (E) transpose edge k is original edge `t_perm[k]`, so the transpose's
            values are `values[t_perm]`; empty in a forward-only CSR (comm/blocks.py), which
            can run forward but neither be transposed nor differentiated (one built without
            its transpose has empty `t_indptr` and `t_indices` too).
        max_degree: edges of the longest row (-1: unknown). Computed once here, it tells the
            CUDA SpMM whether some rows are hubs to split across blocks (see cuda/).
        t_max_degree: the same for the transpose (the longest column: the backward's hub).

    `indptr`, `indices`, `t_indptr`, `t_indices` and `t_perm` share one dtype (int32 or int64;
    int32 unless the graph needs more: an int64 `t_perm` alone was 8 of a CSR's 20 bytes per
    edge).
    Build instances with `CSR.from_arrays` or `CSR.from_coo`.
    """

    indptr: Tensor
    indices: Tensor
    values: Tensor
    num_rows: int
    num_cols: int
    t_indptr: Tensor
    t_indices: Tensor
    t_perm: Tensor
    max_degree: int = -1
    t_max_degree: int = -1

    @classmethod
    def from_arrays(
        cls,
        indptr: Tensor,
        indices: Tensor,
        values: Tensor | None = None,
        num_cols: int | None = None,
        *,
        index_dtype: torch.dtype | None = None,
        validate: bool = True,
        transpose: bool = True,
    ) -> CSR:
        """Wrap CSR arrays and build the transpose (once; O(E log E)), or none (forward-only).

        Args:
            indptr: (R+1) integer row pointers.
            indices: (E) integer column indices, grouped by row.
            values: (E) edge weights; None means all ones (float32).
            num_cols: C; None means `max(indices) + 1` (0 without edges).
            index_dtype: torch.int32 or torch.int64 for the stored index arrays. None picks
                int32 when every index and count fits: half the index bytes, and torch's MKL
                CSR kernel would otherwise convert int64 indices to int32 on every call.
            validate: check pointers, lengths and index ranges (one pass over the arrays).
            transpose: build the transpose; False gives a forward-only CSR.

        Raises:
            KernelError: the arrays do not describe a valid CSR matrix.
        """
        _check_index_arrays(indptr, indices)
        if values is None:
            values = torch.ones(indices.shape[0], dtype=torch.float32, device=indices.device)
        if num_cols is None:
            num_cols = int(indices.max()) + 1 if indices.numel() > 0 else 0
        if validate:
            _validate(indptr, indices, values, num_cols)
        dtype = index_dtype or compact_index_dtype(indptr, indices, num_cols)
        indptr, indices = indptr.to(dtype), indices.to(dtype)
        if transpose:
            t_indptr, t_indices, t_perm = build_transpose(indptr, indices, num_cols)
        else:
            t_indptr = t_indices = t_perm = indptr.new_empty(0)
        return cls(
            indptr,
            indices,
            values,
            indptr.shape[0] - 1,
            num_cols,
            t_indptr,
            t_indices,
            t_perm,
            max_degree=max_degree(indptr),
            t_max_degree=max_degree(t_indptr) if transpose else -1,
        )

    @classmethod
    def from_coo(
        cls,
        rows: Tensor,
        cols: Tensor,
        values: Tensor | None,
        num_rows: int,
        num_cols: int,
        *,
        index_dtype: torch.dtype | None = None,
        rows_sorted: bool = False,
        transpose: bool = True,
    ) -> CSR:
        """Build from coordinate lists (edges in any order; kept in order within a row).

        For a PyG `edge_index` (source, target) aggregated at the target, pass
        `rows=edge_index[1], cols=edge_index[0]`. `rows_sorted` says the edges are already
        grouped by row in increasing order (e.g. cut out of another CSR): the stable sort
        would then be the identity, and skipping it saves a sort and a copy of every array.
        `transpose`: as for `from_arrays`.
        """
        counts = torch.bincount(rows, minlength=num_rows)
        indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        if rows_sorted and rows.shape[0] > 1 and bool((rows[1:] < rows[:-1]).any()):
            raise KernelError("from_coo(rows_sorted=True) got rows out of order")
        if not rows_sorted:
            order = torch.sort(rows, stable=True).indices
            cols = cols[order]
            values = None if values is None else values[order]
        if cols.dtype not in _INDEX_DTYPES:
            cols = cols.long()
        return cls.from_arrays(
            indptr, cols, values, num_cols, index_dtype=index_dtype, transpose=transpose
        )

    @property
    def num_edges(self) -> int:
        """E, the number of stored edges (duplicates counted)."""
        return int(self.indices.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the arrays live."""
        return self.indices.device

    def to(self, device: torch.device | str) -> CSR:
        """The same matrix with every array on `device` (the transpose travels along)."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return dataclasses.replace(self, **moved)

    def with_values(self, values: Tensor) -> CSR:
        """The same sparsity pattern (and transpose) with other edge weights, e.g. learned ones."""
        if values.shape != self.values.shape:
            raise ValueError(
                f"values must have shape {tuple(self.values.shape)}, got {tuple(values.shape)}"
            )
        return dataclasses.replace(self, values=values)

    def transpose(self) -> CSR:
        """A^T as a CSR (its own transpose, A, comes with it; O(E) for the inverse permutation)."""
        if self.t_perm.shape[0] != self.num_edges:
            raise KernelError("this CSR was built forward-only (no t_perm): it has no transpose")
        return CSR(
            indptr=self.t_indptr,
            indices=self.t_indices,
            values=self.values.index_select(0, self.t_perm),
            num_rows=self.num_cols,
            num_cols=self.num_rows,
            t_indptr=self.indptr,
            t_indices=self.indices,
            t_perm=inverse_permutation(self.t_perm),
            max_degree=self.t_max_degree,
            t_max_degree=self.max_degree,
        )

    def to_dense(self) -> Tensor:
        """The (R x C) dense matrix (duplicates summed); for tests and small graphs only."""
        dense = torch.zeros(
            self.num_rows, self.num_cols, dtype=self.values.dtype, device=self.device
        )
        dense.index_put_(
            (row_of_edges(self.indptr), self.indices.long()), self.values, accumulate=True
        )
        return dense


def max_degree(indptr: Tensor) -> int:
    """Edges of the longest row (0 without rows)."""
    if indptr.shape[0] < 2:
        return 0
    return int((indptr[1:] - indptr[:-1]).max())


def row_of_edges(indptr: Tensor, dtype: torch.dtype = torch.int64) -> Tensor:
    """(E) row of every edge, from (R+1) row pointers, in `dtype` (int64 unless the caller
    knows its row ids fit a narrower one; nothing here checks)."""
    num_rows = indptr.shape[0] - 1
    degrees = (indptr[1:] - indptr[:-1]).long()
    rows_R = torch.arange(num_rows, dtype=dtype, device=indptr.device)
    return torch.repeat_interleave(rows_R, degrees)


def inverse_permutation(perm: Tensor) -> Tensor:
    """inv with inv[perm[k]] = k (O(E), no sort)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0], dtype=perm.dtype, device=perm.device)
    return inv


def build_transpose(
    indptr: Tensor, indices: Tensor, num_cols: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Transpose of a CSR matrix: (t_indptr (C+1), t_indices (E), t_perm (E)), all three in
    the dtype of `indices` (every edge position fits in it, see `compact_index_dtype`).

    A stable sort by column keeps each transpose row's entries in increasing original row.
    """
    cols, order = torch.sort(indices, stable=True)
    # Sorted columns are counted in order on the CPU; on a GPU, neighbouring equal columns
    # would contend for one counter, so the unsorted ones are counted there.
    counts = torch.bincount(cols if cols.device.type == "cpu" else indices, minlength=num_cols)
    del cols  # before the rows are gathered: set-up's peak
    t_indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(indices.dtype)
    t_perm = order.to(indices.dtype)
    del order
    t_indices = row_of_edges(indptr, indices.dtype).index_select(0, t_perm)  # int32 stays
    return t_indptr, t_indices, t_perm


def kept_transpose(
    adj: CSR, keep_E: Tensor, cols_E: Tensor, num_cols: int
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The transpose (as `build_transpose` gives it) of the CSR of `adj`'s edges `keep_E`
    (bool, E) with new columns `cols_E` (E, read where kept), read off `adj`'s own transpose
    with no sort: possible where its slots, read in order, already come by new column and
    within one by edge (the stable sort's order), as when columns are renumbered in order. None
    where they do not, or `adj` is forward-only.

    Arrays in `adj`'s index dtype (every edge position fits in it), `t_indptr` in int64.
    """
    if adj.t_perm.shape[0] != adj.num_edges:
        return None
    keep_T = keep_E.index_select(0, adj.t_perm)  # transpose slots whose edge stays
    edges_K = adj.t_perm[keep_T]
    cols_K = cols_E.index_select(0, edges_K)
    if cols_K.shape[0] > 1:
        later, earlier = cols_K[1:], cols_K[:-1]
        back = (later < earlier) | ((later == earlier) & (edges_K[1:] < edges_K[:-1]))
        if bool(back.any()):
            return None
    counts = torch.bincount(cols_K, minlength=num_cols)
    del cols_K
    t_indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    position_E = torch.cumsum(keep_E, 0, dtype=adj.t_perm.dtype).sub_(1)  # in the new CSR
    t_perm = position_E.index_select(0, edges_K)
    del position_E, edges_K
    return t_indptr, adj.t_indices[keep_T], t_perm


def with_built_transpose(csr: CSR) -> CSR:
    """A forward-only CSR with its transpose built (as `CSR.from_arrays` builds it)."""
    t_indptr, t_indices, t_perm = build_transpose(csr.indptr, csr.indices, csr.num_cols)
    return dataclasses.replace(
        csr, t_indptr=t_indptr, t_indices=t_indices, t_perm=t_perm,
        t_max_degree=max_degree(t_indptr),
    )  # fmt: skip


def kept_row_pointers(indptr: Tensor, kept_E: Tensor) -> Tensor:
    """(R+1) int64 row pointers of the CSR of a matrix's edges `kept_E` (their positions,
    increasing), from its row pointers `indptr`: where each row's end falls among the kept
    edges (one search per row; no pass over every edge, no row id per edge)."""
    ends_R = torch.searchsorted(kept_E, indptr[1:].to(kept_E.dtype))
    return torch.cat([ends_R.new_zeros(1), ends_R])


def through_columns(adj: CSR, col_of_C: Tensor, num_cols: int) -> CSR:
    """The forward-only CSR of `adj`'s edges whose column c has `col_of_C[c] >= 0`, at that
    column of `num_cols`: every row of `adj`, the kept edges in their order, by one gather of
    a per-column table and one mask over the edges (no sort, no row id per edge, no count
    over every edge). Index
    dtype as `CSR.from_coo` would pick it."""
    cols_E = col_of_C.index_select(0, adj.indices)
    kept_E = torch.nonzero(cols_E >= 0).squeeze(1)  # once for both arrays (a mask is a scan each)
    indptr = kept_row_pointers(adj.indptr, kept_E)
    cols_E, values_E = cols_E.index_select(0, kept_E), adj.values.index_select(0, kept_E)
    dtype = compact_index_dtype(indptr, cols_E, num_cols)
    return CSR.from_arrays(
        indptr, cols_E, values_E, num_cols, index_dtype=dtype, validate=False, transpose=False
    )


def columns_below(adj: CSR, num_cols: int) -> CSR:
    """The forward-only CSR of `adj`'s edges whose column is below `num_cols`, at their own
    columns: `through_columns` with the identity table on those columns, by one comparison
    per edge (no table to gather)."""
    kept_E = torch.nonzero(adj.indices < num_cols).squeeze(1)
    indptr = kept_row_pointers(adj.indptr, kept_E)
    cols_E, values_E = adj.indices.index_select(0, kept_E), adj.values.index_select(0, kept_E)
    dtype = compact_index_dtype(indptr, cols_E, num_cols)
    return CSR.from_arrays(
        indptr, cols_E, values_E, num_cols, index_dtype=dtype, validate=False, transpose=False
    )


def _check_index_arrays(indptr: Tensor, indices: Tensor) -> None:
    for name, t in (("indptr", indptr), ("indices", indices)):
        if t.dtype not in _INDEX_DTYPES or t.dim() != 1:
            raise KernelError(
                f"CSR {name} must be a 1-D int32 or int64 tensor, "
                f"got {t.dtype} of shape {tuple(t.shape)}"
            )


def compact_index_dtype(indptr: Tensor, indices: Tensor, num_cols: int) -> torch.dtype:
    """int32 when edges, rows and columns all fit in it, else int64."""
    largest = max(indices.shape[0], indptr.shape[0], num_cols)
    return torch.int32 if largest <= INT32_MAX else torch.int64


def _validate(indptr: Tensor, indices: Tensor, values: Tensor, num_cols: int) -> None:
    """Raise KernelError unless the arrays form a valid CSR matrix with num_cols columns."""
    num_edges = indices.shape[0]
    if indptr.shape[0] < 1 or int(indptr[0]) != 0 or int(indptr[-1]) != num_edges:
        raise KernelError(
            f"CSR indptr must start at 0 and end at the number of edges ({num_edges}); "
            f"got {indptr[:1].tolist()} ... {indptr[-1:].tolist()}"
        )
    if bool((indptr[1:] < indptr[:-1]).any()):
        raise KernelError("CSR indptr must be non-decreasing")
    if values.dim() != 1 or values.shape[0] != num_edges or not values.is_floating_point():
        raise KernelError(
            f"CSR values must be 1-D floating point with {num_edges} entries, "
            f"got {values.dtype} of shape {tuple(values.shape)}"
        )
    if num_edges > 0 and (int(indices.min()) < 0 or int(indices.max()) >= num_cols):
        raise KernelError(
            f"CSR indices must lie in [0, {num_cols}), "
            f"got [{int(indices.min())}, {int(indices.max())}]"
        )
