"""CUDA kernels (leo_cli._C) against the reference, on random graphs; GPU machines only.

Run by `make test-gpu` after `leo compile` (scripts/gpu-check.sh runs it and the benchmark as
one script). The reference runs on the CPU copy of the same inputs; both are compared with the
float64 result, and the kernel may be off by at most twice the reference's own error
(`parity.py` says why a fixed float32 tolerance fails a correct GPU on hub rows).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from parity import assert_parity, exact_spmm
from torch import Tensor

from leo_cli import kernels
from leo_cli.errors import KernelError
from leo_cli.kernel_tools.synthetic import random_csr, split_local_remote
from leo_cli.kernels import ops


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
    "huge_row": {"huge_row_degree": 40_000},  # above the hub threshold: split across blocks
    "duplicates": {"duplicate_fraction": 0.3},
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
dtype_cases = pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
# 6, 130: 8-byte vectors for fp32; 12, 132: for fp16/bf16; 512, 1000: a lane sums several
# feature slices per row walk.
WIDTHS = [1, 3, 6, 8, 12, 64, 128, 130, 132, 512, 1000]
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


@kind_cases
@index_cases
@width_cases
@dtype_cases
def test_spmm_parity(kind: str, index_dtype: torch.dtype, width: int, dtype: torch.dtype) -> None:
    csr = make_csr(kind, index_dtype, dtype)
    x = features(csr.num_cols, width, dtype)
    out = kernels.spmm(csr.to("cuda"), x.cuda())
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


@index_cases
@dtype_cases
@pytest.mark.parametrize("kind", ["duplicates", "huge_row"])  # huge_row: the hub pass too
@pytest.mark.parametrize("offset_bytes", [4, 8], ids=["4-byte", "8-byte"])
def test_spmm_misaligned_features(
    index_dtype: torch.dtype, dtype: torch.dtype, kind: str, offset_bytes: int
) -> None:
    csr = make_csr(kind, index_dtype, dtype)
    offset = offset_bytes // dtype.itemsize
    flat = features(csr.num_cols * 64 + offset, 1, dtype).view(-1).cuda()
    # Contiguous, but 4 or 8 bytes past a 16-byte boundary: x reads scalars or 8-byte vectors
    # (fp32 at 8 bytes), out keeps its 16-byte vectors.
    x = flat[offset:].view(csr.num_cols, 64)
    out = kernels.spmm(csr.to("cuda"), x)
    assert_parity(out, kernels.spmm(csr, x.cpu()), exact_spmm(csr, x.cpu()))


def spmm_grads(csr: kernels.CSR, x: Tensor, grad: Tensor, device: str) -> tuple[Tensor, Tensor]:
    """(grad of x, grad of the edge values) of sum(spmm(csr, x) * grad), computed on `device`."""
    values = csr.values.detach().to(device).clone().requires_grad_()
    x = x.detach().to(device).clone().requires_grad_()
    out = kernels.spmm(csr.to(device).with_values(values), x)
    out.backward(grad.to(device))
    assert x.grad is not None and values.grad is not None
    return x.grad.cpu(), values.grad.cpu()


def assert_grad_parity(csr: kernels.CSR, x: Tensor, grad: Tensor) -> None:
    """CUDA gradients against the CPU reference's, both judged against float64 gradients."""
    got, ref = spmm_grads(csr, x, grad, "cuda"), spmm_grads(csr, x, grad, "cpu")
    exact_csr = csr.with_values(csr.values.double())
    exact = spmm_grads(exact_csr, x.double(), grad.double(), "cpu")
    for g, r, e in zip(got, ref, exact, strict=True):
        assert_parity(g, r, e)


@index_cases
def test_spmm_backward_parity(index_dtype: torch.dtype) -> None:
    csr = make_csr("huge_row", index_dtype, torch.float32)
    x = features(csr.num_cols, 33, torch.float32)
    assert_grad_parity(csr, x, features(csr.num_rows, 33, torch.float32, seed=1))


@index_cases
@pytest.mark.parametrize("width", [1, 7, 64, 256])
@dtype_cases
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
@dtype_cases
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
        assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


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


# The huge row is summed by several blocks through atomics in a varying order, so two calls of
# the same op differ by float32 rounding there (seen: 5e-5 on a row of ~2.5, 2 of 48000 entries).
ROUNDING = 1e-4


