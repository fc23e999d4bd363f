"""The leo:: ops on the reference path: dense parity, opcheck, gradcheck, torch.compile, API.

Graphs are small and random, with the shapes that break sparse kernels: empty rows, one huge
row, duplicate (row, column) pairs, int32 and int64 indices.
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from leo_cli import kernels
from leo_cli.cli.app import app
from leo_cli.errors import KernelError
from leo_cli.kernel_tools.synthetic import power_law_csr, random_csr, split_local_remote
from leo_cli.kernels import backend, ops
from leo_cli.kernels.backend import Backend, select_backend

KINDS = {
    "empty_rows": {"empty_fraction": 0.4},
    "huge_row": {"huge_row_degree": 60},
    "duplicates": {"duplicate_fraction": 0.4},
}
INDEX_DTYPES = [torch.int32, torch.int64]


def make_csr(
    kind: str, index_dtype: torch.dtype, dtype: torch.dtype = torch.float64, seed: int = 0
) -> kernels.CSR:
    return random_csr(11, 8, 30, seed=seed, index_dtype=index_dtype, dtype=dtype, **KINDS[kind])


def features(rows: int, width: int, dtype: torch.dtype = torch.float64, seed: int = 1) -> Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def op_args(csr: kernels.CSR, x: Tensor) -> tuple[Any, ...]:
    return (
        csr.indptr,
        csr.indices,
        csr.values,
        x,
        csr.t_indptr,
        csr.t_indices,
        csr.t_perm,
        csr.num_rows,
    )


graph_cases = pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=["int32", "int64"])
kind_cases = pytest.mark.parametrize("kind", sorted(KINDS))


# --- CSR ---------------------------------------------------------------------------------------


@kind_cases
@graph_cases
def test_transpose_matches_dense(kind: str, index_dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype)
    assert csr.indices.dtype == csr.t_indices.dtype == index_dtype
    assert csr.t_perm.dtype == csr.transpose().t_perm.dtype == index_dtype
    assert torch.equal(csr.transpose().to_dense(), csr.to_dense().T)
    assert torch.equal(csr.transpose().transpose().to_dense(), csr.to_dense())


@kind_cases
@graph_cases
def test_a_kept_transpose_is_the_one_a_sort_builds(kind: str, index_dtype: torch.dtype) -> None:
    """Edges dropped and columns renumbered in order (as comm/views.py remap_halo does): the
    transpose read off the original's equals the stable sort's, array for array."""
    from leo_cli.kernels.csr import build_transpose, kept_transpose, row_of_edges

    csr = make_csr(kind, index_dtype)  # 8 columns
    g = torch.Generator().manual_seed(3)
    keep_E = torch.rand(csr.num_edges, generator=g) < 0.7
    new_of = torch.tensor([0, 1, 1, 2, 4, 5, 6, 7])  # old 2 dropped, a gap at new 3
    old_E = csr.indices.long()
    # one new column per old column here (a shared new column would mix two old ones)
    keep_E &= old_E != 2
    cols_E = new_of[old_E].to(index_dtype)
    made = kept_transpose(csr, keep_E, cols_E, 8)
    assert made is not None
    rows = row_of_edges(csr.indptr)[keep_E]
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(
        torch.bincount(rows, minlength=csr.num_rows), 0)])  # fmt: skip
    want = build_transpose(indptr.to(index_dtype), cols_E[keep_E], 8)
    for got, expected in zip(made, want, strict=True):
        assert torch.equal(got.long(), expected.long())
    # a column order that is not kept: None (the caller sorts)
    backwards = (7 - old_E).to(index_dtype)
    assert kept_transpose(csr, keep_E, backwards, 8) is None
    # two old columns into one new column: fine while the slots come in edge order, else None
    crossed = kernels.CSR.from_arrays(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), num_cols=2)
    straight = kernels.CSR.from_arrays(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), num_cols=2)
    one, zeros = torch.ones(2, dtype=torch.bool), torch.zeros(2, dtype=crossed.indices.dtype)
    assert kept_transpose(crossed, one, zeros, 1) is None  # the sort puts row 0 first
    made = kept_transpose(straight, one, zeros, 1)
    assert made is not None and made[1].tolist() == [0, 1] and made[2].tolist() == [0, 1]
    forward_only = kernels.CSR.from_arrays(csr.indptr, csr.indices, num_cols=8, transpose=False)
    assert kept_transpose(forward_only, keep_E, cols_E, 8) is None


@kind_cases
@graph_cases
def test_columns_through_a_table_are_the_masked_edges(kind: str, index_dtype: torch.dtype) -> None:
    """`through_columns` keeps the edges whose column the table maps, at the mapped column,
    in their order: the arrays `from_coo` builds from the same edges (forward-only), and
    `kept_row_pointers` finds their rows' pointers; none kept and every one kept too."""
    from leo_cli.kernels.csr import kept_row_pointers, row_of_edges, through_columns

    csr = make_csr(kind, index_dtype)  # 8 columns, mapped into 8
    g = torch.Generator().manual_seed(5)
    rows_E = row_of_edges(csr.indptr)
    for table in (
        torch.tensor([3, -1, 0, -1, 2, 1, -1, 4]),
        torch.full((8,), -1),
        torch.arange(8).flip(0),
        torch.randint(-1, 5, (8,), generator=g),
    ):
        col_of_C = table.to(index_dtype)
        cols_E = col_of_C[csr.indices.long()]
        keep_E = cols_E >= 0
        want = kernels.CSR.from_coo(
            rows_E[keep_E], cols_E[keep_E], csr.values[keep_E], csr.num_rows, 8,
            rows_sorted=True, transpose=False,
        )  # fmt: skip
        got = through_columns(csr, col_of_C, 8)
        for name in ("indptr", "indices", "values", "t_indptr", "t_indices", "t_perm"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        assert (got.num_rows, got.num_cols, got.max_degree) == (csr.num_rows, 8, want.max_degree)
        counts = torch.bincount(rows_E[keep_E], minlength=csr.num_rows)
        pointers = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        kept = kept_row_pointers(csr.indptr, torch.nonzero(keep_E).squeeze(1))
        assert kept.dtype == torch.int64 and torch.equal(kept, pointers)


@kind_cases
@graph_cases
def test_columns_below_a_bound_are_those_an_identity_table_keeps(
    kind: str, index_dtype: torch.dtype
) -> None:
    """`columns_below` gives the arrays `through_columns` gives with the identity table on the
    columns below the bound (and -1 past it): none, some and every column kept."""
    from leo_cli.kernels.csr import columns_below, through_columns

    csr = make_csr(kind, index_dtype)  # 8 columns
    for bound in (0, 3, 8):
        table = torch.where(torch.arange(8) < bound, torch.arange(8), -1).to(index_dtype)
        want, got = through_columns(csr, table, bound), columns_below(csr, bound)
        for name in ("indptr", "indices", "values", "t_indptr", "t_indices", "t_perm"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        assert (got.num_rows, got.num_cols) == (csr.num_rows, bound)
        assert got.max_degree == want.max_degree


def test_default_index_dtype_is_compact_and_explicit_is_kept() -> None:
    indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1])
    compact = kernels.CSR.from_arrays(indptr, indices, num_cols=2)
    # t_perm too: an int64 permutation alone was 8 of the 20 bytes per edge of a compact CSR.
    assert compact.indices.dtype == compact.t_perm.dtype == torch.int32
    kept = kernels.CSR.from_arrays(indptr, indices, num_cols=2, index_dtype=torch.int64)
    assert kept.indptr.dtype == kept.t_indptr.dtype == torch.int64


