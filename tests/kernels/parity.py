"""How a CUDA kernel's result is judged against the reference: both are compared with the float64
result, and the kernel may be off by at most twice the reference's own error (plus a floor).

Why not `assert_close(cuda, reference, rtol=1e-5)`: the reference sums a row's edges in order,
in float32, so on a hub row of 40k-100k edges it drifts from the exact sum by ~1e-3; the GPU
sums such a row in 2048-edge chunks and lands closer to the exact value. Two correct answers
then differ by more than any fixed float32 tolerance, while a real bug (an edge dropped or
counted twice) is caught by either norm below: the Frobenius norm for errors spread over many
rows, the largest element for one wrong entry hidden among many small roundings.

Used by tests/kernels/test_cuda_parity.py (GPU) and tests/kernels/test_parity_tolerance.py
(this logic on the CPU, with a simulated correct GPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from leo_cli import kernels

# Relative floor, of the exact result's norm: ~8 float32 roundings; a result equal to the
# exact one rounded to its dtype passes even where the reference happens to be exact too.
FLOOR = 1e-6


def exact_spmm(csr: kernels.CSR, x: Tensor) -> Tensor:
    """float64 result of the CPU reference on float64 copies: exact up to float64 rounding."""
    return kernels.spmm(csr.to("cpu").with_values(csr.values.cpu().double()), x.cpu().double())


def parity_errors(got: Tensor, ref: Tensor, exact: Tensor) -> dict[str, float]:
    """Frobenius and largest-element errors of `got` and `ref` against `exact`."""
    d_got, d_ref = got.cpu().double() - exact, ref.cpu().double() - exact
    return {
        "fro_got": float(d_got.norm()),
        "fro_ref": float(d_ref.norm()),
        "fro_exact": float(exact.norm()),
        "max_got": float(d_got.abs().max()) if d_got.numel() else 0.0,
        "max_ref": float(d_ref.abs().max()) if d_ref.numel() else 0.0,
        "max_exact": float(exact.abs().max()) if exact.numel() else 0.0,
    }


def assert_parity(got: Tensor, ref: Tensor, exact: Tensor) -> None:
    """`got` (a kernel's result, any device) is as close to `exact` as the reference `ref` is.

    Args:
        got: the kernel's result.
        ref: the CPU reference's result, same dtype and shape.
        exact: the float64 result (`exact_spmm`, or a float64 run of the reference).

    Raises:
        AssertionError: dtype or shape differ, a value is not finite, or an error exceeds
            twice the reference's plus the floor.
    """
    got = got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    assert bool(torch.isfinite(got).all()), "non-finite values"
    e = parity_errors(got, ref, exact)
    assert e["fro_got"] <= 2 * e["fro_ref"] + FLOOR * e["fro_exact"], e
    assert e["max_got"] <= 2 * e["max_ref"] + FLOOR * e["max_exact"], e
