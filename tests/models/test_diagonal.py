"""GCN's self-loops on the CSR's diagonal: the same matrix as the adjacency plus diag(s),
columns still in order, for any row (empty, all columns below or above its own, halo ones)."""

from __future__ import annotations

import numpy as np
import torch

from leo_cli.kernels.csr import row_of_edges
from leo_cli.models.local_graph import with_diagonal


def test_with_diagonal_adds_each_rows_own_entry_in_column_order() -> None:
    rng = np.random.default_rng(0)
    n, cols = 40, 70  # 40 inner rows, 30 halo columns
    dense = (rng.random((n, cols)) < 0.15) * rng.random((n, cols))
    dense[:, :n][np.eye(n, dtype=bool)] = 0  # no explicit self-loops here
    dense[3] = 0  # a row without edges
    dense[5, 6:] = 0  # only columns below its own
    dense[7, :8] = 0  # only columns above its own
    rows, cols_E = np.nonzero(dense)  # row-major: columns increasing within a row
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]))
    indices = torch.from_numpy(cols_E.astype(np.int32))
    values = torch.from_numpy(dense[rows, cols_E])
    diag = torch.from_numpy(rng.random(n) + 1)
    new_ptr, new_idx, new_val = with_diagonal(indptr, indices, values, diag)
    assert new_idx.dtype == torch.int32 and new_ptr.dtype == indptr.dtype
    got = np.zeros((n, cols))
    got[row_of_edges(new_ptr).numpy(), new_idx.long().numpy()] = new_val.numpy()
    expected = dense.copy()
    expected[:, :n] += np.diag(diag.numpy())
    np.testing.assert_array_equal(got, expected)
    rows_E = row_of_edges(new_ptr)
    same_row = rows_E[1:] == rows_E[:-1]
    assert bool((new_idx[1:].long() > new_idx[:-1].long())[same_row].all())