@pytest.mark.parametrize(
    ("indptr", "indices", "values", "match"),
    [
        ([0, 2, 1, 3], [0, 1, 2], None, "non-decreasing"),
        ([1, 2, 3], [0, 1], None, "start at 0"),
        ([0, 1, 2], [0, 5], None, r"lie in \[0, 3\)"),
        ([0, 1, 2], [0, 1], [1.0], "values"),
    ],
)
def test_invalid_csr_is_refused(
    indptr: list[int], indices: list[int], values: list[float] | None, match: str
) -> None:
    vals = None if values is None else torch.tensor(values)
    with pytest.raises(KernelError, match=match):
        kernels.CSR.from_arrays(torch.tensor(indptr), torch.tensor(indices), vals, num_cols=3)


def test_csr_records_max_degrees_once_and_transpose_swaps_them() -> None:
    # Rows of degree 2, 0, 3; columns 0..2 read by 2, 2, 1 edges.
    csr = kernels.CSR.from_arrays(torch.tensor([0, 2, 2, 5]), torch.tensor([0, 1, 0, 2, 1]))
    assert (csr.max_degree, csr.t_max_degree) == (3, 2)
    assert csr.transpose().max_degree == csr.t_max_degree
    assert csr.transpose().t_max_degree == csr.max_degree
    hub = random_csr(50, 40, 100, seed=2, huge_row_degree=500)
    assert hub.max_degree >= 500 and hub.to("cpu").max_degree == hub.max_degree
    assert hub.with_values(hub.values * 2).max_degree == hub.max_degree


