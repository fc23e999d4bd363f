"""Column blocks of a CSR add up to the whole SpMM, forward and backward."""

from __future__ import annotations

import pytest
import torch

from leo_cli import kernels
from leo_cli.comm import blocks
from leo_cli.comm.blocks import (
    column_block,
    forward_only,
    selected_columns_block,
)
from leo_cli.comm.exchange import chunk_bounds, distinct_rows
from leo_cli.comm.inplace import owners_in_place
from leo_cli.errors import KernelError


def random_csr(rows: int, cols: int, edges: int, seed: int) -> kernels.CSR:
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, rows, (edges,), generator=gen)
    c = torch.randint(0, cols, (edges,), generator=gen)
    v = torch.rand(edges, generator=gen, dtype=torch.float64)
    return kernels.CSR.from_coo(r, c, v, rows, cols)


@pytest.mark.parametrize("bounds", [[0, 10, 25, 40], [0, 40], [0, 0, 13, 13, 40]])
def test_blocks_sum_to_the_whole_product(bounds: list[int]) -> None:
    adj = random_csr(30, 40, 200, seed=1)
    x = torch.randn(40, 5, dtype=torch.float64)
    grad = torch.randn(30, 5, dtype=torch.float64)
    out = torch.zeros(30, 5, dtype=torch.float64)
    grad_x = torch.zeros(40, 5, dtype=torch.float64)
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        block = column_block(adj, lo, hi, compact=lo > 0)
        block.add_into(out, x[lo:hi])
        grad_x[lo:hi] = block.backward(grad)
        if block.rows_R is not None:  # compact blocks keep only the rows that read them
            assert block.fwd.num_rows == int(torch.unique(block.rows_R).numel())
    dense = adj.to_dense()
    torch.testing.assert_close(out, dense @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_x, dense.t() @ grad, rtol=1e-12, atol=1e-12)


def test_compact_block_of_unread_columns_is_empty() -> None:
    adj = kernels.CSR.from_coo(
        torch.tensor([0, 2]), torch.tensor([0, 1]), torch.ones(2), num_rows=3, num_cols=4
    )
    block = column_block(adj, 2, 4, compact=True)
    assert block.num_edges == 0 and block.fwd.num_rows == 0
    out = torch.zeros(3, 2)
    block.add_into(out, torch.ones(2, 2))
    assert not out.any()
    assert block.backward(torch.ones(3, 2)).shape == (2, 2)


