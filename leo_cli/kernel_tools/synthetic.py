"""Random CSR matrices with the shapes that break sparse kernels, for tests and benchmarks.

The awkward cases are switched on by arguments: empty rows, one very long row (a hub node),
duplicate (row, column) pairs (which must be summed, not deduplicated), int32 or int64 indices.

Shape suffixes: R rows, C columns, E edges, F features.
"""

from __future__ import annotations

import torch
from torch import Tensor

from leo_cli.kernels.csr import CSR


def random_csr(
    num_rows: int,
    num_cols: int,
    num_edges: int,
    *,
    seed: int = 0,
    index_dtype: torch.dtype = torch.int64,
    dtype: torch.dtype = torch.float32,
    empty_fraction: float = 0.0,
    huge_row_degree: int = 0,
    duplicate_fraction: float = 0.0,
) -> CSR:
    """A random R x C CSR matrix with about num_edges edges and uniform(-1, 1) values.

    Args:
        num_rows: R.
        num_cols: C.
        num_edges: edges spread uniformly over the non-empty rows.
        seed: generator seed (the matrix is a pure function of the arguments).
        index_dtype: torch.int32 or torch.int64 for indptr/indices.
        dtype: dtype of the values.
        empty_fraction: share of rows that get no edges at all.
        huge_row_degree: extra edges on row R // 3 (a hub), 0 for none.
        duplicate_fraction: share of edges repeated with the same (row, column).
    """
    gen = torch.Generator().manual_seed(seed)
    rows_E, cols_E = _random_edges(num_rows, num_cols, num_edges, empty_fraction, gen)
    if huge_row_degree > 0 and num_rows > 0:
        hub_E = torch.full((huge_row_degree,), num_rows // 3, dtype=torch.int64)
        rows_E = torch.cat([rows_E, hub_E])
        cols_E = torch.cat([cols_E, torch.randint(0, num_cols, (huge_row_degree,), generator=gen)])
    rows_E, cols_E = _add_duplicates(rows_E, cols_E, duplicate_fraction, gen)
    values_E = torch.rand(rows_E.shape[0], generator=gen, dtype=torch.float64) * 2 - 1
    return CSR.from_coo(
        rows_E, cols_E, values_E.to(dtype), num_rows, num_cols, index_dtype=index_dtype
    )


def _random_edges(
    num_rows: int, num_cols: int, num_edges: int, empty_fraction: float, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """(rows_E, cols_E) int64, uniform over the rows that are allowed edges."""
    if num_rows == 0 or num_cols == 0 or num_edges == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty.clone()
    num_full = max(1, round(num_rows * (1.0 - empty_fraction)))
    full_rows = torch.randperm(num_rows, generator=gen)[:num_full]
    rows_E = full_rows[torch.randint(0, num_full, (num_edges,), generator=gen)]
    cols_E = torch.randint(0, num_cols, (num_edges,), generator=gen)
    return rows_E, cols_E


def _add_duplicates(
    rows_E: Tensor, cols_E: Tensor, fraction: float, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Append copies of a random `fraction` of the edges."""
    num_dup = int(rows_E.shape[0] * fraction)
    if num_dup == 0:
        return rows_E, cols_E
    pick = torch.randint(0, rows_E.shape[0], (num_dup,), generator=gen)
    return torch.cat([rows_E, rows_E[pick]]), torch.cat([cols_E, cols_E[pick]])


def split_local_remote(csr: CSR, num_local_cols: int) -> tuple[CSR, CSR]:
    """Split columns into [0, num_local_cols) (local) and the rest (remote, renumbered from 0).

    The two halves have the rows of `csr`; local @ x[:L] + remote @ x[L:] equals csr @ x.
    """
    rows_E = torch.repeat_interleave(
        torch.arange(csr.num_rows), (csr.indptr[1:] - csr.indptr[:-1]).long()
    )
    cols_E = csr.indices.long()
    is_local = cols_E < num_local_cols
    index_dtype = csr.indices.dtype
    local = CSR.from_coo(
        rows_E[is_local],
        cols_E[is_local],
        csr.values[is_local],
        csr.num_rows,
        num_local_cols,
        index_dtype=index_dtype,
    )
    remote = CSR.from_coo(
        rows_E[~is_local],
        cols_E[~is_local] - num_local_cols,
        csr.values[~is_local],
        csr.num_rows,
        csr.num_cols - num_local_cols,
        index_dtype=index_dtype,
    )
    return local, remote


def power_law_csr(
    num_rows: int,
    num_cols: int,
    num_edges: int,
    *,
    exponent: float = 1.0,
    seed: int = 0,
    index_dtype: torch.dtype = torch.int64,
    dtype: torch.dtype = torch.float32,
) -> CSR:
    """A CSR matrix whose row and column degrees follow a power law (Zipf, `exponent`).

    Node k (in a random order) is drawn with probability proportional to (k + 1)^-exponent, for
    both ends of every edge, so a few rows (and columns, the hubs of the backward pass) hold
    tens of thousands of edges, as in social and web graphs.
    """
    gen = torch.Generator().manual_seed(seed)
    rows_E = _zipf_draws(num_rows, num_edges, exponent, gen)
    cols_E = _zipf_draws(num_cols, num_edges, exponent, gen)
    values_E = torch.rand(num_edges, generator=gen, dtype=torch.float64) * 2 - 1
    return CSR.from_coo(
        rows_E, cols_E, values_E.to(dtype), num_rows, num_cols, index_dtype=index_dtype
    )


def _zipf_draws(num_nodes: int, count: int, exponent: float, gen: torch.Generator) -> Tensor:
    """count node ids in [0, num_nodes), Zipf-distributed over a random node order."""
    if num_nodes == 0 or count == 0:
        return torch.zeros(0, dtype=torch.int64)
    weights = torch.arange(1, num_nodes + 1, dtype=torch.float64).pow(-exponent)
    ranks = torch.multinomial(weights, count, replacement=True, generator=gen)
    return torch.randperm(num_nodes, generator=gen)[ranks]
