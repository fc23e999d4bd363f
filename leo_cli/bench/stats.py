"""Statistics of a benchmark on a shared, noisy machine: robust medians and paired ratios.

Rule for disturbed epochs (documented in docs/guide.md): within one run, an epoch slower than
the run's median by more than 3 scaled median absolute deviations (and by more than 5%) is
dropped as disturbed by other load. Only epochs above the median go, so at most half of a
run's epochs are ever dropped.
Ratios and the hidden share are paired by round (variants run interleaved A B C A B C ...),
so slow phases of the machine hit both sides; the interval is a seeded bootstrap of the median
from five rounds on, the range of the per-round values below (`interval` says which).
"""

from __future__ import annotations

import random
import statistics

MAD_SCALE = 1.4826  # makes the MAD estimate a normal distribution's standard deviation
OUTLIER_MADS = 3.0
MIN_EXCESS = 0.05
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_MIN_ROUNDS = 5  # fewer rounds get their range instead of a bootstrap interval


def drop_disturbed(times: list[float]) -> list[float]:
    """The epochs of one run without those disturbed by other load (see module docstring)."""
    if len(times) < 3:
        return list(times)
    med = statistics.median(times)
    mad = MAD_SCALE * statistics.median(abs(t - med) for t in times)
    limit = med + max(OUTLIER_MADS * mad, MIN_EXCESS * med)
    return [t for t in times if t <= limit]  # the limit is above the median: half stay


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: list[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile."""
    return {
        "median": statistics.median(values),
        "p10": quantile(values, 0.1),
        "p90": quantile(values, 0.9),
    }


def interval(values: list[float], seed: int = 0) -> dict[str, float | str | None]:
    """The median of per-round values with an interval that says what it is.

    From `BOOTSTRAP_MIN_ROUNDS` rounds on: a seeded 95% bootstrap interval of the median
    (`interval: "bootstrap95"`). Below that a bootstrap of a median only returns the values
    themselves (of three rounds, min and max: at best a 75% interval), so the interval is
    the range of the values and says so (`"range"`). One value: no interval.
    """
    if not values:
        return {"value": None, "ci_low": None, "ci_high": None, "interval": None}
    out: dict[str, float | str | None] = {"value": statistics.median(values)}
    if len(values) < 2:
        return {**out, "ci_low": None, "ci_high": None, "interval": None}
    if len(values) < BOOTSTRAP_MIN_ROUNDS:
        return {**out, "ci_low": min(values), "ci_high": max(values), "interval": "range"}
    rng = random.Random(seed)
    boot = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_SAMPLES)
    )
    low, high = quantile(boot, 0.025), quantile(boot, 0.975)
    return {**out, "ci_low": low, "ci_high": high, "interval": "bootstrap95"}


def paired_ratio(
    num: list[float], den: list[float], seed: int = 0
) -> dict[str, float | str | None]:
    """Median of per-round ratios num[r] / den[r], with its interval (see `interval`).

    Args:
        num: one value per round (e.g. the median epoch time of a variant in that round).
        den: the baseline's value in the same rounds.
    """
    ratios = [a / b for a, b in zip(num, den, strict=True) if b > 0]
    return interval(ratios, seed)


def hidden_share(
    blocking: list[float], pipelined: list[float], floor: list[float], seed: int = 0
) -> dict[str, float | str | None]:
    """(blocking - pipelined) / (blocking - floor) per round, with its interval; rounds where
    the floor is not below blocking have no share and are left out."""
    shares = [
        (b - p) / (b - f) for b, p, f in zip(blocking, pipelined, floor, strict=True) if b > f
    ]
    return interval(shares, seed)
