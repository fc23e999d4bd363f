"""The measurements of the hardware probe, as functions that also run in a single process.

`measure_compute` times the kernels a layer runs (SpMM forward and backward, GEMM, dropout
masks, row gather, row scatter-add) at several row widths; `measure_links` times the transports
between the workers of a process group (gloo `isend`/`irecv` and a /dev/shm segment) and the
barrier. Every measurement keeps the median of `repeats` timed calls after one warm-up, and
calls `sync` (a barrier under the probe worker) before every call, so every worker computes at
the same moments and they contend for the cores as in training. The dropout under test is
passed in (`dropout=counter_dropout`): models/ sits above cache/ in the import order.

The SpMM runs on a random CSR per width with `spmm_elements / width` edges, `avg_degree` edges
per row and twice as many columns as rows (inner + halo), uniformly random columns: no locality,
a pessimistic stand-in for a METIS part. Its feature matrix has the same bytes at every width.

Legend: R rows, C columns, E edges, F width, N rows gathered or scattered, K kernels or pairs,
W widths.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.cache.hardware import ComputeRates, LinkFit, LinkProfile, Links, PairFit, ProbeSizes
from leo_cli.comm.shm import open_segment

Sync = Callable[[], None]
DropoutFn = Callable[[Tensor, Tensor, float, int], Tensor]
"""counter_dropout's signature: (x_NF, ids_N, p, key) -> x_NF with entries dropped."""

DEFAULT_SIZES = ProbeSizes()
QUICK_SIZES = ProbeSizes(
    widths=(8, 64),
    spmm_elements=1 << 16,
    dense_elements=1 << 14,
    repeats=2,
    large_message_bytes=1 << 16,
    small_iters=3,
    large_iters=2,
)
_DROPOUT_P = 0.5
_SEED = 0


def no_sync() -> None:
    """The `sync` of a single process: nothing to wait for."""


def median_seconds(fn: Callable[[], object], repeats: int, sync: Sync = no_sync) -> float:
    """Median wall seconds of `repeats` calls of `fn` after one warm-up call.

    `sync` runs before every call, the warm-up included: under the probe worker every rank
    then runs the same kernel at the same moment, never beside another rank's set-up.
    """
    sync()
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return max(statistics.median(times), 1e-9)  # a rate must stay finite


# -- compute ----------------------------------------------------------------------------------


def random_csr(num_rows: int, avg_degree: int, gen: torch.Generator) -> kernels.CSR:
    """An (R x 2R) CSR with about `avg_degree` uniformly random columns per row."""
    num_edges, num_cols = num_rows * avg_degree, 2 * num_rows
    rows_E = torch.randint(0, num_rows, (num_edges,), generator=gen)
    counts = torch.bincount(rows_E, minlength=num_rows)
    indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    # Columns are iid, so they need no sorting by row: any grouping is as random.
    indices_E = torch.randint(0, num_cols, (num_edges,), generator=gen)
    values_E = torch.rand(num_edges, generator=gen)
    return kernels.CSR.from_arrays(indptr, indices_E, values_E, num_cols, validate=False)


