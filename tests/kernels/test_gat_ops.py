"""GAT's leo:: ops on the reference path: a dense oracle, opcheck, float64 gradcheck.

Graphs are small and random with empty rows, one huge row and duplicate (row, column) pairs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import random_csr
from leo_cli.kernels import gat_ops
from leo_cli.kernels.csr import row_of_edges

KINDS = {
    "empty_rows": {"empty_fraction": 0.4},
    "huge_row": {"huge_row_degree": 60},
    "duplicates": {"duplicate_fraction": 0.4},
}
HEADS, WIDTH, SLOPE = 3, 4, 0.2

cases = pytest.mark.parametrize("kind", sorted(KINDS))
index_cases = pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])


def make(kind: str, index_dtype: torch.dtype) -> kernels.CSR:
    return random_csr(
        11, 8, 30, seed=2, index_dtype=index_dtype, dtype=torch.float64, **KINDS[kind]
    )


def randn(*shape: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def dense_reference(csr: kernels.CSR, a_src: Tensor, a_dst: Tensor, x: Tensor) -> Tensor:
    """The layer by loops over rows and edges: scores, softmax per row and head, weighted sum."""
    out = x.new_zeros((csr.num_rows, HEADS, WIDTH))
    ptr, cols = csr.indptr.tolist(), csr.indices.tolist()
    for i in range(csr.num_rows):
        js = cols[ptr[i] : ptr[i + 1]]
        if not js:
            continue
        e = F.leaky_relu(a_src[js] + a_dst[i], SLOPE)  # (deg x H)
        alpha = torch.softmax(e, 0)
        out[i] = (alpha.unsqueeze(2) * x[js]).sum(0)
    return out


def layer(csr: kernels.CSR, a_src: Tensor, a_dst: Tensor, x: Tensor) -> Tensor:
    alpha = kernels.edge_softmax(csr, kernels.gat_scores(csr, a_src, a_dst, SLOPE))
    return kernels.gat_spmm(csr, alpha, x)


@cases
@index_cases
def test_ops_match_a_dense_loop(kind: str, index_dtype: torch.dtype) -> None:
    csr = make(kind, index_dtype)
    a_src, a_dst = randn(csr.num_cols, HEADS, seed=1), randn(csr.num_rows, HEADS, seed=2)
    x = randn(csr.num_cols, HEADS, WIDTH, seed=3)
    torch.testing.assert_close(layer(csr, a_src, a_dst, x), dense_reference(csr, a_src, a_dst, x))


def test_softmax_sums_to_one_per_row_and_head() -> None:
    csr = make("empty_rows", torch.int64)
    alpha = kernels.edge_softmax(csr, randn(csr.num_edges, HEADS, seed=4) * 30)
    sums = torch.zeros(csr.num_rows, HEADS, dtype=alpha.dtype)
    sums.index_add_(0, row_of_edges(csr.indptr), alpha)
    has_edges = (csr.indptr[1:] > csr.indptr[:-1]).unsqueeze(1).expand_as(sums)
    torch.testing.assert_close(sums[has_edges], torch.ones_like(sums[has_edges]))
    assert (sums[~has_edges] == 0).all() and has_edges.any() and (~has_edges).any()


@cases
@index_cases
def test_layer_gradcheck(kind: str, index_dtype: torch.dtype) -> None:
    csr = make(kind, index_dtype)
    inputs = (
        randn(csr.num_cols, HEADS, seed=1).requires_grad_(),
        randn(csr.num_rows, HEADS, seed=2).requires_grad_(),
        randn(csr.num_cols, HEADS, WIDTH, seed=3).requires_grad_(),
    )
    # fast_mode: the Jacobian against random vectors (a wrong gradient still fails), not
    # column by column (a minute per case on a loaded 2-core machine).
    assert torch.autograd.gradcheck(lambda s, d, x: layer(csr, s, d, x), inputs, fast_mode=True)


@pytest.mark.slow
@index_cases
def test_opcheck(index_dtype: torch.dtype) -> None:
    csr = make("duplicates", index_dtype)
    a_src = randn(csr.num_cols, HEADS, seed=1).requires_grad_()
    a_dst = randn(csr.num_rows, HEADS, seed=2).requires_grad_()
    scores = randn(csr.num_edges, HEADS, seed=5).requires_grad_()
    alpha = randn(csr.num_edges, HEADS, seed=6).requires_grad_()
    x = randn(csr.num_cols, HEADS, WIDTH, seed=3).requires_grad_()
    t = (csr.t_indptr, csr.t_indices, csr.t_perm)
    torch.library.opcheck(gat_ops.gat_scores, (csr.indptr, csr.indices, a_src, a_dst, SLOPE))
    torch.library.opcheck(gat_ops.edge_softmax, (csr.indptr, scores))
    torch.library.opcheck(gat_ops.gat_spmm, (csr.indptr, csr.indices, alpha, x, *t, csr.num_rows))


def test_float32_layer_matches_float64() -> None:
    csr = make("huge_row", torch.int64)
    args = (randn(csr.num_cols, HEADS, seed=1), randn(csr.num_rows, HEADS, seed=2))
    x = randn(csr.num_cols, HEADS, WIDTH, seed=3)
    ref = layer(csr, *args, x)
    got = layer(csr.with_values(csr.values.float()), *(a.float() for a in args), x.float())
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_refused() -> None:
    csr = make("duplicates", torch.int64)
    with pytest.raises(ValueError, match="a_src needs"):
        kernels.gat_scores(csr, randn(3, HEADS, seed=1), randn(csr.num_rows, HEADS, seed=2), 0.2)
    with pytest.raises(ValueError, match="alpha must have shape"):
        kernels.gat_spmm(csr, randn(2, HEADS, seed=1), randn(csr.num_cols, HEADS, 2, seed=2))