@pytest.mark.parametrize(("rows", "chunks"), [(10, 3), (2, 7), (0, 2), (5, 1)])
def test_chunk_bounds_cover_every_row_once(rows: int, chunks: int) -> None:
    b = chunk_bounds(rows, chunks)
    assert len(b) == chunks + 1 and b[0] == 0 and b[-1] == rows
    assert all(lo <= hi for lo, hi in zip(b, b[1:], strict=False))
    assert max(hi - lo for lo, hi in zip(b, b[1:], strict=False)) <= -(-rows // chunks)


def test_blocks_keep_no_permutation_and_refuse_the_ops_backward() -> None:
    adj = random_csr(30, 40, 200, seed=2)
    block = column_block(adj, 10, 40, compact=True)
    assert block.fwd.t_perm.numel() == 0 and block.bwd.t_perm.numel() == 0
    assert block.rows_R is not None and block.rows_R.dtype == torch.int32
    x = torch.randn(30, 3, dtype=torch.float64, requires_grad=True)
    out = block.forward(x)  # forward runs without the permutation...
    with pytest.raises(RuntimeError, match="without its edge permutation"):
        out.sum().backward()  # ... a gradient through the op would gather wrong values
    # The block's own backward (its transpose's forward) is what serves gradients.
    grad = block.backward(torch.ones(30, 3, dtype=torch.float64))
    torch.testing.assert_close(grad, adj.to_dense()[:, 10:].t() @ torch.ones(30, 3).double())
    with pytest.raises(KernelError, match="forward-only"):
        block.fwd.transpose()  # values[t_perm] would be empty against every edge


@pytest.mark.parametrize("scan_share", [0.0, 2.0])
@pytest.mark.parametrize("compact", [False, True])
def test_blocks_without_transpose_hold_the_same_forward(
    compact: bool, scan_share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`transpose=False` (an aggregator whose backward reads gradients as rows) builds the
    same forward CSR, from a CSR with its transpose (edges found by a scan or by their
    sorted positions: `scan_share`) or without, and no transpose at all: its backward
    refuses."""
    monkeypatch.setattr(blocks, "SCAN_SHARE", scan_share)
    torch.manual_seed(1)
    for _ in range(10):
        adj = random_adjacency(60, 1, 400)
        bare = kernels.CSR.from_arrays(adj.indptr, adj.indices, adj.values, adj.num_cols,
                                       transpose=False)  # fmt: skip
        assert bare.t_indptr.numel() == bare.t_indices.numel() == bare.t_perm.numel() == 0
        n, c = adj.num_rows, adj.num_cols
        for start, end in [(0, n), (n, c), (n // 2, c), (3, 3), (0, c)]:
            start, end = min(start, c), min(end, c)
            want = column_block(adj, start, end, compact=compact)
            for source in (adj, bare):
                got = column_block(source, start, end, compact=compact, transpose=False)
                assert got.bwd is None and (got.col_start, got.col_end) == (start, end)
                assert got.fwd.t_indptr.numel() == got.fwd.t_indices.numel() == 0
                assert (got.rows_R is None) == (want.rows_R is None)
                assert got.rows_R is None or torch.equal(got.rows_R, want.rows_R)
                for name in ("indptr", "indices", "values"):
                    assert torch.equal(getattr(got.fwd, name), getattr(want.fwd, name)), name
                assert got.fwd.max_degree == want.fwd.max_degree
    with pytest.raises(AssertionError, match="forward-only block"):
        got.backward(torch.ones(got.fwd.num_rows, 2, dtype=torch.float64))


def test_from_coo_refuses_rows_said_sorted_that_are_not() -> None:
    rows, cols = torch.tensor([0, 2, 1]), torch.tensor([1, 0, 2])
    with pytest.raises(KernelError, match="rows out of order"):
        kernels.CSR.from_coo(rows, cols, None, 3, 3, rows_sorted=True)
    csr = kernels.CSR.from_coo(rows, cols, None, 3, 3)
    ordered = kernels.CSR.from_coo(
        rows.sort().values, cols[rows.argsort()], None, 3, 3, rows_sorted=True
    )
    assert torch.equal(csr.to_dense(), ordered.to_dense())


def test_whole_csr_block_shares_the_csrs_arrays() -> None:
    adj = random_csr(30, 30, 200, seed=3)
    block = column_block(adj, 0, 30, compact=False)
    for name in ("indptr", "indices", "values", "t_indptr", "t_indices"):
        assert getattr(block.fwd, name) is getattr(adj, name)
    rebuilt = column_block(adj, 0, 29, compact=False)  # a strict sub-block is rebuilt
    assert rebuilt.fwd.indices is not adj.indices
    x = torch.randn(30, 4, dtype=torch.float64)
    torch.testing.assert_close(block.forward(x), adj.to_dense() @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("index_dtype", [None, torch.int64])
def test_inner_block_keeps_none_of_the_parts_transpose(index_dtype: torch.dtype | None) -> None:
    """The inner block of a CSR with halo columns takes its transpose from the part's, in
    arrays of its own (a slice would keep the part's whole transposed index alive), equal
    to the sorted construction's."""
    torch.manual_seed(2)
    adj = random_adjacency(60, 5, 400, index_dtype)
    block = column_block(adj, 0, adj.num_rows, compact=False)
    assert block.bwd is not None
    held = {t.untyped_storage().data_ptr() for t in (adj.t_indptr, adj.t_indices, adj.t_perm)}
    for csr in (block.fwd, block.bwd):
        for name in ("indptr", "indices", "values", "t_indptr", "t_indices"):
            t = getattr(csr, name)
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
            assert t.numel() == 0 or t.untyped_storage().data_ptr() not in held, name
    assert_same_block(block, column_block(forward_only(adj), 0, adj.num_rows, compact=False))


def random_adjacency(
    max_rows: int, min_extra_cols: int, max_edges: int, index_dtype: torch.dtype | None = None
) -> kernels.CSR:
    """A CSR of random size (more columns than rows: halo columns), edges and float64 values,
    from torch's global generator (the test seeds it); `index_dtype` as `from_coo` takes it."""
    num_rows = int(torch.randint(1, max_rows, ()))
    num_cols = num_rows + int(torch.randint(min_extra_cols, 40, ()))
    num_edges = int(torch.randint(0, max_edges, ()))
    rows = torch.randint(0, num_rows, (num_edges,))
    cols = torch.randint(0, num_cols, (num_edges,))
    values = torch.randn(num_edges, dtype=torch.float64)
    return kernels.CSR.from_coo(rows, cols, values, num_rows, num_cols, index_dtype=index_dtype)


def assert_same_block(a: blocks.ColumnBlock, b: blocks.ColumnBlock) -> None:
    assert (a.rows_R is None) == (b.rows_R is None)
    assert a.rows_R is None or (
        a.rows_R.dtype == b.rows_R.dtype and torch.equal(a.rows_R, b.rows_R)
    )
    assert (a.col_start, a.col_end) == (b.col_start, b.col_end)
    for x, y in ((a.fwd, b.fwd), (a.bwd, b.bwd)):
        for name in ("indptr", "indices", "values", "t_indptr", "t_indices", "t_perm"):
            tx, ty = getattr(x, name), getattr(y, name)
            assert tx.dtype == ty.dtype and torch.equal(tx, ty), name
        shape_x = (x.num_rows, x.num_cols, x.max_degree, x.t_max_degree)
        assert shape_x == (y.num_rows, y.num_cols, y.max_degree, y.t_max_degree)


@pytest.mark.slow
@pytest.mark.parametrize("index_dtype", [None, torch.int64])
@pytest.mark.parametrize("scan_share", [0.0, 2.0])
@pytest.mark.parametrize("compact", [False, True])
def test_blocks_sliced_from_the_transpose_equal_sorted_ones(
    compact: bool,
    scan_share: float,
    index_dtype: torch.dtype | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block of a CSR with its transpose takes its own from adj's rows (no sort) and
    finds its edges by a scan (`scan_share` 0: always) or by sorting their positions (2:
    a scan only without edges); every array, dtype and degree equals the block built by
    sorting its edges (a forward-only CSR's path), for empty, partial and full column ranges
    of int32 (compact) and int64 CSRs."""
    monkeypatch.setattr(blocks, "SCAN_SHARE", scan_share)
    torch.manual_seed(0)
    for _ in range(20):
        adj = random_adjacency(60, 1, 400, index_dtype)
        num_rows, num_cols = adj.num_rows, adj.num_cols
        for start, end in [(0, num_rows), (num_rows, num_cols), (num_rows // 2, num_cols), (3, 3)]:
            start, end = min(start, num_cols), min(end, num_cols)
            a = column_block(adj, start, end, compact=compact)
            assert_same_block(a, column_block(forward_only(adj), start, end, compact=compact))


@pytest.mark.slow
@pytest.mark.parametrize("index_dtype", [None, torch.int64])
def test_selected_columns_from_the_transpose_equal_sorted_ones(
    index_dtype: torch.dtype | None,
) -> None:
    """Selected columns (replicas, rows read in place) of a CSR with its transpose take the
    block's transpose from adj's (no sort): the same arrays as a forward-only CSR's block,
    which sorts its edges; and the block's product is the dense one's columns."""
    torch.manual_seed(1)
    for _ in range(20):
        adj = random_adjacency(60, 0, 400, index_dtype)
        num_rows, num_cols = adj.num_rows, adj.num_cols
        for share in (0.0, 0.3, 1.0):
            cols_C = torch.nonzero(torch.rand(num_cols) < share).squeeze(1)
            a = selected_columns_block(adj, cols_C)
            assert_same_block(a, selected_columns_block(forward_only(adj), cols_C))
            x = torch.randn(cols_C.shape[0], 3, dtype=torch.float64)
            out = torch.zeros(num_rows, 3, dtype=torch.float64)
            a.add_into(out, x)
            dense = adj.to_dense()[:, cols_C]
            torch.testing.assert_close(out, dense @ x, rtol=1e-12, atol=1e-12)
            grad = torch.randn(num_rows, 3, dtype=torch.float64)
            torch.testing.assert_close(a.backward(grad), dense.t() @ grad, rtol=1e-12, atol=1e-12)


def test_rows_read_in_place_equal_their_sorted_construction() -> None:
    """Every owner's in-place CSR (every row, columns at the owner's published positions, in
    any order), made in one pass over the part's edges for all owners, has the arrays the
    sorting construction gives from that owner's column block, forward only; its product
    reads the published rows as the block reads its columns."""
    torch.manual_seed(2)
    for index_dtype in (None, torch.int64):
        for _ in range(3):
            adj = random_adjacency(50, 1, 300, index_dtype)
            n, num_rows, num_halo = adj.num_rows, adj.num_rows, adj.num_cols - adj.num_rows
            rows_H = torch.nonzero(torch.rand(num_halo) < 0.5).squeeze(1)
            cut = sorted(torch.randint(0, num_halo + 1, (2,)).tolist())  # 3 owners' halo spans
            owner_R = torch.bucketize(rows_H, torch.tensor(cut), right=True)
            position_R = torch.empty_like(rows_H)
            published_rows = {}
            for q in range(3):
                at = owner_R == q
                count = int(at.sum())
                published = 3 * count + 2
                position_R[at] = torch.randperm(published)[:count]  # distinct, any order
                published_rows[q] = published
            reads = owners_in_place(adj, n, rows_H, owner_R, position_R, published_rows)
            assert [r.owner for r in reads] == sorted(published_rows)
            for read in reads:
                q = read.owner
                cols_C = rows_H[owner_R == q] + n
                block = selected_columns_block(adj, cols_C)
                assert block.rows_R is not None
                counts = torch.diff(block.fwd.indptr.long())
                rows_E = torch.repeat_interleave(block.rows_R.long(), counts)
                sorted_twin = kernels.CSR.from_coo(
                    rows_E, read.positions_C[block.fwd.indices.long()], block.fwd.values,
                    num_rows, published_rows[q], rows_sorted=True, transpose=False,
                )  # fmt: skip
                twin = read.in_place
                for name in ("indptr", "indices", "values"):
                    a, b = getattr(twin, name), getattr(sorted_twin, name)
                    assert a.dtype == b.dtype and torch.equal(a, b), name
                assert twin.max_degree == sorted_twin.max_degree
                assert twin.t_indices.numel() == 0 and twin.t_perm.numel() == 0
                x = torch.randn(published_rows[q], 2, dtype=torch.float64)
                out = torch.zeros(num_rows, 2, dtype=torch.float64)
                block.add_into(out, x[read.positions_C])
                torch.testing.assert_close(kernels.spmm(twin, x), out, rtol=1e-12, atol=1e-12)


def test_distinct_rows_are_uniques_values() -> None:
    torch.manual_seed(3)
    for size in (0, 1, 50):
        rows = torch.randint(0, max(size, 1), (size * 2,))
        assert torch.equal(distinct_rows(rows, max(size, 1)), torch.unique(rows))


def test_a_view_of_l2_rows_is_the_one_remap_halo_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward-only view whose halo rows are L2 (the others left out: replicas, rows read
    in place) built through a column table (`l2_view`, `level_view`'s path for it) has the
    arrays `remap_halo` builds from `view_layout`, and the same halo rows."""
    from leo_cli.comm import views
    from leo_cli.comm.exchange import HaloPlan

    monkeypatch.setattr(views, "remap_plan", lambda plan, rows_K: rows_K)  # no collective
    torch.manual_seed(4)
    for index_dtype in (None, torch.int64):
        for _ in range(3):
            adj = random_adjacency(50, 1, 300, index_dtype)
            n, num_halo = adj.num_rows, adj.num_cols - adj.num_rows
            cut = sorted(torch.randint(0, num_halo + 1, (2,)).tolist())  # 3 owners' halo spans
            recv = [cut[0], cut[1] - cut[0], num_halo - cut[1]]
            plan = HaloPlan(n, torch.empty(0, dtype=torch.int64), [0, 0, 0], recv)
            choice = torch.tensor([views.L1, views.L2, views.IN_PLACE])
            level_H = choice[torch.randint(0, 3, (num_halo,))]
            rows_K, edge_cols = views.view_layout(adj, plan, level_H)
            want, want_rows = views.remap_halo(adj, plan, rows_K, edge_cols, transpose=False)
            got, got_rows = views.level_view(adj, plan, level_H, transpose=False)
            assert torch.equal(got_rows, want_rows)  # type: ignore[arg-type]
            for name in ("indptr", "indices", "values", "t_indptr", "t_indices", "t_perm"):
                a, b = getattr(got, name), getattr(want, name)
                assert a.dtype == b.dtype and torch.equal(a, b), name
            assert (got.num_rows, got.num_cols, got.max_degree) == (
                want.num_rows, want.num_cols, want.max_degree,
            )  # fmt: skip
            assert got.t_indptr.numel() == 0  # forward-only, as asked
