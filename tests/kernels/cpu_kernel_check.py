"""Run by tests/kernels/test_cpu_kernels.py in a subprocess: LEO's CPU SpMM against the reference.

`LEO_KERNELS=ref python cpu_kernel_check.py LIB` computes every case with the reference, then
loads LIB (which registers its kernels for CPU tensors in this process, for good: hence the
subprocess), computes again and compares (and once more with torch's SpMM, as
`pipeline.spmm=torch` asks): outputs and gradients of `spmm` and `fused_aggregate` on the
graphs that break sparse kernels, in float64, float32 and bfloat16, int32 and int64 indices,
widths that exercise every column tile; then gradcheck and opcheck with the kernel in place;
then `keyed_dropout` and `bias_relu_dropout` to the bit against the reference (every dtype,
widths around whole groups of eight columns, infinities, NaN and signed zeros in x and the
bias, with and without a bias and a mask).
Exits non-zero (an AssertionError) on the first mismatch; prints one line per checked group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import power_law_csr, random_csr, split_local_remote
from leo_cli.kernels import cpu, ops, variants
from leo_cli.models import dropout

KINDS = {
    "empty_rows": {"empty_fraction": 0.4},
    "huge_row": {"huge_row_degree": 300},
    "duplicates": {"duplicate_fraction": 0.4},
}
# Whole 64-column tiles, the widths with a tile of their own (8, 16, 32) and leftovers of every
# size, alone and after whole tiles.
WIDTHS = (1, 7, 8, 16, 32, 48, 63, 64, 67, 127, 130)
DTYPES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}


def cases() -> list[tuple[str, kernels.CSR, Tensor]]:
    out = []
    for kind, shape in KINDS.items():
        for index_dtype in (torch.int32, torch.int64):
            for dtype in DTYPES:
                csr = random_csr(
                    500, 400, 6000, seed=3, index_dtype=index_dtype, dtype=dtype, **shape
                )
                for width in WIDTHS:
                    gen = torch.Generator().manual_seed(width)
                    x = torch.randn(400, width, generator=gen, dtype=torch.float64).to(dtype)
                    out.append((f"{kind}/{index_dtype}/{dtype}/{width}", csr, x))
    hubs = power_law_csr(2000, 2000, 40000, seed=5)
    out.append(("power_law/float32/64", hubs, torch.randn(2000, 64)))
    empty = random_csr(0, 5, 0, seed=0)
    out.append(("no_rows", empty, torch.randn(5, 8)))
    out.append(("no_columns", random_csr(6, 5, 12, seed=0), torch.randn(5, 0)))
    out.append(("strided_x", random_csr(6, 5, 12, seed=0), torch.randn(5, 16)[:, ::2]))
    return out


def run_case(csr: kernels.CSR, x: Tensor) -> dict[str, Tensor]:
    """Forward and backward of spmm and of fused_aggregate over a local/remote split."""
    x = x.detach().requires_grad_()
    values = csr.values.detach().clone().requires_grad_()
    out = kernels.spmm(csr.with_values(values), x)
    gen = torch.Generator().manual_seed(7)
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)
    grad_x, grad_values = torch.autograd.grad(out, (x, values), upstream, allow_unused=True)
    results = {"out": out.detach(), "grad_x": grad_x, "grad_values": grad_values}
    if csr.num_cols > 1 and csr.num_rows > 0:
        local, remote = split_local_remote(csr, csr.num_cols // 2)
        half = csr.num_cols // 2
        fused = kernels.fused_aggregate(local, x.detach()[:half], remote, x.detach()[half:])
        results["fused"] = fused
    return {k: v for k, v in results.items() if v is not None}


def compare(name: str, got: dict[str, Tensor], want: dict[str, Tensor], tol: float) -> None:
    assert got.keys() == want.keys(), (name, got.keys(), want.keys())
    for key in want:
        assert got[key].dtype == want[key].dtype, (name, key, got[key].dtype, want[key].dtype)
        a, b = got[key].double(), want[key].double()
        assert a.shape == b.shape, (name, key, a.shape, b.shape)
        scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
        err = float((a - b).abs().max()) if b.numel() else 0.0
        assert err <= tol * scale, f"{name} {key}: max error {err:.3e} > {tol:.0e} x {scale:.3g}"


def dropout_cases() -> list[tuple[str, Tensor, Tensor, int, int, float]]:
    """(name, x, ids, key, threshold, scale): widths below, at and past groups of eight,
    negative keys and ids beyond int32, special values in x, every byte threshold, a strided
    x, no rows."""
    out = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        for width in (1, 7, 8, 9, 16, 67, 1433):
            gen = torch.Generator().manual_seed(width)
            x = torch.randn(300, width, generator=gen, dtype=torch.float64).to(dtype)
            special = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 0.0])
            x[1, : min(width, 5)] = special[: min(width, 5)].to(dtype)
            ids = torch.randint(0, 1 << 40, (300,), generator=gen)
            for key, p in ((-(1 << 62) + 7, 0.5), (12345, 0.1), (3, 0.9)):
                t = dropout.threshold(p)
                scale = dropout.keep_scale(p, dtype)
                out.append((f"dropout/{dtype}/{width}/{p}", x, ids, key, t, scale))
    few = torch.randn(4, 67)  # every byte threshold: the keep bits are made 8 at a time
    out += [(f"dropout/threshold/{t}", few, torch.arange(4), t, t, 2.0) for t in range(256)]
    wide = torch.randn(40, 32)
    out.append(("dropout/strided", wide[:, ::2], torch.arange(40), 9, 128, 2.0))
    out.append(("dropout/transposed", torch.randn(32, 40).t(), torch.arange(40), 9, 128, 2.0))
    out.append(("dropout/no_rows", torch.randn(0, 8), torch.arange(0), 9, 128, 2.0))
    out.append(("dropout/int32_ids", wide, torch.arange(40, dtype=torch.int32), 9, 128, 2.0))
    return out


def epilogue_cases() -> list[tuple[str, Tensor, Tensor | None, Tensor, int, int, float]]:
    """(name, h, bias, ids, key, threshold, scale) of `bias_relu_dropout`: the dropout cases'
    tensors as h, with a bias (special values in it too) and without, and without a mask."""
    out = []
    for name, x, ids, key, t, scale in dropout_cases():
        if x.dim() != 2 or x.shape[1] == 0:
            continue
        gen = torch.Generator().manual_seed(x.shape[1])
        bias = torch.randn(x.shape[1], generator=gen, dtype=torch.float64).to(x.dtype)
        bias[:2] = torch.tensor([float("nan"), -float("inf")])[: min(2, x.shape[1])].to(x.dtype)
        out.append((f"epilogue{name[7:]}", x, bias, ids, key, t, scale))
        out.append((f"epilogue{name[7:]}/no_bias", x, None, ids, key, t, scale))
        out.append((f"epilogue{name[7:]}/no_mask", x, bias, ids, key, 0, 1.0))
    return out


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal to the bit and in layout, but for NaN payloads (torch's own kernels make
    different ones)."""
    nan = torch.isnan(a)
    return (
        a.dtype == b.dtype
        and a.stride() == b.stride()
        and torch.equal(nan, torch.isnan(b))
        and torch.equal(
            torch.where(nan, 0, a).view(-1).view(torch.uint8),
            torch.where(nan, 0, b).view(-1).view(torch.uint8),
        )
    )


