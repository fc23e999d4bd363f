"""The in-process probe: compute rates at tiny sizes are positive and finite; the link fit's
arithmetic; the probe's CSR has the promised shape."""

from __future__ import annotations

import math

import pytest
import torch

from leo_cli.models.dropout import counter_dropout
from leo_cli.planner.profile import measure
from leo_cli.planner.profile.hardware import ProbeSizes
from leo_cli.planner.profile.measure import (
    EACH,
    QUICK_SIZES,
    Pace,
    fit_link,
    gather_shape,
    measure_compute,
    measure_links,
    median_seconds,
    regular_csr,
)

TINY = ProbeSizes(
    widths=(4, 16),
    spmm_bytes=(1024, 4096),
    spmm_min_edges=256,
    dense_elements=1024,
    mask_elements=256,
    pass_bytes=(1024, 8192),
    repeats=2,
)


def test_compute_rates_are_positive_and_finite() -> None:
    calls: list[int] = []
    slowest: list[int] = []

    def keep(times: list[float]) -> list[float]:
        slowest.append(len(times))
        return times

    rates = measure_compute(TINY, counter_dropout, Pace(lambda: calls.append(1), keep))
    assert rates.widths == [4, 16] and rates.spmm_bytes == [1024, 4096]
    for name in type(rates).model_fields:
        values = getattr(rates, name)
        tables = ("spmm_edges_per_s", "spmm_t_edges_per_s")
        flat = [v for row in values for v in row] if name in tables else values
        assert len(flat) == (4 if name in tables else 2), name  # 2 widths, 2 sizes
        assert all(v > 0 and math.isfinite(v) for v in flat), name
    # Measurements: 2 SpMM per (size, width), 2 GEMM, 2 dropout, gather, scatter-add per
    # width, one pass per size; each syncs before its warm-up and its 2 timed calls, and
    # keeps the slowest rank's times once.
    count = 2 * 2 * 2 + 6 * 2 + 2
    assert len(calls) == count * (1 + TINY.repeats) and slowest == [TINY.repeats] * count


def test_quick_sizes_are_valid() -> None:
    assert QUICK_SIZES.large_message_bytes > QUICK_SIZES.small_message_bytes
    assert len(QUICK_SIZES.widths) >= 2 and len(QUICK_SIZES.spmm_bytes) >= 2


def test_median_seconds_warms_up_then_times() -> None:
    calls: list[int] = []
    seconds = median_seconds(lambda: calls.append(1), repeats=3)
    assert len(calls) == 4 and 0 < seconds < 1
    # The slowest rank's times decide.
    slow = median_seconds(lambda: None, 3, Pace(slowest=lambda t: [5.0, 1.0, 7.0]))
    assert slow == 5.0


def test_per_rank_samples_share_the_core_for_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-rank sample repeats the call for a whole window and keeps the time per call: two
    workers on one core then each see half of it (a 1 ms call timed alone would fit in one
    scheduler slice, and each would time it at full speed)."""
    clock = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    calls: list[int] = []

    def call() -> None:  # a call of 2 ms
        calls.append(1)
        clock[0] += 0.002

    window = Pace(window_s=0.01)
    assert median_seconds(call, repeats=3, pace=window) == pytest.approx(0.002)
    assert len(calls) == 1 + 3 * 5  # the warm-up, then 5 calls per 10 ms sample
    calls.clear()
    assert median_seconds(call, repeats=3) == pytest.approx(0.002) and len(calls) == 4
    assert EACH.window_s >= 0.01  # the probe's per-rank rates are timed over windows


def test_regular_csr_transpose_matches_the_built_one() -> None:
    adj = regular_csr(6, 4, 12, torch.Generator().manual_seed(1))
    assert torch.bincount(adj.indices.long(), minlength=4).tolist() == [3, 3, 3, 3]
    dense = torch.zeros(6, 4)
    rows = torch.repeat_interleave(torch.arange(6), 2)
    dense.index_put_((rows, adj.indices.long()), adj.values, accumulate=True)
    t_rows = torch.repeat_interleave(torch.arange(4), 3)
    t_dense = torch.zeros(4, 6)
    t_dense.index_put_((t_rows, adj.t_indices.long()), adj.values[adj.t_perm], accumulate=True)
    assert torch.equal(t_dense, dense.T)


def test_gather_shape_reads_every_row_and_sums_avg_degree() -> None:
    sizes = ProbeSizes(avg_degree=16, spmm_min_edges=1)
    big, small, edges = gather_shape(sizes, 64, 1 << 20)  # 4096 rows of 256 B
    assert (big, small, edges) == (4096, 256, 4096)
    big, small, edges = gather_shape(ProbeSizes(spmm_min_edges=8192), 64, 1 << 20)
    assert (big, edges, small * 16) == (4096, 8192, 8192)  # two edges per gathered row


def test_fit_link_arithmetic() -> None:
    # 1 ms + bytes / 1 GB/s, through 1000 B and 1 MB.
    fit = fit_link(1000, 1e-3 + 1e-6, 10**6, 1e-3 + 1e-3)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-9)
    assert fit.latency_s == pytest.approx(1e-3, rel=1e-9)
    # Noise: the large message no slower than the small one.
    noisy = fit_link(1000, 2e-3, 10**6, 1e-3)
    assert noisy.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert noisy.latency_s == pytest.approx(2e-3 - 1e-6)


def test_links_need_a_group() -> None:
    links = measure_links(TINY, same_host=True)
    assert links.gloo is None and links.shm is None and links.barrier_s is None