def test_power_law_graph_has_hub_rows_and_columns() -> None:
    csr = power_law_csr(2000, 1000, 20_000, seed=3, index_dtype=torch.int32)
    assert csr.num_edges == 20_000 and csr.indices.dtype == torch.int32
    mean = csr.num_edges / csr.num_rows
    assert csr.max_degree > 50 * mean and csr.t_max_degree > 50 * csr.num_edges / csr.num_cols
    assert csr.max_degree == power_law_csr(2000, 1000, 20_000, seed=3).max_degree  # seeded


def test_float_indices_are_refused() -> None:
    with pytest.raises(KernelError, match="int32 or int64"):
        kernels.CSR.from_arrays(torch.tensor([0.0, 1.0]), torch.tensor([0]), num_cols=1)


# --- spmm --------------------------------------------------------------------------------------


@kind_cases
@graph_cases
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmm_matches_dense(kind: str, index_dtype: torch.dtype, dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype, dtype)
    x = features(csr.num_cols, 5, dtype)
    expected = csr.to_dense().double() @ x.double()
    torch.testing.assert_close(kernels.spmm(csr, x).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@kind_cases
@graph_cases
def test_spmm_gradcheck(kind: str, index_dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype)
    values = csr.values.clone().requires_grad_()
    x = features(csr.num_cols, 3).requires_grad_()
    fn = lambda v, x: kernels.spmm(csr.with_values(v), x)  # noqa: E731
    # Full Jacobians once (int64); random projections elsewhere keep the suite fast.
    assert torch.autograd.gradcheck(fn, (values, x), fast_mode=index_dtype == torch.int32)


def test_spmm_gradgradcheck() -> None:
    csr = make_csr("duplicates", torch.int32)
    values = csr.values.clone().requires_grad_()
    x = features(csr.num_cols, 3).requires_grad_()
    fn = lambda v, x: kernels.spmm(csr.with_values(v), x)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (values, x), fast_mode=True)


def test_spmm_edge_cases_no_edges_no_rows_no_width() -> None:
    empty = kernels.CSR.from_arrays(
        torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.long), num_cols=2
    )
    assert torch.equal(kernels.spmm(empty, torch.ones(2, 3)), torch.zeros(3, 3))
    no_rows = kernels.CSR.from_arrays(
        torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long), num_cols=2
    )
    assert kernels.spmm(no_rows, torch.ones(2, 3)).shape == (0, 3)
    csr = make_csr("huge_row", torch.int64, torch.float32)
    assert kernels.spmm(csr, torch.ones(csr.num_cols, 0)).shape == (csr.num_rows, 0)


def test_spmm_casts_values_to_feature_dtype_and_keeps_their_gradient() -> None:
    csr = make_csr("duplicates", torch.int64, torch.float32)
    values = csr.values.clone().requires_grad_()
    out = kernels.spmm(csr.with_values(values), features(csr.num_cols, 4, torch.float64))
    assert out.dtype == torch.float64
    out.sum().backward()
    assert values.grad is not None and values.grad.dtype == torch.float32