def op_calls(prof: torch.profiler.profile, op: str) -> int:
    """How many calls of the operator `op` the profiler recorded, counted in its raw events
    (`key_averages()` first turns every event of the block into Python objects: slow on the
    variants block's hundreds of cases)."""
    return sum(event.name() == op for event in prof.profiler.kineto_results.events())


def main(lib: Path) -> None:
    assert cpu.loaded() is None, "run with LEO_KERNELS=ref: the reference must compute first"
    table = cases()
    reference = [run_case(csr, x) for _, csr, x in table]
    drops = dropout_cases()
    dropped = [kernels.keyed_dropout(x, ids, key, t, scale) for _, x, ids, key, t, scale in drops]
    epilogues = epilogue_cases()
    relued = [ops.bias_relu_dropout(h, b, ids, k, t, sc) for _, h, b, ids, k, t, sc in epilogues]
    cpu.load(lib)
    assert cpu.loaded() == lib
    for (name, csr, x), want in zip(table, reference, strict=True):
        compare(name, run_case(csr, x), want, DTYPES.get(x.dtype, 1e-5))
    print(f"parity: {len(table)} cases")

    csr = random_csr(12, 9, 40, seed=1, dtype=torch.float64, duplicate_fraction=0.3)
    x = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    values = csr.values.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v, y: kernels.spmm(csr.with_values(v), y), (values, x))
    print("gradcheck: ok")
    args = (csr.indptr, csr.indices, csr.values, x.detach(), csr.t_indptr, csr.t_indices)
    torch.library.opcheck(ops.spmm_csr, (*args, csr.t_perm, csr.num_rows))
    print("opcheck: ok")
    # The library's kernel is what ran: the profiler records its op under both public ops.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        kernels.spmm(csr, x.detach())
        local, remote = split_local_remote(csr, 4)
        kernels.fused_aggregate(local, x.detach()[:4], remote, x.detach()[4:])
    calls = op_calls(prof, "leo_cpu::spmm_csr")
    assert calls == 3, f"leo_cpu::spmm_csr calls recorded: {calls}"
    print("dispatch: ok")
    # pipeline.spmm=torch with the library loaded: torch's SpMM serves, the reference's numbers.
    variants.set_cpu_spmm(variants.TORCH)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for (name, csr, x), want in zip(table, reference, strict=True):
            got = run_case(csr, x)
            assert all(torch.equal(got[k], want[k]) for k in want), name
    assert op_calls(prof, "leo_cpu::spmm_csr") == 0
    variants.set_cpu_spmm(variants.LEO)
    print("variants: ok")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for (name, x, ids, key, t, scale), want in zip(drops, dropped, strict=True):
            assert same_bits(kernels.keyed_dropout(x, ids, key, t, scale), want), name
    calls = op_calls(prof, "leo_cpu::keyed_dropout")
    assert calls == len(drops), f"leo_cpu::keyed_dropout calls recorded: {calls}"
    finite = torch.randn(30, 20)  # opcheck compares outputs with NaN != NaN
    torch.library.opcheck(ops.keyed_dropout, (finite, torch.arange(30), 5, 128, 2.0))
    torch.library.opcheck(ops.keyed_dropout, (finite.t(), torch.arange(20), 5, 128, 2.0))
    print(f"dropout: {len(drops)} cases")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for (name, h, b, ids, key, t, scale), want in zip(epilogues, relued, strict=True):
            assert same_bits(ops.bias_relu_dropout(h, b, ids, key, t, scale), want), name
    calls = op_calls(prof, "leo_cpu::bias_relu_dropout")
    assert calls == len(epilogues), f"leo_cpu::bias_relu_dropout calls recorded: {calls}"
    h, bias = torch.randn(30, 20, requires_grad=True), torch.randn(20, requires_grad=True)
    torch.library.opcheck(ops.bias_relu_dropout, (h, bias, torch.arange(30), 5, 128, 2.0))
    torch.library.opcheck(
        ops.bias_relu_dropout, (h.detach().t(), None, torch.arange(20), 5, 0, 1.0)
    )
    odd = torch.randn(37, 1).as_strided((37, 1), (1, 111))  # a size-1 column, odd stride
    assert ops.bias_relu_dropout(odd, None, torch.arange(37), 5, 128, 2.0).stride() == (1, 1)
    assert kernels.keyed_dropout(odd, torch.arange(37), 5, 128, 2.0).stride() == (1, 1)
    ids = torch.arange(30)
    for bad in (-1, 256):  # a threshold is a byte: refused, not wrapped or clipped
        for op, args in (
            (ops.bias_relu_dropout, (finite, None, ids, 5, bad, 2.0)),
            (torch.ops.leo_cpu.bias_relu_dropout, (finite, None, ids, 5, bad, 2.0)),
            (torch.ops.leo_cpu.keyed_dropout, (finite, ids, 5, bad, 2.0)),
        ):
            try:
                op(*args)
            except RuntimeError as exc:
                assert "threshold" in str(exc), exc
            else:
                raise AssertionError(f"threshold {bad} was not refused")
    print(f"epilogue: {len(epilogues)} cases")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
