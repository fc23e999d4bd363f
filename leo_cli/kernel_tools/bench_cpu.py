"""CPU micro-benchmark: LEO's SpMM (precomputed transpose) vs autograd's own CSR backward.

Runs forward + backward of `A @ (x @ W)` on a synthetic graph (default 200k nodes, 4M edges,
128 -> 64 features) both ways and prints the median times and their ratio. Not a test: speed
is reported, never asserted.

    python -m leo_cli.kernel_tools.bench_cpu [--nodes N] [--edges E] [--repeats K]

Shape suffixes: N nodes, E edges, F features.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import random_csr


def _median_seconds(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median wall time of each step over `repeats` rounds, after one warm-up round.

    Rounds interleave the steps, so a background load slows them alike.
    """
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(repeats + 1):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            if round_ > 0:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _upstream_grad(num_rows: int, width: int) -> Tensor:
    """A fixed gradient for the output, so no loss computation dilutes the timing."""
    return torch.randn(num_rows, width, generator=torch.Generator().manual_seed(2))


def _leo_step(csr: kernels.CSR, x_NF: Tensor, w_FH: Tensor) -> Callable[[], None]:
    grad_NH = _upstream_grad(csr.num_rows, w_FH.shape[1])

    def step() -> None:
        w_FH.grad = None
        torch.autograd.backward(kernels.spmm(csr, x_NF @ w_FH), grad_NH)

    return step


def _torch_step(csr: kernels.CSR, x_NF: Tensor, w_FH: Tensor) -> Callable[[], None]:
    adj = torch.sparse_csr_tensor(
        csr.indptr,
        csr.indices,
        csr.values,
        size=(csr.num_rows, csr.num_cols),
        check_invariants=False,
    )
    grad_NH = _upstream_grad(csr.num_rows, w_FH.shape[1])

    def step() -> None:
        w_FH.grad = None
        torch.autograd.backward(torch.sparse.mm(adj, x_NF @ w_FH), grad_NH)

    return step


def _same_gradient(csr: kernels.CSR, x_NF: Tensor, w_FH: Tensor) -> float:
    """Max relative difference of dL/dW between the two ways (a sanity check, ~1e-6)."""
    _leo_step(csr, x_NF, w_FH)()
    assert w_FH.grad is not None
    leo_grad = w_FH.grad.clone()
    _torch_step(csr, x_NF, w_FH)()
    assert w_FH.grad is not None
    return float((leo_grad - w_FH.grad).abs().max() / w_FH.grad.abs().max())


def run(
    num_nodes: int,
    num_edges: int,
    in_channels: int,
    out_channels: int,
    repeats: int,
    index_dtype: torch.dtype = torch.int64,
) -> float:
    """Print both timings and return torch-autograd time / LEO time (same CSR arrays)."""
    t0 = time.perf_counter()
    csr = random_csr(num_nodes, num_nodes, num_edges, seed=0, index_dtype=index_dtype)
    setup = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    x_NF = torch.randn(num_nodes, in_channels, generator=gen)
    w_FH = torch.randn(in_channels, out_channels, generator=gen).requires_grad_()
    print(
        f"graph: {num_nodes:,} nodes, {csr.num_edges:,} edges, {in_channels} -> {out_channels}; "
        f"{csr.indices.dtype} indices; {torch.get_num_threads()} threads; "
        f"CSR + transpose built in {setup:.2f} s (once)"
    )
    print(f"gradient agreement: max rel diff {_same_gradient(csr, x_NF, w_FH):.1e}")
    steps = {"leo": _leo_step(csr, x_NF, w_FH), "torch": _torch_step(csr, x_NF, w_FH)}
    medians = _median_seconds(steps, repeats)
    leo, ref = medians["leo"], medians["torch"]
    ratio = ref / leo
    print(f"leo spmm (precomputed transpose): {leo * 1e3:8.1f} ms  (median of {repeats})")
    print(f"torch CSR, autograd's backward:   {ref * 1e3:8.1f} ms  (median of {repeats})")
    print(f"ratio (torch / leo): {ratio:.2f}x")
    return ratio


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--edges", type=int, default=4_000_000)
    parser.add_argument("--in-channels", type=int, default=128)
    parser.add_argument("--out-channels", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--int32", action="store_true", help="int32 indices (default int64)")
    args = parser.parse_args(argv)
    index_dtype = torch.int32 if args.int32 else torch.int64
    run(args.nodes, args.edges, args.in_channels, args.out_channels, args.repeats, index_dtype)


if __name__ == "__main__":
    main()