def test_spmm_bfloat16_accumulates_in_float32() -> None:
    csr = random_csr(40, 30, 2000, seed=3, dtype=torch.bfloat16, huge_row_degree=500)
    x = features(csr.num_cols, 16, torch.bfloat16)
    exact = csr.with_values(csr.values.double()).to_dense() @ x.double()
    out = kernels.spmm(csr, x)
    assert out.dtype == torch.bfloat16
    # One rounding to bfloat16 (relative 2**-8) plus float32 accumulation error.
    torch.testing.assert_close(out.double(), exact, rtol=2**-8, atol=1e-4)


def test_spmm_rejects_mismatched_operand() -> None:
    csr = make_csr("empty_rows", torch.int64)
    with pytest.raises(ValueError, match="shape"):
        kernels.spmm(csr, features(csr.num_cols + 1, 2))


@pytest.mark.slow
def test_spmm_traces_under_torch_compile_fullgraph() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32)
    x = features(csr.num_cols, 4, torch.float32).requires_grad_()
    compiled = torch.compile(
        lambda x: kernels.spmm(csr, x).relu(), fullgraph=True, backend="aot_eager"
    )
    out = compiled(x)
    out.sum().backward()
    assert x.grad is not None
    grad_compiled = x.grad.clone()
    x.grad = None
    kernels.spmm(csr, x).relu().sum().backward()
    torch.testing.assert_close(out, kernels.spmm(csr, x).relu())
    torch.testing.assert_close(grad_compiled, x.grad)


# --- sddmm, gather, scatter ----------------------------------------------------------------


@graph_cases
def test_sddmm_matches_edge_dot_products_and_gradchecks(index_dtype: torch.dtype) -> None:
    csr = make_csr("duplicates", index_dtype)
    a = features(csr.num_rows, 3, seed=4).requires_grad_()
    b = features(csr.num_cols, 3, seed=5).requires_grad_()
    rows = torch.repeat_interleave(
        torch.arange(csr.num_rows), (csr.indptr[1:] - csr.indptr[:-1]).long()
    )
    expected = (a[rows] * b[csr.indices.long()]).sum(1)
    torch.testing.assert_close(kernels.sddmm(csr, a, b), expected)
    assert torch.autograd.gradcheck(lambda a, b: kernels.sddmm(csr, a, b), (a, b), fast_mode=True)


@graph_cases
def test_gather_and_scatter_add_rows(index_dtype: torch.dtype) -> None:
    x = features(6, 3).requires_grad_()
    idx = torch.tensor([5, 0, 0, 3, 5, 5], dtype=index_dtype)  # repeats sum in the backward
    torch.testing.assert_close(kernels.gather_rows(x, idx), x[idx.long()])
    expected = torch.zeros(7, 3, dtype=torch.float64).index_add_(0, idx.long(), x)
    torch.testing.assert_close(kernels.scatter_add_rows(x, idx, 7), expected)
    assert torch.autograd.gradcheck(lambda x: kernels.gather_rows(x, idx), (x,))
    assert torch.autograd.gradcheck(lambda x: kernels.scatter_add_rows(x, idx, 7), (x,))


@pytest.mark.parametrize("bad", [-1, 6])
@graph_cases
def test_out_of_range_row_indices_raise_one_clear_error(bad: int, index_dtype: torch.dtype) -> None:
    # The CUDA kernels would read or write out of bounds; the check before them makes every
    # device raise this error (torch's CPU ops would raise their own, different ones).
    x = features(6, 3)
    idx = torch.tensor([0, bad, 2], dtype=index_dtype)
    with pytest.raises(KernelError, match=r"gather_rows: indices must lie in \[0, 6\)"):
        kernels.gather_rows(x, idx)
    with pytest.raises(KernelError, match=r"scatter_add_rows: indices must lie in \[0, 6\)"):
        kernels.scatter_add_rows(x[:3], idx, 6)


