"""The in-process probe: compute rates at tiny sizes are positive and finite; the link fit's
arithmetic; the probe's CSR has the promised shape."""

from __future__ import annotations

import math

import pytest
import torch

from leo_cli.cache.hardware import ProbeSizes
from leo_cli.cache.probe import (
    QUICK_SIZES,
    fit_link,
    measure_compute,
    measure_links,
    median_seconds,
    random_csr,
)
from leo_cli.models.dropout import counter_dropout

TINY = ProbeSizes(widths=(4, 16), spmm_elements=4096, dense_elements=1024, repeats=2)


def test_compute_rates_are_positive_and_finite() -> None:
    calls = []
    rates = measure_compute(TINY, counter_dropout, sync=lambda: calls.append(1))
    assert rates.widths == [4, 16]
    for name in type(rates).model_fields:
        values = getattr(rates, name)
        assert len(values) == 2 and all(v > 0 and math.isfinite(v) for v in values), name
    # One sync before each call: 6 measurements x 2 widths x (warm-up + 2 repeats).
    assert len(calls) == 6 * 2 * (1 + TINY.repeats)


def test_quick_sizes_are_valid() -> None:
    assert QUICK_SIZES.large_message_bytes > QUICK_SIZES.small_message_bytes
    assert len(QUICK_SIZES.widths) >= 2


def test_median_seconds_warms_up_then_times() -> None:
    calls: list[int] = []
    seconds = median_seconds(lambda: calls.append(1), repeats=3)
    assert len(calls) == 4 and 0 < seconds < 1


def test_random_csr_shape() -> None:
    adj = random_csr(100, 5, torch.Generator().manual_seed(0))
    assert (adj.num_rows, adj.num_cols, adj.num_edges) == (100, 200, 500)
    assert int(adj.indptr[-1]) == 500 and int(adj.indices.max()) < 200


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
