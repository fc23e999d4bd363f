"""Robust statistics of the benchmark: disturbed epochs, spreads, paired ratios."""

from __future__ import annotations

import pytest

from leo_cli.bench import stats


def test_a_disturbed_epoch_is_dropped_and_steady_ones_kept() -> None:
    times = [1.0, 1.02, 0.98, 1.01, 3.5, 0.99]
    assert stats.drop_disturbed(times) == [1.0, 1.02, 0.98, 1.01, 0.99]
    steady = [1.0, 1.03, 0.97, 1.02]
    assert stats.drop_disturbed(steady) == steady


def test_never_more_than_half_is_dropped() -> None:
    kept = stats.drop_disturbed([1.0, 1.0, 5.0, 6.0, 7.0, 8.0])
    assert len(kept) >= 3


def test_spread_and_quantiles() -> None:
    s = stats.spread([float(v) for v in range(11)])
    assert s == {"median": 5.0, "p10": 1.0, "p90": 9.0}


def test_paired_ratio_uses_rounds() -> None:
    # The machine got slower in round 3 for both variants: pairing removes it.
    r = stats.paired_ratio([0.5, 0.5, 1.0, 0.5], [1.0, 1.0, 2.0, 1.0])
    assert r["value"] == pytest.approx(0.5)
    assert r["ci_low"] == pytest.approx(0.5) and r["ci_high"] == pytest.approx(0.5)
    assert stats.paired_ratio([1.0], [2.0])["ci_low"] is None


def test_few_rounds_give_their_range_and_say_so() -> None:
    """A bootstrap of the median of three values only returns them: below five rounds the
    interval is the range of the per-round values, labelled as such."""
    r = stats.interval([0.4, 0.6, 0.5])
    assert r == {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6, "interval": "range"}
    five = stats.interval([0.40, 0.45, 0.50, 0.55, 0.60])
    assert five["interval"] == "bootstrap95"
    assert 0.40 <= five["ci_low"] <= 0.5 <= five["ci_high"] <= 0.60
    assert stats.interval([0.5])["interval"] is None