def test_row_indices_are_checked_once_per_tensor_version(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: calls.append(1) or real(t))
    x, idx = features(6, 3), torch.tensor([5, 0, 2])
    for _ in range(3):
        kernels.gather_rows(x, idx)
    assert len(calls) == 1
    idx[1] = 9  # an in-place change bumps the version: checked again
    with pytest.raises(KernelError, match="9"):
        kernels.gather_rows(x, idx)
    assert len(calls) == 2


def test_scatter_add_rows_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="must match"):
        kernels.scatter_add_rows(features(4, 3), torch.tensor([0, 1]), 5)


def test_scatter_add_rows_bfloat16_sums_in_float32() -> None:
    src = torch.full((256, 2), 1.0 / 256, dtype=torch.bfloat16)
    out = kernels.scatter_add_rows(src, torch.zeros(256, dtype=torch.long), 1)
    # Summing in bfloat16 would stall below 1.0; float32 sums reach it exactly.
    assert torch.equal(out, torch.ones(1, 2, dtype=torch.bfloat16))


# --- fused aggregation -------------------------------------------------------------------------


@kind_cases
@graph_cases
def test_fused_aggregate_equals_spmm_over_all_columns(kind: str, index_dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype)
    local, remote = split_local_remote(csr, num_local_cols=5)
    x = features(csr.num_cols, 3)
    x_local, x_remote = x[:5].clone().requires_grad_(), x[5:].clone().requires_grad_()
    out = kernels.fused_aggregate(local, x_local, remote, x_remote)
    torch.testing.assert_close(out, kernels.spmm(csr, x))
    fn = lambda xl, xr, vl, vr: kernels.fused_aggregate(  # noqa: E731
        local.with_values(vl), xl, remote.with_values(vr), xr
    )
    vl, vr = local.values.clone().requires_grad_(), remote.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(fn, (x_local, x_remote, vl, vr), fast_mode=True)


@pytest.mark.parametrize("cut", [0, 8])
def test_fused_aggregate_with_one_side_empty(cut: int) -> None:
    csr = make_csr("duplicates", torch.int32)
    local, remote = split_local_remote(csr, num_local_cols=cut)
    x = features(csr.num_cols, 3)
    out = kernels.fused_aggregate(local, x[:cut], remote, x[cut:])
    torch.testing.assert_close(out, kernels.spmm(csr, x))


def test_fused_aggregate_rejects_different_rows() -> None:
    a, b = make_csr("duplicates", torch.int64), random_csr(5, 4, 10)
    with pytest.raises(ValueError, match="same rows"):
        kernels.fused_aggregate(a, features(a.num_cols, 2), b, features(b.num_cols, 2))


# --- opcheck -----------------------------------------------------------------------------------


def _opcheck_cases(index_dtype: torch.dtype) -> list[tuple[Any, tuple[Any, ...]]]:
    csr = make_csr("huge_row", index_dtype, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=5)
    x = features(csr.num_cols, 3, torch.float32).requires_grad_()
    xl, xr = x[:5].detach().requires_grad_(), x[5:].detach().requires_grad_()
    values = csr.values.clone().requires_grad_()
    a = features(csr.num_rows, 3, torch.float32).requires_grad_()
    idx = torch.tensor([2, 0, 2, 7], dtype=index_dtype)
    bias = x[0].detach().requires_grad_()
    spmm_args = (
        csr.indptr,
        csr.indices,
        values,
        x,
        csr.t_indptr,
        csr.t_indices,
        csr.t_perm,
        csr.num_rows,
        csr.max_degree,
        csr.t_max_degree,
    )
    local_args = (
        local.indptr,
        local.indices,
        local.values,
        xl,
        local.t_indptr,
        local.t_indices,
        local.t_perm,
    )
    remote_args = (
        remote.indptr,
        remote.indices,
        remote.values,
        xr,
        remote.t_indptr,
        remote.t_indices,
        remote.t_perm,
    )
    return [
        (ops.spmm_csr, spmm_args),
        (ops.sddmm_csr, (csr.indptr, csr.indices, a, x, csr.t_indptr, csr.t_indices, csr.t_perm)),
        (ops.gather_rows, (x, idx)),
        (ops.scatter_add_rows, (a[:4], idx, 9)),
        (ops.fused_aggregate, (*local_args, *remote_args, csr.num_rows, 3, 4, 5, 6)),
        (
            ops.bias_relu_dropout,
            (a, bias, torch.zeros(a.shape[0], dtype=torch.int64), 7, 0, 1.0),
        ),
        (ops.bias_relu_dropout, (a, None, torch.arange(a.shape[0]), -5, 128, 2.0)),
    ]


