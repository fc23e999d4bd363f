"""Column slabs of the CPU SpMM: how wide they are, and that they change no number (with
LEO's CPU SpMM; with MKL's, no more than its summation order does)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from leo_cli import kernels
from leo_cli.errors import KernelError
from leo_cli.kernel_tools.synthetic import random_csr
from leo_cli.kernels import slabs, variants


@pytest.fixture
def cache_bytes(monkeypatch: pytest.MonkeyPatch) -> int:
    """A 1 MiB cache to one process: a slab may take 0.2 MiB."""
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 20)
    monkeypatch.setattr(slabs, "sharing_processes", lambda: 1)
    return 1 << 20


def test_x_that_fits_is_one_slab(cache_bytes: int) -> None:
    assert slabs.slab_width(800, 64, 4) == 64  # 204.8 kB of a 209.7 kB budget
    assert slabs.slab_width(1000, 64, 4) == 32  # 256 kB: two slabs


def test_wide_x_gets_the_widest_fitting_divisor(cache_bytes: int) -> None:
    budget = 0.2 * cache_bytes
    width = slabs.slab_width(4000, 64, 4)
    assert 64 % width == 0 and 4000 * width * 4 <= budget < 4000 * 2 * width * 4
    assert width == 8
    assert slabs.slab_width(2000, 96, 4) == 24  # 96 = 4 x 24; 2000 x 24 x 4 B = 192 kB


def test_no_fitting_slab_leaves_x_whole(cache_bytes: int) -> None:
    assert slabs.slab_width(100_000, 64, 4) == 64  # even 8 columns exceed the budget
    assert slabs.slab_width(4000, 47, 4) == 47  # a prime width has no divisor >= MIN_SLAB


def test_workers_of_a_host_share_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    slabs.sharing_processes.cache_clear()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    try:
        assert slabs.sharing_processes() == 64  # however few the cores
    finally:
        slabs.sharing_processes.cache_clear()
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 20)
    monkeypatch.setattr(slabs, "sharing_processes", lambda: 2)
    assert slabs.slab_width(4000, 64, 4) == 64  # slabs only for a cache of one's own


def test_cache_size_is_read_from_sysfs() -> None:
    assert slabs._parse_size("32768K\n") == 32 << 20
    assert slabs._parse_size("1M") == 1 << 20
    assert slabs._parse_size("junk") == 0
    assert slabs.last_level_cache_bytes() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "width", "cols"),
    [
        (torch.float32, 64, 2000),  # slabs of 16
        (torch.float64, 64, 2000),  # slabs of 8
        (torch.bfloat16, 64, 2000),  # computed in float32: slabs of 16
        (torch.float32, 96, 2000),  # slabs of 24
        (torch.float32, 200, 1200),  # slabs of 40
        (torch.float32, 40, 6000),  # slabs of 8
    ],
)
def test_slabs_change_no_number(
    monkeypatch: pytest.MonkeyPatch,
    cache_bytes: int,
    dtype: torch.dtype,
    width: int,
    cols: int,
) -> None:
    csr = random_csr(3000, cols, 40_000, seed=3, dtype=dtype, huge_row_degree=500)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(cols, width, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    grad = torch.randn(3000, width, generator=gen, dtype=torch.float64).to(dtype)
    assert slabs.slab_width(cols, width, max(4, x.element_size())) < width  # the premise
    assert slabs.slab_width(3000, width, max(4, x.element_size())) < width  # and backward's

    def forward_backward() -> tuple[torch.Tensor, torch.Tensor]:
        x.grad = None
        out = kernels.spmm(csr, x)
        out.backward(grad)
        assert x.grad is not None
        return out.detach().clone(), x.grad.clone()

    sliced = forward_backward()
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 40)
    whole = forward_backward()
    if kernels.active_backend().cpu == "leo":  # LEO's SpMM: CSR order whatever the width
        assert torch.equal(sliced[0], whole[0]) and torch.equal(sliced[1], whole[1])
        return
    # MKL may order a row's sum by the product's width (it does on an Intel Xeon): the slabs
    # then change the last bits only.
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype)
    for got, expected in zip(sliced, whole, strict=True):
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


@pytest.fixture
def variant() -> Iterator[None]:
    """Restores the process's CPU SpMM variant after the test."""
    before = variants.cpu_spmm()
    yield
    variants.set_cpu_spmm(before)


def test_each_torch_variant_slabs_as_named_and_computes_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch, variant: None
) -> None:
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 20)
    monkeypatch.setattr(slabs, "sharing_processes", lambda: 2)  # auto: no slabs
    csr = random_csr(600, 2000, 8000, seed=5)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2000, 64, generator=gen).requires_grad_()
    grad = torch.randn(600, 64, generator=gen)
    assert slabs.slab_width(2000, 64, 4, shared=False) < 64  # the premise: 512 kB of x
    results, taken = {}, {}
    for name in (variants.TORCH, variants.TORCH_SLABS):
        variants.set_cpu_spmm(name)
        variants.slabs_taken(reset=True)
        x.grad = None
        out = kernels.spmm(csr, x)
        out.backward(grad)
        assert x.grad is not None
        results[name], taken[name] = (out.detach(), x.grad.clone()), variants.slabs_taken()
    assert taken == {variants.TORCH: False, variants.TORCH_SLABS: True}
    for got, expected in zip(results[variants.TORCH_SLABS], results[variants.TORCH], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_leo_variant_needs_the_library(monkeypatch: pytest.MonkeyPatch, variant: None) -> None:
    from leo_cli.kernels import cpu

    monkeypatch.setattr(cpu, "_LOADED", None)
    with pytest.raises(KernelError, match="pipeline.spmm=leo but LEO's CPU kernels"):
        variants.set_cpu_spmm(variants.LEO)
    with pytest.raises(KernelError, match="not one of"):
        variants.set_cpu_spmm("mkl")
