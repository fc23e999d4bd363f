"""CUDA kernels (leo_cli._C) against the reference, on random graphs; GPU machines only.

Run by `make test-gpu` after `leo compile`. The reference runs on the CPU copy of the same
inputs; float32 must agree to rounding, bfloat16 must be within 2x of the reference's own
bfloat16 error against float64.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.kernels.synthetic import random_csr, split_local_remote


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device (none visible)"
    backend = kernels.active_backend()
    if not backend.has_cuda_kernels:
        return f"needs the CUDA extension: {backend.reason}"
    return None


SKIP_REASON = _skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.cuda_ext,
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
]

KINDS = {
    "plain": {},
    "empty_rows": {"empty_fraction": 0.5},
    "huge_row": {"huge_row_degree": 40_000},
    "duplicates": {"duplicate_fraction": 0.3},
}
WIDTHS = [1, 3, 8, 64, 128, 130, 512]
INDEX_DTYPES = [torch.int32, torch.int64]
kind_cases = pytest.mark.parametrize("kind", sorted(KINDS))
index_cases = pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=["int32", "int64"])
width_cases = pytest.mark.parametrize("width", WIDTHS)


def make_csr(kind: str, index_dtype: torch.dtype, dtype: torch.dtype) -> kernels.CSR:
    return random_csr(
        3000, 2000, 30_000, seed=7, index_dtype=index_dtype, dtype=dtype, **KINDS[kind]
    )


def features(rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=gen, dtype=torch.float64).to(dtype)


def exact_spmm(csr: kernels.CSR, x: Tensor) -> Tensor:
    """float64 result from the (sparse) CPU reference: exact up to float64 rounding."""
    return kernels.spmm(csr.with_values(csr.values.double()), x.double())


def assert_parity(cuda_out: Tensor, ref_out: Tensor, exact: Tensor) -> None:
    """float32/64: equal to rounding; low precision: error <= 2x the reference's own error."""
    got = cuda_out.cpu()
    assert got.dtype == ref_out.dtype and got.shape == ref_out.shape
    if got.dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(got, ref_out, rtol=1e-5, atol=1e-5)
        return
    err_cuda = (got.double() - exact).norm()
    err_ref = (ref_out.double() - exact).norm()
    assert err_cuda <= 2 * err_ref + 1e-6 * exact.norm(), (float(err_cuda), float(err_ref))


@kind_cases
@index_cases
@width_cases
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_spmm_parity(kind: str, index_dtype: torch.dtype, width: int, dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype, dtype)
    x = features(csr.num_cols, width, dtype)
    out = kernels.spmm(csr.to("cuda"), x.cuda())
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


@index_cases
def test_spmm_misaligned_features_use_the_scalar_path(index_dtype: torch.dtype) -> None:
    csr = make_csr("duplicates", index_dtype, torch.float32)
    flat = features(csr.num_cols * 64 + 1, 1, torch.float32).view(-1).cuda()
    x = flat[1:].view(csr.num_cols, 64)  # contiguous, but 4 bytes past a 16-byte boundary
    out = kernels.spmm(csr.to("cuda"), x)
    assert_parity(out, kernels.spmm(csr, x.cpu()), exact_spmm(csr, x.cpu()))


@index_cases
def test_spmm_backward_parity(index_dtype: torch.dtype) -> None:
    csr = make_csr("huge_row", index_dtype, torch.float32)
    grads = []
    for device in ("cpu", "cuda"):
        values = csr.values.to(device).requires_grad_()
        x = features(csr.num_cols, 33, torch.float32).to(device).requires_grad_()
        out = kernels.spmm(csr.to(device).with_values(values), x)
        out.backward(features(csr.num_rows, 33, torch.float32, seed=1).to(device))
        assert x.grad is not None and values.grad is not None
        grads.append((x.grad.cpu(), values.grad.cpu()))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-4)


@index_cases
@pytest.mark.parametrize("width", [1, 7, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gather_and_scatter_parity(
    index_dtype: torch.dtype, width: int, dtype: torch.dtype
) -> None:
    x = features(500, width, dtype)
    idx = torch.randint(0, 500, (2000,), generator=torch.Generator().manual_seed(3)).to(index_dtype)
    torch.testing.assert_close(
        kernels.gather_rows(x.cuda(), idx.cuda()).cpu(), kernels.gather_rows(x, idx)
    )
    src = features(2000, width, dtype, seed=4)
    exact = torch.zeros(600, width, dtype=torch.float64).index_add_(0, idx.long(), src.double())
    out = kernels.scatter_add_rows(src.cuda(), idx.cuda(), 600)
    assert_parity(out, kernels.scatter_add_rows(src, idx, 600), exact)


@kind_cases
@index_cases
@pytest.mark.parametrize("width", [3, 64, 130, 512])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_aggregate_parity_with_remote_in_its_own_allocation(
    kind: str, index_dtype: torch.dtype, width: int, dtype: torch.dtype
) -> None:
    csr = make_csr(kind, index_dtype, dtype)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, width, dtype)
    x_local, x_remote = x[:1400].cuda(), torch.empty(600, width, dtype=dtype, device="cuda")
    x_remote.copy_(x[1400:])  # a separate allocation, as a peer's buffer would be
    out = kernels.fused_aggregate(local.to("cuda"), x_local, remote.to("cuda"), x_remote)
    ref = kernels.fused_aggregate(local, x[:1400], remote, x[1400:])
    assert_parity(out, ref, exact_spmm(csr, x))


def test_fused_aggregate_one_side_empty() -> None:
    csr = make_csr("plain", torch.int32, torch.float32)
    for cut in (0, csr.num_cols):  # everything remote, then everything local
        local, remote = split_local_remote(csr, num_local_cols=cut)
        x = features(csr.num_cols, 64, torch.float32)
        out = kernels.fused_aggregate(
            local.to("cuda"), x[:cut].cuda(), remote.to("cuda"), x[cut:].cuda()
        )
        torch.testing.assert_close(out.cpu(), kernels.spmm(csr, x), rtol=1e-5, atol=1e-5)


def test_float64_gradcheck_on_cuda() -> None:
    csr = random_csr(30, 20, 120, seed=1, dtype=torch.float64, duplicate_fraction=0.2).to("cuda")
    local, remote = split_local_remote(csr.to("cpu"), num_local_cols=12)
    local, remote = local.to("cuda"), remote.to("cuda")
    x = features(20, 4, torch.float64).cuda().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: kernels.spmm(csr, x), (x,))
    xl, xr = x[:12].detach().requires_grad_(), x[12:].detach().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: kernels.fused_aggregate(local, a, remote, b), (xl, xr)
    )


def test_opcheck_on_cuda() -> None:
    from leo_cli.kernels import ops

    csr = make_csr("huge_row", torch.int32, torch.float32).to("cuda")
    x = features(csr.num_cols, 16, torch.float32).cuda().requires_grad_()
    args = (
        csr.indptr,
        csr.indices,
        csr.values,
        x,
        csr.t_indptr,
        csr.t_indices,
        csr.t_perm,
        csr.num_rows,
    )
    torch.library.opcheck(ops.spmm_csr, args)
    idx = torch.tensor([3, 1, 3], device="cuda")
    torch.library.opcheck(ops.gather_rows, (x, idx))
    torch.library.opcheck(ops.scatter_add_rows, (x[:3], idx, 5))


def test_leo_kernels_ref_keeps_the_extension_unloaded() -> None:
    code = "from leo_cli import kernels; print(kernels.backend_name())"
    env = {**os.environ, "LEO_KERNELS": "ref"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "reference"