@pytest.mark.slow
@graph_cases
def test_opcheck_every_op(index_dtype: torch.dtype) -> None:
    for op, args in _opcheck_cases(index_dtype):
        torch.library.opcheck(op, args)


# --- backend selection -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_cpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend selection here never loads LEO's CPU SpMM into this process (a built one would
    serve every later test's CPU tensors); tests/kernels/test_cpu_kernels.py covers it."""
    monkeypatch.setattr(backend, "_load_cpu_kernels", lambda: "not loaded in this test")


def test_backend_ref_forces_reference() -> None:
    backend = select_backend({"LEO_KERNELS": "ref"})
    assert backend.name == "reference" and "LEO_KERNELS=ref" in backend.reason


def test_backend_rejects_unknown_value() -> None:
    with pytest.raises(KernelError, match="auto, ref, cuda"):
        select_backend({"LEO_KERNELS": "fast"})


def test_backend_without_extension_falls_back_or_fails_when_forced() -> None:
    if select_backend({}).name == "cuda":
        pytest.skip("leo_cli._C is built and loads here")
    assert "leo_cli._C" in select_backend({"LEO_KERNELS": "auto"}).reason
    with pytest.raises(KernelError, match="LEO_KERNELS=cuda"):
        select_backend({"LEO_KERNELS": "cuda"})


class _FakeExtension(types.SimpleNamespace):
    """Stands in for leo_cli._C: registration and first use succeed or fail as told."""

    def __init__(self, register_error: str | None = None) -> None:
        super().__init__(registered=False, unregistered=False, register_error=register_error)

    def register_kernels(self) -> None:
        if self.register_error:
            raise RuntimeError(self.register_error)
        self.registered = True

    def unregister_kernels(self) -> None:
        self.unregistered = True


def _select_with(
    fake: _FakeExtension, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> tuple[Any, list[warnings.WarningMessage]]:
    monkeypatch.setattr(backend, "_checkout_stale_build", lambda: None)
    monkeypatch.setattr(backend, "importlib", types.SimpleNamespace(import_module=lambda n: fake))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = select_backend(env)
    return chosen, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_extension_with_drifted_schemas_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A static registration of a drifted signature aborted the process (exit 134) at import;
    # registering from a function turns it into this fallback.
    drift = "Inferred operator schema for a C++ kernel function doesn't match\n  leo::spmm_csr"
    fake = _FakeExtension(register_error=drift)
    chosen, warned = _select_with(fake, monkeypatch, {"LEO_KERNELS": "auto"})
    assert chosen.name == "reference" and "schemas" in chosen.reason
    assert "leo compile --force" in chosen.reason and len(warned) == 1
    with pytest.raises(KernelError, match="schemas"):
        _select_with(fake, monkeypatch, {"LEO_KERNELS": "cuda"})


def test_extension_failing_on_first_use_is_unregistered_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeExtension()
    no_image = "leo::spmm_csr: kernel launch failed: no kernel image is available"
    monkeypatch.setattr(backend, "first_use_failure", lambda: no_image)
    chosen, warned = _select_with(fake, monkeypatch, {})
    assert chosen.name == "reference" and "first use" in chosen.reason
    assert fake.registered and fake.unregistered and len(warned) == 1


def test_stale_extension_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    # A library built from older sources may abort the process at load: it is not imported.
    stale = "leo_cli._C was built from other CUDA sources; rebuild it with `leo compile`"
    monkeypatch.setattr(backend, "_checkout_stale_build", lambda: stale)

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} was imported")

    monkeypatch.setattr(backend, "importlib", types.SimpleNamespace(import_module=refuse))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = select_backend({})
    assert chosen.name == "reference" and chosen.reason == stale
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    with pytest.warns(RuntimeWarning), pytest.raises(KernelError, match="other CUDA sources"):
        select_backend({"LEO_KERNELS": "cuda"})


