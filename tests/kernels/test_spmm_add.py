"""`kernels.spmm_add_`: out += A @ x in place, with the sums of a product added after (to the
bit), without the product where MKL adds into out; and the aggregations that use it (the
fused op's second side, the rows read in place) make one product, not one per source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import random_csr
from leo_cli.kernels import ops, slabs, variants

MKL = pytest.mark.skipif(not ops._MKL, reason="torch without MKL: no sums added in place")


@pytest.fixture
def torch_spmm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch's CPU SpMM serves, x whole (no slabs), as in a `pipeline.spmm=torch` worker."""
    before = variants.cpu_spmm()
    variants.set_cpu_spmm(variants.TORCH)
    yield
    variants.set_cpu_spmm(before)


def _products(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the (R x F) products the torch SpMM makes (one entry per product, its rows)."""
    made: list[int] = []
    fresh = ops._csr_matmul

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        out: torch.Tensor = fresh(*args, **kwargs)
        made.append(out.shape[0])
        return out

    monkeypatch.setattr(ops, "_csr_matmul", counted)
    return made


@MKL
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("width", [1, 7, 47, 64])
def test_sums_added_in_place_are_a_product_added_to_the_bit(
    dtype: torch.dtype, index_dtype: torch.dtype, width: int, torch_spmm: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    csr = random_csr(
        500, 700, 6000, seed=width, index_dtype=index_dtype, dtype=dtype,
        empty_fraction=0.1, huge_row_degree=400,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(700, width, generator=gen, dtype=dtype)
    out = torch.randn(500, width, generator=gen, dtype=dtype)
    expected = out + kernels.spmm(csr, x)
    made, where = _products(monkeypatch), out.data_ptr()
    kernels.spmm_add_(out, csr, x)
    assert torch.equal(out, expected) and out.data_ptr() == where
    # into out, no product made, where this machine's MKL sums so (else the product is added)
    assert made == ([] if ops._mkl_adds_alike(dtype, width) else [500])


@MKL
def test_where_mkl_sums_alike_no_product_is_made(
    torch_spmm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-place path itself, whatever this machine's check answers: no product, out's
    storage kept, the sums within rounding of a product added."""
    monkeypatch.setattr(ops, "_mkl_adds_alike", lambda dtype, width: True)
    csr = random_csr(300, 400, 3000, seed=8)
    gen = torch.Generator().manual_seed(9)
    x, out = torch.randn(400, 32, generator=gen), torch.randn(300, 32, generator=gen)
    expected = out + kernels.spmm(csr, x)
    made, where = _products(monkeypatch), out.data_ptr()
    kernels.spmm_add_(out, csr, x)
    assert made == [] and out.data_ptr() == where
    torch.testing.assert_close(out, expected)


@MKL
def test_the_fused_reference_makes_one_product(
    torch_spmm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, remote = random_csr(300, 400, 3000, seed=1), random_csr(300, 90, 900, seed=2)
    gen = torch.Generator().manual_seed(3)
    x_local, x_remote = torch.randn(400, 16, generator=gen), torch.randn(90, 16, generator=gen)
    expected = kernels.spmm(local, x_local) + kernels.spmm(remote, x_remote)
    made = _products(monkeypatch)
    got = kernels.fused_aggregate(local, x_local, remote, x_remote)
    assert torch.equal(got, expected)
    # the local side's; the remote side added into it (where MKL sums so here)
    assert made == ([300] if ops._mkl_adds_alike(torch.float32, 16) else [300, 300])


def test_a_product_is_added_where_mkl_cannot_add_in_place(
    torch_spmm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half precision (summed in float32, rounded once), x in slabs, or a gradient wanted: the
    product is made and added, as `out += spmm(...)` does."""
    csr = random_csr(200, 300, 2000, seed=4)
    gen = torch.Generator().manual_seed(5)
    x, out = torch.randn(300, 64, generator=gen), torch.randn(200, 64, generator=gen)
    made = _products(monkeypatch)
    half_out, half_x = out.to(torch.bfloat16), x.to(torch.bfloat16)
    expected = half_out + kernels.spmm(csr, half_x)
    kernels.spmm_add_(half_out, csr, half_x)
    assert torch.equal(half_out, expected) and made[-1] == 200
    xg = x.clone().requires_grad_(True)
    summed = out.clone()
    kernels.spmm_add_(summed, csr, xg)
    summed.sum().backward()
    x_ref = x.clone().requires_grad_(True)
    (out + kernels.spmm(csr, x_ref)).sum().backward()
    assert torch.equal(summed.detach(), out + kernels.spmm(csr, x))
    assert xg.grad is not None and x_ref.grad is not None and torch.equal(xg.grad, x_ref.grad)
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 16)
    variants.set_cpu_spmm(variants.TORCH_SLABS)
    assert not ops.adds_in_place(out, x)  # 77 kB of x against a 13 kB share: slabs
    expected = out + kernels.spmm(csr, x)
    made.clear()
    kernels.spmm_add_(out, csr, x)
    assert torch.equal(out, expected) and made == [200]


def test_an_mkl_that_adds_otherwise_gets_the_product_added(
    torch_spmm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the machine's MKL would not add A @ x into out as `out + A @ x` sums it (checked
    once per dtype), the product is made and added: the same sums either way."""
    monkeypatch.setattr(ops, "_mkl_adds_alike", lambda dtype, width: False)
    csr = random_csr(200, 300, 2000, seed=6)
    gen = torch.Generator().manual_seed(7)
    x, out = torch.randn(300, 16, generator=gen), torch.randn(200, 16, generator=gen)
    expected = out + kernels.spmm(csr, x)
    made = _products(monkeypatch)
    assert not ops.adds_in_place(out, x)
    kernels.spmm_add_(out, csr, x)
    assert torch.equal(out, expected) and made == [200]


def test_this_machines_mkl_check_compares_the_sums_it_adds() -> None:
    """The check itself: True where MKL's in-place sums equal a product added (this machine's
    answer, whichever), False once the in-place product is perturbed."""
    if not ops._MKL:
        pytest.skip("torch without MKL")
    ops._mkl_adds_alike.cache_clear()
    answer = ops._mkl_adds_alike(torch.float32, 16)
    assert isinstance(answer, bool)
    real = torch.addmm

    def off_by_one_ulp(y: torch.Tensor, adj: torch.Tensor, x: torch.Tensor, **kw: object) -> object:
        got = real(y, adj, x, **kw)  # type: ignore[arg-type]
        if kw.get("out") is y and kw.get("beta", 1.0) != 0.0:
            y.view(torch.int32)[0, 0] += 1
        return got

    ops._mkl_adds_alike.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "addmm", off_by_one_ulp)
        assert ops._mkl_adds_alike(torch.float32, 16) is False
    ops._mkl_adds_alike.cache_clear()


def test_an_out_sharing_x_or_wanting_a_gradient_gets_the_product_added(
    torch_spmm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """out that is x (or a view of it) would change x mid-product; out that autograd tracks
    cannot be written by a product with `out=`: both get the product added."""
    monkeypatch.setattr(ops, "_mkl_adds_alike", lambda dtype, width: True)
    csr = random_csr(64, 64, 500, seed=10)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 8, generator=gen)
    assert not ops.adds_in_place(x, x) and not ops.adds_in_place(x[:], x)
    expected = x + kernels.spmm(csr, x)
    made = _products(monkeypatch)
    kernels.spmm_add_(x, csr, x)
    assert torch.equal(x, expected) and made == [64]
    leaf = torch.randn(64, 8, generator=gen, requires_grad=True)
    tracked = leaf * 1.0
    kernels.spmm_add_(tracked, csr, x)
    tracked.sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.ones_like(leaf))
