"""The measurements of the hardware probe, as functions that also run in a single process.

`measure_compute` times the kernels a layer runs at several row widths and working-set sizes;
`measure_links` times the transports between the workers of a process group, the barrier, the
share of a transfer hidden behind computation and (one host) rows read in place. Under the
probe worker a `Pace` starts every call on every rank at once, as in training.

Specification: docs/design/cost-model.md.
Legend: R rows, C columns, E edges, F width, N rows gathered or scattered, K kernels or pairs,
W widths, S sizes.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.dist import all_gather_
from leo_cli.comm.shm import open_segment
from leo_cli.planner.profile.hardware import (
    ComputeRates,
    InPlaceRead,
    LinkFit,
    LinkProfile,
    Links,
    PairFit,
    ProbeSizes,
)

Sync = Callable[[], None]
DropoutFn = Callable[[Tensor, Tensor, float, int], Tensor]
"""counter_dropout's signature: (x_NF, ids_N, p, key) -> x_NF with entries dropped."""

DEFAULT_SIZES = ProbeSizes()
QUICK_SIZES = ProbeSizes(
    widths=(8, 64),
    spmm_bytes=(1 << 14, 1 << 16),
    dense_elements=1 << 14,
    mask_elements=1 << 12,
    pass_bytes=(1 << 14, 1 << 16),
    repeats=2,
    # emulated links (launch.emulate) let a burst of 64 KiB through at once (launch/emulate.py
    # `limit`): a bandwidth point well past it measures the link's rate
    large_message_bytes=1 << 20,
    small_iters=3,
    large_iters=2,
)
_DROPOUT_P = 0.5
_SEED = 0
_NARROW = 8  # output width of the memory-bound GEMM


def no_sync() -> None:
    """The `sync` of a single process: nothing to wait for."""


def own_times(times: list[float]) -> list[float]:
    """The `slowest` of a single process: its own times."""
    return times


@dataclass(frozen=True)
class Pace:
    """How the ranks time a call together: `sync` before each call, then per call the
    `slowest` rank's time (identity and no-op in a single process).

    `window_s`: each timed sample repeats the call until this many seconds have passed and
    keeps the time per call. Workers sharing a core then share it for the whole window, as in
    training; one call of a few milliseconds would run within one scheduler slice, each
    sharing worker would time it alone, and a worker pinned beside another would look as fast
    as one alone on its core.
    """

    sync: Sync = no_sync
    slowest: Callable[[list[float]], list[float]] = field(default=own_times)
    window_s: float = 0.0


ALONE = Pace()


def median_seconds(fn: Callable[[], object], repeats: int, pace: Pace = ALONE) -> float:
    """Median over `repeats` calls of `fn` (after one warm-up call) of the slowest rank's time.

    `pace.sync` runs before every call, the warm-up included: under the probe worker every rank
    then runs the same kernel at the same moment, never beside another rank's set-up.
    """
    pace.sync()
    fn()
    times = []
    for _ in range(repeats):
        pace.sync()
        times.append(seconds_per_call(fn, pace.window_s))
    return max(statistics.median(pace.slowest(times)), 1e-9)  # a rate must stay finite


def seconds_per_call(fn: Callable[[], object], window_s: float) -> float:
    """Seconds per call of `fn`, called until `window_s` seconds have passed (at least once)."""
    start = time.perf_counter()
    calls = 0
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window_s:
            return elapsed / calls


# -- compute ----------------------------------------------------------------------------------