def test_working_extension_is_registered_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeExtension()
    monkeypatch.setattr(backend, "first_use_failure", lambda: None)
    chosen, warned = _select_with(fake, monkeypatch, {})
    assert chosen.name == "cuda" and fake.registered and not fake.unregistered and not warned


@pytest.fixture
def unhonoured_cuda(monkeypatch: pytest.MonkeyPatch) -> KernelError:
    """This process as under LEO_KERNELS=cuda with no loadable extension (state restored)."""
    reason = KernelError("LEO_KERNELS=cuda but leo_cli._C is not built")
    monkeypatch.setenv("LEO_KERNELS", "cuda")
    monkeypatch.setattr(backend, "_ACTIVE", None)
    monkeypatch.setattr(backend, "_FAILURE", None)
    monkeypatch.setattr(backend, "_FAILED_CHOICE", None)

    def fail(env: Any = None) -> Backend:
        raise reason

    monkeypatch.setattr(backend, "select_backend", fail)
    return reason


def test_unhonoured_cuda_choice_does_not_fail_the_import(unhonoured_cuda: KernelError) -> None:
    backend.load_at_import()  # `leo compile` imports the package to build the extension
    for _ in range(2):  # ... but every later question gets the reason
        with pytest.raises(KernelError, match="not built"):
            backend.active_backend()
    with pytest.raises(KernelError, match="not built"):
        backend.require_cuda_kernels(torch.device("cuda", 0))
    backend.require_cuda_kernels(torch.device("cpu"))  # CPU tensors are not concerned
    x = torch.ones(3, 2)
    assert torch.equal(kernels.gather_rows(x, torch.tensor([2, 0])), x[[2, 0]])


def test_a_bad_kernels_value_still_fails_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEO_KERNELS", "fast")
    monkeypatch.setattr(backend, "_ACTIVE", None)
    monkeypatch.setattr(backend, "_FAILURE", None)
    monkeypatch.setattr(backend, "_FAILED_CHOICE", None)
    with pytest.raises(KernelError, match="auto, ref, cuda"):
        backend.load_at_import()


def test_leo_train_says_the_reason_before_partitioning(
    unhonoured_cuda: KernelError, tmp_path: Path
) -> None:
    backend.load_at_import()
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--set", f"run.out_dir={run}"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "leo_cli._C is not built" in result.stderr and not (run / "partitions").exists()


def test_first_use_probe_is_a_no_op_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the probe really runs")
    assert backend.first_use_failure() is None


def test_csr_to_device_keeps_structure() -> None:
    csr = make_csr("empty_rows", torch.int32)
    moved = csr.to("cpu")
    assert moved.num_rows == csr.num_rows and torch.equal(moved.t_perm, csr.t_perm)


def test_checks_that_hold_do_not_call_torch_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._check's first call imports its symbolic shapes (and sympy, about a second of a
    worker's first step): the ops' checks that hold on plain bools do not reach it, and one
    that fails still raises through it."""
    calls: list[object] = []
    check = torch._check
    monkeypatch.setattr(torch, "_check", lambda cond, msg=None: calls.append(cond))
    csr = random_csr(30, 40, 200, seed=1)
    x = torch.randn(40, 8)
    kernels.spmm(csr, x)
    kernels.keyed_dropout(torch.randn(30, 8), torch.arange(30), 7, 128, 2.0)
    assert calls == []
    monkeypatch.setattr(torch, "_check", check)
    with pytest.raises(RuntimeError, match="boom"):
        ops._require(False, lambda: "boom")