def spmm_rates(sizes: ProbeSizes, width: int, sync: Sync = no_sync) -> tuple[float, float]:
    """Edges per second of `A @ X` and of its autograd backward `A^T @ G`, at `width`."""
    gen = torch.Generator().manual_seed(_SEED)
    num_rows = max(1, sizes.spmm_elements // (width * sizes.avg_degree))
    adj = random_csr(num_rows, sizes.avg_degree, gen)
    x_CF = torch.randn(adj.num_cols, width, generator=gen, requires_grad=True)
    with torch.no_grad():
        forward_s = median_seconds(lambda: kernels.spmm(adj, x_CF), sizes.repeats, sync)
    out_RF = kernels.spmm(adj, x_CF)
    grad_RF = torch.randn(out_RF.shape, generator=gen)
    backward_s = median_seconds(
        lambda: torch.autograd.grad(out_RF, x_CF, grad_RF, retain_graph=True),
        sizes.repeats,
        sync,
    )
    return adj.num_edges / forward_s, adj.num_edges / backward_s


def dense_rows(sizes: ProbeSizes, width: int) -> int:
    """Rows of one dense call: `dense_elements` elements in all."""
    return max(1, sizes.dense_elements // width)


def gemm_rate(sizes: ProbeSizes, width: int, sync: Sync = no_sync) -> float:
    """FLOP per second of `F.linear` from `width` to `width` columns."""
    gen = torch.Generator().manual_seed(_SEED)
    rows = dense_rows(sizes, width)
    x_NF = torch.randn(rows, width, generator=gen)
    weight = torch.randn(width, width, generator=gen)
    seconds = median_seconds(lambda: F.linear(x_NF, weight), sizes.repeats, sync)
    return 2.0 * rows * width * width / seconds


def mask_rate(sizes: ProbeSizes, width: int, dropout: DropoutFn, sync: Sync = no_sync) -> float:
    """Rows per second of counter-based dropout (mask generation and apply)."""
    rows = dense_rows(sizes, width)
    x_NF = torch.randn(rows, width, generator=torch.Generator().manual_seed(_SEED))
    ids_N = torch.arange(rows, dtype=torch.int64)
    seconds = median_seconds(lambda: dropout(x_NF, ids_N, _DROPOUT_P, 12345), sizes.repeats, sync)
    return rows / seconds


def gather_rate(sizes: ProbeSizes, width: int, sync: Sync = no_sync) -> float:
    """Rows per second of `kernels.gather_rows` (random rows of a twice taller matrix)."""
    gen = torch.Generator().manual_seed(_SEED)
    rows = dense_rows(sizes, width)
    x_CF = torch.randn(2 * rows, width, generator=gen)
    idx_N = torch.randint(0, 2 * rows, (rows,), generator=gen)
    return rows / median_seconds(lambda: kernels.gather_rows(x_CF, idx_N), sizes.repeats, sync)


def scatter_add_rate(sizes: ProbeSizes, width: int, sync: Sync = no_sync) -> float:
    """Rows per second of `out.index_add_(0, idx, src)` into random rows of a taller matrix."""
    gen = torch.Generator().manual_seed(_SEED)
    rows = dense_rows(sizes, width)
    out_CF = torch.zeros(2 * rows, width)
    src_NF = torch.randn(rows, width, generator=gen)
    idx_N = torch.randint(0, 2 * rows, (rows,), generator=gen)
    seconds = median_seconds(lambda: out_CF.index_add_(0, idx_N, src_NF), sizes.repeats, sync)
    return rows / seconds


def measure_compute(sizes: ProbeSizes, dropout: DropoutFn, sync: Sync = no_sync) -> ComputeRates:
    """Every compute rate at every width of `sizes`, for this process."""
    rates: dict[str, list[float]] = {name: [] for name in ComputeRates.model_fields}
    for width in sizes.widths:
        forward, backward = spmm_rates(sizes, width, sync)
        rates["widths"].append(width)
        rates["spmm_edges_per_s"].append(forward)
        rates["spmm_t_edges_per_s"].append(backward)
        rates["gemm_flop_per_s"].append(gemm_rate(sizes, width, sync))
        rates["mask_rows_per_s"].append(mask_rate(sizes, width, dropout, sync))
        rates["gather_rows_per_s"].append(gather_rate(sizes, width, sync))
        rates["scatter_add_rows_per_s"].append(scatter_add_rate(sizes, width, sync))
    return ComputeRates.model_validate(rates)


def median_over_ranks(mine: ComputeRates) -> ComputeRates:
    """Each rate's median over the ranks of the process group (every rank gets it)."""
    names = [n for n in ComputeRates.model_fields if n != "widths"]
    mine_KW = torch.tensor([getattr(mine, n) for n in names], dtype=torch.float64)
    out = [torch.empty_like(mine_KW) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine_KW)
    median_KW = torch.quantile(torch.stack(out), 0.5, dim=0)  # mean of the middle two if even
    return ComputeRates(widths=mine.widths, **dict(zip(names, median_KW.tolist(), strict=True)))


# -- links ------------------------------------------------------------------------------------


def fit_link(small_bytes: int, small_s: float, large_bytes: int, large_s: float) -> LinkFit:
    """`seconds = latency + bytes / bandwidth` through a small and a large message.

    When noise makes the large message no slower than the small one, the bandwidth is the
    large message's own rate and the latency the small message's time.
    """
    if large_s > small_s:
        bandwidth = (large_bytes - small_bytes) / (large_s - small_s)
    else:
        bandwidth = large_bytes / max(large_s, 1e-9)
    latency = max(0.0, small_s - small_bytes / bandwidth)
    return LinkFit(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def gloo_exchange_seconds(peers: list[int], num_bytes: int, iters: int) -> float:
    """Median seconds of one exchange of `num_bytes` with every peer at once (isend + irecv),
    after one warm-up exchange; each transfer is one message."""
    send = torch.ones(num_bytes // 4)
    recv = {q: torch.empty(num_bytes // 4) for q in peers}

    def once() -> None:
        work = [dist.isend(send, q) for q in peers] + [dist.irecv(recv[q], q) for q in peers]
        for w in work:
            assert w is not None
            w.wait()

    return median_seconds(once, iters)


def gloo_fit(peers: list[int], sizes: ProbeSizes) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of gloo to `peers`, fitted through a small and a large
    exchange: both directions flow at once, as in a layer's halo exchange."""
    small = gloo_exchange_seconds(peers, sizes.small_message_bytes, sizes.small_iters)
    large = gloo_exchange_seconds(peers, sizes.large_message_bytes, sizes.large_iters)
    fit = fit_link(sizes.small_message_bytes, small, sizes.large_message_bytes, large)
    return fit.bandwidth_bytes_per_s, fit.latency_s


class ShmBlocks:
    """A /dev/shm segment with one block per (writer, reader) pair of ranks.

    One transfer: each active rank copies its rows into its block for every peer, all ranks
    pass a barrier (as the shared-memory mode does per exchange), then each active rank copies
    its peers' blocks for it out. Inactive ranks only join the barrier. The copies and the
    barrier are timed apart: the barrier is the link's latency, the copies its bandwidth (a
    two-point fit drowns the copies of a few MiB in the barrier's jitter).
    """

    def __init__(self, block_bytes: int) -> None:
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.block = block_bytes // 4
        self.segment = open_segment(self.world * self.world * self.block, torch.float32)
        self.local = torch.ones(self.block)
        self.landing = torch.empty(self.block)

    def view(self, writer: int, reader: int, count: int) -> Tensor:
        start = (writer * self.world + reader) * self.block
        return self.segment[start : start + count]

    def once(self, peers: list[int], count: int) -> tuple[float, float]:
        """Seconds spent copying and seconds spent in the barrier, for one transfer."""
        t0 = time.perf_counter()
        for q in peers:
            self.view(self.rank, q, count).copy_(self.local[:count])
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        for q in peers:
            self.landing[:count].copy_(self.view(q, self.rank, count))
        return t1 - t0 + time.perf_counter() - t2, t2 - t1

    def fit(self, peers: list[int], sizes: ProbeSizes) -> tuple[float, float]:
        """(bandwidth B/s, latency s) to `peers`; (0, 0) for a rank without peers."""
        small = [
            self.once(peers, sizes.small_message_bytes // 4) for _ in range(sizes.small_iters + 1)
        ]
        count = sizes.large_message_bytes // 4
        large = [self.once(peers, count) for _ in range(sizes.large_iters + 1)]
        if not peers:
            return 0.0, 0.0
        copy_s = max(statistics.median(c for c, _ in large[1:]), 1e-9)
        return 4 * count / copy_s, statistics.median(b for _, b in small[1:])


FitFn = Callable[[list[int], ProbeSizes], tuple[float, float]]


def link_profile(fit: FitFn, sizes: ProbeSizes, everyone_fits: bool) -> LinkProfile:
    """Fits of one transport: each pair alone, then all pairs at once.

    `everyone_fits`: every rank calls `fit`, even without peers (the shm barrier needs all).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    pairs = list(itertools.combinations(range(world), 2))
    fits_K2 = torch.zeros(len(pairs) + 1, 2, dtype=torch.float64)
    for k, (a, b) in enumerate(pairs):
        dist.barrier()
        peers = [b] if rank == a else [a] if rank == b else []
        if peers or everyone_fits:
            measured = fit(peers, sizes)
            fits_K2[k] = torch.tensor(measured) if rank == a else 0.0
    dist.barrier()
    fits_K2[-1] = torch.tensor(fit([q for q in range(world) if q != rank], sizes))
    dist.all_reduce(fits_K2)
    fits_K2[-1] /= world  # mean over ranks of the all-pairs exchange
    (bandwidth, latency), *_ = fits_K2[-1:].tolist()
    return LinkProfile(
        concurrent=LinkFit(bandwidth_bytes_per_s=bandwidth, latency_s=latency),
        pairs=[
            PairFit(ranks=p, bandwidth_bytes_per_s=f[0], latency_s=f[1])
            for p, f in zip(pairs, fits_K2[:-1].tolist(), strict=True)
        ],
    )


def barrier_seconds(iters: int) -> float:
    """Median seconds of a barrier (after a warm-up), averaged over ranks."""
    mine = torch.tensor([median_seconds(dist.barrier, iters)], dtype=torch.float64)
    dist.all_reduce(mine)
    return float(mine) / dist.get_world_size()


def measure_links(sizes: ProbeSizes, same_host: bool) -> Links:
    """gloo and (on one host) shared-memory fits between the ranks of the process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Links(gloo=None, shm=None, barrier_s=None)
    gloo = link_profile(gloo_fit, sizes, everyone_fits=False)
    shm = None
    if same_host:
        blocks = ShmBlocks(sizes.large_message_bytes)
        shm = link_profile(blocks.fit, sizes, everyone_fits=True)
        del blocks
    return Links(gloo=gloo, shm=shm, barrier_s=barrier_seconds(sizes.small_iters))