def test_opcheck_on_cuda() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32).to("cuda")
    x = features(csr.num_cols, 16, torch.float32).cuda().requires_grad_()
    args = (csr.indptr, csr.indices, csr.values, x, csr.t_indptr, csr.t_indices, csr.t_perm)
    args = (*args, csr.num_rows)
    torch.library.opcheck(
        ops.spmm_csr, (*args, csr.max_degree, csr.t_max_degree), rtol=ROUNDING, atol=ROUNDING
    )
    idx = torch.tensor([3, 1, 3], device="cuda")
    torch.library.opcheck(ops.gather_rows, (x, idx))
    torch.library.opcheck(ops.scatter_add_rows, (x[:3], idx, 5))
    local, remote = split_local_remote(csr.to("cpu"), num_local_cols=1400)
    local, remote = local.to("cuda"), remote.to("cuda")
    xl, xr = x[:1400].detach().requires_grad_(), x[1400:].detach().requires_grad_()
    sides = [
        (c.indptr, c.indices, c.values, xs, c.t_indptr, c.t_indices, c.t_perm)
        for c, xs in ((local, xl), (remote, xr))
    ]
    degrees = (local.max_degree, local.t_max_degree, remote.max_degree, remote.t_max_degree)
    fused_args = (*sides[0], *sides[1], csr.num_rows, *degrees)
    torch.library.opcheck(ops.fused_aggregate, fused_args, rtol=ROUNDING, atol=ROUNDING)


def test_short_rows_branch_of_spmm() -> None:
    # Mean degree 2 (< 8): lane groups are halved, each lane covers two vectors of a row.
    for width in (8, 64, 130):
        csr = random_csr(4000, 3000, 8000, seed=5, empty_fraction=0.3)
        x = features(csr.num_cols, width, torch.float32)
        out = kernels.spmm(csr.to("cuda"), x.cuda())
        assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_hub_row_of_100k_edges_forward_and_backward(dtype: torch.dtype) -> None:
    # A hub row (forward) and hub columns (backward, through the transpose) split across blocks.
    csr = random_csr(3000, 50, 30_000, seed=9, dtype=dtype, huge_row_degree=100_000)
    assert csr.max_degree > 100_000 and csr.t_max_degree > 2048
    x = features(csr.num_cols, 64, dtype)
    out = kernels.spmm(csr.to("cuda"), x.cuda())
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))
    if dtype == torch.float32:
        assert_grad_parity(csr, x, features(csr.num_rows, 64, dtype, 2))
    local, remote = split_local_remote(csr, num_local_cols=30)  # hub rows on both sides
    out = kernels.fused_aggregate(local.to("cuda"), x[:30].cuda(), remote.to("cuda"), x[30:].cuda())
    assert_parity(out, kernels.fused_aggregate(local, x[:30], remote, x[30:]), exact_spmm(csr, x))


def test_misaligned_fused_aggregate_and_gather() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, 64, torch.float32)
    flat = torch.zeros(csr.num_cols * 64 + 1, device="cuda")
    shifted = flat[1:].view(csr.num_cols, 64)  # contiguous, 4 bytes past a 16-byte boundary
    shifted.copy_(x)
    out = kernels.fused_aggregate(
        local.to("cuda"), shifted[:1400], remote.to("cuda"), shifted[1400:]
    )
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))
    idx = torch.tensor([5, 0, 1999, 5])
    torch.testing.assert_close(kernels.gather_rows(shifted, idx.cuda()).cpu(), x[idx])


def test_fused_aggregate_mixed_int32_local_int64_remote() -> None:
    csr = make_csr("duplicates", torch.int64, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    local = kernels.CSR.from_arrays(
        local.indptr, local.indices, local.values, local.num_cols, index_dtype=torch.int32
    )
    x = features(csr.num_cols, 32, torch.float32)
    out = kernels.fused_aggregate(
        local.to("cuda"), x[:1400].cuda(), remote.to("cuda"), x[1400:].cuda()
    )
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


def test_no_edges_and_no_rows() -> None:
    empty = kernels.CSR.from_arrays(
        torch.zeros(5, dtype=torch.long), torch.zeros(0, dtype=torch.long), num_cols=3
    )
    x = torch.ones(3, 8, device="cuda")
    assert torch.equal(kernels.spmm(empty.to("cuda"), x).cpu(), torch.zeros(4, 8))
    out = kernels.fused_aggregate(empty.to("cuda"), x, empty.to("cuda"), x)
    assert torch.equal(out.cpu(), torch.zeros(4, 8))
    no_rows = kernels.CSR.from_arrays(
        torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long), num_cols=3
    )
    assert kernels.spmm(no_rows.to("cuda"), x).shape == (0, 8)
    assert kernels.fused_aggregate(no_rows.to("cuda"), x, no_rows.to("cuda"), x).shape == (0, 8)
    assert kernels.gather_rows(x, torch.zeros(0, dtype=torch.long, device="cuda")).shape == (0, 8)