def regular_csr(num_rows: int, num_cols: int, num_edges: int, gen: torch.Generator) -> kernels.CSR:
    """An (R x C) CSR with E edges, E / R per row and E / C per column, at random places.

    Edge e reads column `perm[e] // (E / C)` for a random permutation `perm`, so the
    transpose comes in O(E) (no sort): column c's edges are those whose `perm` falls in its
    block, in the order of the inverse permutation.
    """
    per_row, per_col = num_edges // num_rows, num_edges // num_cols
    assert per_row * num_rows == num_edges == per_col * num_cols, "E must divide by R and C"
    perm_E = torch.randperm(num_edges, generator=gen)
    t_perm_E = torch.empty_like(perm_E)
    t_perm_E[perm_E] = torch.arange(num_edges)
    return kernels.CSR(
        indptr=torch.arange(num_rows + 1, dtype=torch.int32) * per_row,
        indices=(perm_E // per_col).to(torch.int32),
        values=torch.full((num_edges,), 0.5),
        num_rows=num_rows,
        num_cols=num_cols,
        t_indptr=torch.arange(num_cols + 1, dtype=torch.int32) * per_col,
        t_indices=(t_perm_E // per_row).to(torch.int32),
        t_perm=t_perm_E,
        max_degree=per_row,  # known here: the GPU SpMM skips its hub-row pass
        t_max_degree=per_col,
    )


def gather_shape(sizes: ProbeSizes, width: int, num_bytes: int) -> tuple[int, int, int]:
    """(rows gathered, rows written, edges) of a probe SpMM reading `num_bytes` at `width`.

    The gathered matrix has `num_bytes` (a multiple of `avg_degree` rows); every gathered
    row is read by the same number of edges, at least one and enough for `spmm_min_edges`;
    every written row sums `avg_degree` edges.
    """
    d = sizes.avg_degree
    big = max(d, num_bytes // (4 * width) // d * d)
    per_row = max(1, -(-sizes.spmm_min_edges // big))
    return big, big * per_row // d, big * per_row


def spmm_rates(
    sizes: ProbeSizes, width: int, num_bytes: int, pace: Pace = ALONE
) -> tuple[float, float]:
    """Edges per second of `A @ X` and of the backward `A^T @ G`, X and G of `num_bytes`."""
    gen = torch.Generator().manual_seed(_SEED)
    big, small, num_edges = gather_shape(sizes, width, num_bytes)
    forward = regular_csr(small, big, num_edges, gen)
    x_CF = torch.ones(big, width)
    forward_s = median_seconds(lambda: kernels.spmm(forward, x_CF), sizes.repeats, pace)
    backward = regular_csr(big, small, num_edges, gen)  # its transpose gathers G's big rows
    x_cF = torch.ones(small, width, requires_grad=True)
    out_RF = kernels.spmm(backward, x_cF)
    grad_RF = torch.ones(out_RF.shape)
    backward_s = median_seconds(
        lambda: torch.autograd.grad(out_RF, x_cF, grad_RF, retain_graph=True),
        sizes.repeats,
        pace,
    )
    return num_edges / forward_s, num_edges / backward_s


def dense_rows(elements: int, width: int) -> int:
    """Rows of one dense call of `elements` elements in all."""
    return max(1, elements // width)


def gemm_rates(sizes: ProbeSizes, width: int, pace: Pace = ALONE) -> tuple[float, float]:
    """FLOP/s of `F.linear` from `width` to `width` columns, and bytes (in + out) per second
    of `F.linear` from `width` to 8 columns (memory bound)."""
    rows = dense_rows(sizes.dense_elements, width)
    x_NF = torch.ones(rows, width)
    square, narrow = torch.ones(width, width), torch.ones(_NARROW, width)
    square_s = median_seconds(lambda: F.linear(x_NF, square), sizes.repeats, pace)
    narrow_s = median_seconds(lambda: F.linear(x_NF, narrow), sizes.repeats, pace)
    return 2.0 * rows * width * width / square_s, 4.0 * rows * (width + _NARROW) / narrow_s


def mask_rates(
    sizes: ProbeSizes, width: int, dropout: DropoutFn, pace: Pace = ALONE
) -> tuple[float, float]:
    """Rows per second of counter-based dropout forward (mask generation and apply, timed
    without a gradient to the input, as layer 0 draws it and draws it again) and of its
    autograd backward."""
    rows = dense_rows(sizes.mask_elements, width)
    gen = torch.Generator().manual_seed(_SEED)
    x_NF = torch.randn(rows, width, generator=gen, requires_grad=True)
    ids_N = torch.arange(rows, dtype=torch.int64)
    with torch.no_grad():
        forward_s = median_seconds(
            lambda: dropout(x_NF, ids_N, _DROPOUT_P, 12345), sizes.repeats, pace
        )
    y_NF = dropout(x_NF, ids_N, _DROPOUT_P, 12345)
    grad_NF = torch.ones(y_NF.shape)
    backward_s = median_seconds(
        lambda: torch.autograd.grad(y_NF, x_NF, grad_NF, retain_graph=True), sizes.repeats, pace
    )
    return rows / forward_s, rows / backward_s


def gather_rate(sizes: ProbeSizes, width: int, pace: Pace = ALONE) -> float:
    """Rows per second of `kernels.gather_rows` (random rows of a twice taller matrix)."""
    gen = torch.Generator().manual_seed(_SEED)
    rows = dense_rows(sizes.dense_elements, width)
    x_CF = torch.ones(2 * rows, width)
    idx_N = torch.randint(0, 2 * rows, (rows,), generator=gen)
    return rows / median_seconds(lambda: kernels.gather_rows(x_CF, idx_N), sizes.repeats, pace)


def scatter_add_rate(sizes: ProbeSizes, width: int, pace: Pace = ALONE) -> float:
    """Rows per second of `out.index_add_(0, idx, src)` into random rows of a taller matrix."""
    gen = torch.Generator().manual_seed(_SEED)
    rows = dense_rows(sizes.dense_elements, width)
    out_CF = torch.zeros(2 * rows, width)
    src_NF = torch.ones(rows, width)
    idx_N = torch.randint(0, 2 * rows, (rows,), generator=gen)
    seconds = median_seconds(lambda: out_CF.index_add_(0, idx_N, src_NF), sizes.repeats, pace)
    return rows / seconds


def pass_rate(sizes: ProbeSizes, num_bytes: int, pace: Pace = ALONE) -> float:
    """Output bytes per second of `a + b` into a fresh tensor of `num_bytes`."""
    a_N = torch.ones(max(1, num_bytes // 4))
    b_N = torch.ones_like(a_N)
    return 4 * a_N.numel() / median_seconds(lambda: a_N + b_N, sizes.repeats, pace)


def measure_compute(sizes: ProbeSizes, dropout: DropoutFn, pace: Pace = ALONE) -> ComputeRates:
    """Every compute rate at every width (and size) of `sizes`, for this process."""
    rates: dict[str, list[float]] = {
        n: [] for n in ComputeRates.model_fields if not n.startswith(("spmm", "pass", "widths"))
    }
    spmm = {(b, w): spmm_rates(sizes, w, b, pace) for b in sizes.spmm_bytes for w in sizes.widths}
    for width in sizes.widths:
        flop, narrow = gemm_rates(sizes, width, pace)
        rates["gemm_flop_per_s"].append(flop)
        rates["gemm_narrow_bytes_per_s"].append(narrow)
        forward, backward = mask_rates(sizes, width, dropout, pace)
        rates["mask_rows_per_s"].append(forward)
        rates["mask_backward_rows_per_s"].append(backward)
        rates["gather_rows_per_s"].append(gather_rate(sizes, width, pace))
        rates["scatter_add_rows_per_s"].append(scatter_add_rate(sizes, width, pace))
    return ComputeRates(
        widths=list(sizes.widths),
        spmm_bytes=list(sizes.spmm_bytes),
        spmm_edges_per_s=[[spmm[b, w][0] for w in sizes.widths] for b in sizes.spmm_bytes],
        spmm_t_edges_per_s=[[spmm[b, w][1] for w in sizes.widths] for b in sizes.spmm_bytes],
        pass_bytes=list(sizes.pass_bytes),
        pass_bytes_per_s=[pass_rate(sizes, b, pace) for b in sizes.pass_bytes],
        **rates,
    )


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
    per_rank = all_gather_(fits_K2[-1].clone()).tolist()  # each rank's all-pairs exchange
    dist.all_reduce(fits_K2)
    fits_K2[-1] /= world  # mean over ranks of the all-pairs exchange
    (bandwidth, latency), *_ = fits_K2[-1:].tolist()
    return LinkProfile(
        concurrent=LinkFit(bandwidth_bytes_per_s=bandwidth, latency_s=latency),
        pairs=[
            PairFit(ranks=p, bandwidth_bytes_per_s=f[0], latency_s=f[1])
            for p, f in zip(pairs, fits_K2[:-1].tolist(), strict=True)
        ],
        ranks=[LinkFit(bandwidth_bytes_per_s=bounded(b), latency_s=t) for b, t in per_rank],
    )


def bounded(rate: float, top: float = 1e14) -> float:
    """A rate within what a profile may hold (1 to `top` per second: 1e14 bytes, 1e13 rows or
    edges; one rank's copies can time ~0 s)."""
    return min(max(rate, 1.0), top)


def barrier_seconds(iters: int) -> float:
    """Median seconds of a barrier (after a warm-up), averaged over ranks."""
    mine = torch.tensor([median_seconds(dist.barrier, iters)], dtype=torch.float64)
    dist.all_reduce(mine)
    return float(mine) / dist.get_world_size()


def slowest_over_ranks(times: list[float]) -> list[float]:
    """Per call, the slowest rank's time (every rank gets the same list)."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


def barrier() -> None:
    """Every rank starts a timed call together (the contention of training)."""
    dist.barrier()


GROUP = Pace(sync=barrier, slowest=slowest_over_ranks)
"""The pace of a process group: start together, keep the slowest rank."""
EACH = Pace(sync=barrier, window_s=0.03)
"""Start together, keep this rank's own times (rates per rank), each sample a 30 ms window of
calls (about ten scheduler slices: workers pinned to one core are timed sharing it)."""


def alltoall_seconds(num_bytes: int, iters: int) -> float:
    """Median (slowest rank) seconds of one `all_to_all_single` sending `num_bytes` to every
    peer (and receiving as much from each), after one warm-up."""
    world = dist.get_world_size()
    send = torch.ones(max(1, num_bytes // 4) * world)
    recv = torch.empty_like(send)
    return median_seconds(lambda: dist.all_to_all_single(recv, send), iters, GROUP)


def alltoall_fit(sizes: ProbeSizes) -> LinkFit:
    """`seconds = latency + bytes received from all peers / bandwidth` of gloo's all-to-all."""
    peers = dist.get_world_size() - 1
    small = alltoall_seconds(sizes.small_message_bytes, sizes.small_iters)
    large = alltoall_seconds(sizes.large_message_bytes, sizes.large_iters)
    return fit_link(
        sizes.small_message_bytes * peers, small, sizes.large_message_bytes * peers, large
    )


def overlap_share(sizes: ProbeSizes) -> float:
    """How much of the shorter of a transfer and a computation hides behind the other.

    The transfer: one large message to and from every peer (isend/irecv, the pipeline's
    transport). The computation: GEMMs at width 64, as many as take about as long alone.
    Both alone, then both at once (the transfer posted first); share =
    (comm + work - both) / min(comm, work), clamped to [0, 1]; slowest ranks, medians.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    peers = [q for q in range(world) if q != rank]
    send = torch.ones(sizes.large_message_bytes // 4)
    recv = {q: torch.empty_like(send) for q in peers}

    def post() -> list[dist.Work]:
        works = [dist.irecv(recv[q], q) for q in peers] + [dist.isend(send, q) for q in peers]
        return [w for w in works if w is not None]

    def exchange() -> None:
        for w in post():
            w.wait()

    x_NF, weight = torch.ones(dense_rows(sizes.dense_elements, 64), 64), torch.ones(64, 64)
    gemm_s = median_seconds(lambda: F.linear(x_NF, weight), sizes.repeats, GROUP)
    comm_s = median_seconds(exchange, sizes.large_iters, GROUP)
    count = torch.tensor([max(1, round(comm_s / gemm_s))])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # every rank runs as many

    def work() -> None:
        for _ in range(int(count)):
            F.linear(x_NF, weight)

    def both() -> None:
        works = post()
        work()
        for w in works:
            w.wait()

    work_s = median_seconds(work, sizes.large_iters, GROUP)
    both_s = median_seconds(both, sizes.large_iters, GROUP)
    hidden = (comm_s + work_s - both_s) / min(comm_s, work_s)
    return min(1.0, max(0.0, hidden))


def in_place_read(sizes: ProbeSizes) -> InPlaceRead:
    """Every rank's SpMM rate over rows its next peer has just published in a shared segment,
    and over rows of its own memory it has just written (see `hardware.InPlaceRead`), at every
    width of `sizes`, over rows of the middle SpMM working-set size. Each sample: everyone
    writes its rows, a barrier, everyone times one SpMM (one call: a second would read rows
    this core has already fetched). Samples come in pairs, local then mapped and mapped then
    local in turn, 3 x `repeats` pairs after a warm-up pair; the medians are kept."""
    world, rank = dist.get_world_size(), dist.get_rank()
    num_bytes = sizes.spmm_bytes[len(sizes.spmm_bytes) // 2]
    block = max(gather_shape(sizes, w, num_bytes)[0] * w for w in sizes.widths)
    segment = open_segment(world * block, torch.float32)
    peer = (rank + 1) % world
    local_F, mapped_F = [], []
    gen = torch.Generator().manual_seed(_SEED)
    for width in sizes.widths:
        big, small, num_edges = gather_shape(sizes, width, num_bytes)
        csr = regular_csr(small, big, num_edges, gen)
        fresh_CF = torch.rand(big, width, generator=gen)
        own_CF = segment[rank * block : rank * block + big * width].view(big, width)
        read_CF = segment[peer * block : peer * block + big * width].view(big, width)
        local_CF = torch.empty(big, width)
        times: dict[bool, list[float]] = {False: [], True: []}
        for sample in range(2 * (3 * sizes.repeats + 1)):
            mapped = bool(sample % 2) != bool(sample // 2 % 2)  # L M, M L, L M, ...
            (own_CF if mapped else local_CF).copy_(fresh_CF)
            dist.barrier()
            start = time.perf_counter()
            kernels.spmm(csr, read_CF if mapped else local_CF)
            times[mapped].append(time.perf_counter() - start)
            dist.barrier()  # no peer writes the next sample while this rank still reads
        local_F.append(num_edges / max(statistics.median(times[False][1:]), 1e-9))
        mapped_F.append(num_edges / max(statistics.median(times[True][1:]), 1e-9))
    everyone = all_gather_(torch.tensor([local_F, mapped_F], dtype=torch.float64))
    return InPlaceRead(
        widths=list(sizes.widths),
        working_bytes=num_bytes,
        local_edges_per_s=[[bounded(v, 1e13) for v in r[0]] for r in everyone.tolist()],
        mapped_edges_per_s=[[bounded(v, 1e13) for v in r[1]] for r in everyone.tolist()],
    )


def measure_links(sizes: ProbeSizes, same_host: bool) -> Links:
    """gloo and (on one host) shared-memory fits between the ranks of the process group, and
    (on one host) the rate of reading rows in place."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Links(gloo=None, shm=None, barrier_s=None, alltoall=None, overlap=None)
    gloo = link_profile(gloo_fit, sizes, everyone_fits=False)
    shm = in_place = None
    if same_host:
        blocks = ShmBlocks(sizes.large_message_bytes)
        shm = link_profile(blocks.fit, sizes, everyone_fits=True)
        del blocks
        in_place = in_place_read(sizes)
    return Links(
        in_place=in_place,
        gloo=gloo,
        shm=shm,
        barrier_s=barrier_seconds(sizes.small_iters),
        alltoall=alltoall_fit(sizes),
        overlap=overlap_share(sizes),
    )
