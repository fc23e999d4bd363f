"""GPU kernel benchmark: achieved bandwidth of every kernel vs the device's copy bandwidth.

    python -m leo_cli.kernel_tools.bench_gpu [--nodes N] [--edges E] [--width F] [--json PATH]

Times each kernel (CUDA events, median of repeats) on a uniform random and a power-law graph and
reports the bytes it must move at least, per second, as a fraction of the device's
device-to-device copy bandwidth; torch's cuSPARSE SpMM is timed beside LEO's. `--json` also
writes the rows to a file.

Specification: docs/design/kernels.md.
Shape suffixes: R rows, C columns, E edges, F features.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import power_law_csr, random_csr, split_local_remote
from leo_cli.kernels import ops

_COPY_BYTES = 1 << 30
ROWS: list[dict[str, object]] = []  # every measurement of this run, for --json


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def time_cuda(fn: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() on the current stream, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = _event(), _event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return float(statistics.median(times))


def copy_bandwidth(num_bytes: int = _COPY_BYTES) -> float:
    """Device copy bandwidth in bytes/s (read + write of a num_bytes d2d copy)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_cuda(lambda: dst.copy_(src), repeats=10)
    return 2 * num_bytes / seconds


def spmm_bytes(csr: kernels.CSR, width: int, elem_bytes: int) -> int:
    """Bytes an SpMM must move at least: CSR arrays, one x row per edge, the output."""
    idx = csr.indices.element_size()
    arrays = (csr.num_rows + 1) * idx + csr.num_edges * (idx + elem_bytes)
    return arrays + (csr.num_edges + csr.num_rows) * width * elem_bytes


def _report(name: str, seconds: float, num_bytes: int, copy_bw: float) -> None:
    bw = num_bytes / seconds
    print(
        f"  {name:<38} {seconds * 1e3:8.3f} ms  {bw / 1e9:8.1f} GB/s  {bw / copy_bw:5.2f} of copy"
    )
    ROWS.append({"kernel": name, "seconds": seconds, "bytes": num_bytes, "of_copy": bw / copy_bw})


def bench_spmm(csr: kernels.CSR, x_CF: Tensor, copy_bw: float) -> None:
    """LEO's spmm (CUDA kernel when loaded) and the cuSPARSE reference on the same inputs."""
    num_bytes = spmm_bytes(csr, x_CF.shape[1], x_CF.element_size())
    values = csr.values.to(x_CF.dtype)
    _report("spmm (leo)", time_cuda(lambda: kernels.spmm(csr, x_CF)), num_bytes, copy_bw)
    ref = lambda: ops._csr_matmul(csr.indptr, csr.indices, values, x_CF, csr.num_rows)  # noqa: E731
    _report("spmm (reference: cuSPARSE)", time_cuda(ref), num_bytes, copy_bw)
    transpose = csr.transpose()
    grad_RF = torch.randn(csr.num_rows, x_CF.shape[1], device="cuda").to(x_CF.dtype)
    back = lambda: kernels.spmm(transpose, grad_RF)  # noqa: E731
    _report("spmm over A^T (backward)", time_cuda(back), num_bytes, copy_bw)


def bench_rows(x_CF: Tensor, copy_bw: float) -> None:
    """Row gather and scatter-add of as many random rows as x has (indices int64)."""
    num_rows, width = x_CF.shape
    idx = torch.randint(0, num_rows, (num_rows,), device="cuda")
    kernels.check_row_indices(idx, num_rows, "bench")  # checked once, as a plan's indices are
    row_bytes = num_rows * width * x_CF.element_size()
    gather = lambda: kernels.gather_rows(x_CF, idx)  # noqa: E731
    _report("gather_rows", time_cuda(gather), 2 * row_bytes + idx.numel() * 8, copy_bw)
    scatter = lambda: kernels.scatter_add_rows(x_CF, idx, num_rows)  # noqa: E731
    _report("scatter_add_rows", time_cuda(scatter), 2 * row_bytes + idx.numel() * 8, copy_bw)


def bench_fused(
    local: kernels.CSR, remote: kernels.CSR, x_CF: Tensor, copy_bw: float, label: str
) -> None:
    """Fused local+remote aggregation vs two SpMMs, remote rows in a separate allocation."""
    x_local = x_CF[: local.num_cols].clone()
    x_remote = x_CF[local.num_cols :].clone()  # its own allocation, as a peer's buffer would be
    width, elem = x_CF.shape[1], x_CF.element_size()
    num_bytes = spmm_bytes(local, width, elem) + spmm_bytes(remote, width, elem)
    num_bytes -= local.num_rows * width * elem  # one output, not two
    fused = lambda: kernels.fused_aggregate(local, x_local, remote, x_remote)  # noqa: E731
    two = lambda: kernels.spmm(local, x_local) + kernels.spmm(remote, x_remote)  # noqa: E731
    _report(f"fused aggregate ({label})", time_cuda(fused), num_bytes, copy_bw)
    _report("spmm(local) + spmm(remote)", time_cuda(two), num_bytes, copy_bw)


def _in_dtype(csr: kernels.CSR, dtype: torch.dtype) -> kernels.CSR:
    return csr.with_values(csr.values.to(dtype))


def bench_graph(csr_cpu: kernels.CSR, args: argparse.Namespace, copy_bw: float, name: str) -> None:
    """Every kernel on one graph, in float32 and bfloat16."""
    local, remote = split_local_remote(csr_cpu, int(args.nodes * args.local_share))
    csr, local, remote = csr_cpu.to("cuda"), local.to("cuda"), remote.to("cuda")
    print(
        f"{name} graph: {csr.num_rows:,} rows, {csr.num_edges:,} edges, width {args.width}, "
        f"longest row {csr.max_degree:,}, longest column {csr.t_max_degree:,}"
    )
    label = f"{local.num_edges / csr.num_edges:.0%} of edges local"
    for dtype in (torch.float32, torch.bfloat16):
        x_CF = torch.randn(csr.num_cols, args.width, device="cuda").to(dtype)
        print(f"{name}, {dtype}:")
        start = len(ROWS)
        bench_spmm(_in_dtype(csr, dtype), x_CF, copy_bw)
        bench_fused(_in_dtype(local, dtype), _in_dtype(remote, dtype), x_CF, copy_bw, label)
        bench_rows(x_CF, copy_bw)
        for row in ROWS[start:]:
            row.update(graph=name, dtype=str(dtype))


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--edges", type=int, default=16_000_000)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--local-share", type=float, default=0.7, help="share of local columns")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device visible; nothing to measure")
    backend = kernels.active_backend()
    print(f"device: {torch.cuda.get_device_name()}; kernels: {backend.name} ({backend.reason})")
    copy_bw = copy_bandwidth()
    print(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s (1 GiB d2d, read + write)")
    uniform = random_csr(args.nodes, args.nodes, args.edges, seed=0)
    bench_graph(uniform, args, copy_bw, "uniform")
    del uniform
    power_law = power_law_csr(args.nodes, args.nodes, args.edges, seed=0)
    bench_graph(power_law, args, copy_bw, "power-law")
    if args.json is not None:
        record = {"device": torch.cuda.get_device_name(), "backend": backend.name, "rows": ROWS}
        args.json.write_text(json.dumps({**record, "copy_bandwidth": copy_bw}, indent=2))


if __name__ == "__main__":
    main()