def test_bad_row_indices_raise_the_cpu_error_on_cuda() -> None:
    x = torch.ones(6, 3, device="cuda")
    with pytest.raises(KernelError, match=r"indices must lie in \[0, 6\)"):
        kernels.gather_rows(x, torch.tensor([0, 6], device="cuda"))
    with pytest.raises(KernelError, match=r"indices must lie in \[0, 6\)"):
        kernels.scatter_add_rows(x[:2], torch.tensor([-1, 0], device="cuda"), 6)


def test_x_remote_in_pinned_host_memory() -> None:
    csr = make_csr("plain", torch.int32, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, 64, torch.float32)
    x_host = x[1400:].clone().pin_memory()
    out = kernels.fused_aggregate(local.to("cuda"), x[:1400].cuda(), remote.to("cuda"), x_host)
    assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))
    with pytest.raises(RuntimeError, match="pinned"):
        kernels.fused_aggregate(local.to("cuda"), x[:1400].cuda(), remote.to("cuda"), x[1400:])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (peer access)")
def test_x_remote_on_a_peer_gpu_non_contiguous() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, 64, torch.float32)
    # A transposed copy on GPU 1: non-contiguous, so the binding copies it on GPU 1's stream.
    peer_t = x[1400:].t().contiguous().to("cuda:1")
    x_remote = peer_t.t()
    assert not x_remote.is_contiguous()
    if not torch.cuda.can_device_access_peer(0, 1):
        with pytest.raises(RuntimeError, match="peer access"):
            kernels.fused_aggregate(
                local.to("cuda:0"), x[:1400].to("cuda:0"), remote.to("cuda:0"), x_remote
            )
        return
    for _ in range(3):  # the copy's memory must not be reused before the kernel has read it
        out = kernels.fused_aggregate(
            local.to("cuda:0"), x[:1400].to("cuda:0"), remote.to("cuda:0"), x_remote
        )
        assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


@pytest.mark.integration
def test_leo_kernels_ref_keeps_the_extension_unloaded() -> None:
    code = "from leo_cli import kernels; print(kernels.backend_name())"
    env = {**os.environ, "LEO_KERNELS": "ref"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "reference"


def test_dropped_pinned_rows_are_not_reused_before_the_kernel_reads_them() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, 64, torch.float32)
    local_cuda, remote_cuda, x_local = local.to("cuda"), remote.to("cuda"), x[:1400].cuda()
    for _ in range(3):
        x_host = x[1400:].clone().pin_memory()
        out = kernels.fused_aggregate(local_cuda, x_local, remote_cuda, x_host)
        del x_host  # the caller lets go as the op returns; the kernel may not have run yet
        torch.full((600, 64), float("nan")).pin_memory()  # a same-size pinned block, reused?
        assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (peer access)")
def test_x_remote_on_a_peer_gpu_contiguous_and_just_computed() -> None:
    csr = make_csr("huge_row", torch.int32, torch.float32)
    local, remote = split_local_remote(csr, num_local_cols=1400)
    x = features(csr.num_cols, 64, torch.float32)
    if not torch.cuda.can_device_access_peer(0, 1):
        pytest.skip("no peer access between GPU 0 and GPU 1")
    local0, remote0, x_local = local.to("cuda:0"), remote.to("cuda:0"), x[:1400].to("cuda:0")
    source = x[1400:].to("cuda:1")
    for _ in range(3):
        # Produced on GPU 1's stream just before the call: GPU 0 must wait for it, and its
        # memory must not be handed out again on GPU 1 before GPU 0 has read it.
        big = torch.randn(4096, 4096, device="cuda:1")
        x_remote = (source + big[:600, :64] * 0) @ torch.eye(64, device="cuda:1")
        assert x_remote.is_contiguous()
        out = kernels.fused_aggregate(local0, x_local, remote0, x_remote)
        del x_remote, big
        torch.full((600, 64), float("nan"), device="cuda:1")
        assert_parity(out, kernels.spmm(csr, x), exact_spmm(csr, x))
