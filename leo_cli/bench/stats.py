"""Statistics of a benchmark on a shared, noisy machine: robust medians and paired ratios.

Rule for disturbed epochs (documented in the README): within one run, an epoch slower than
the run's median by more than 3 scaled median absolute deviations (and by more than 5%) is
dropped as disturbed by other load; at most half of a run's epochs are ever dropped.
Ratios are paired by round (variants run interleaved A B C A B C ...), so slow phases of the
machine hit both sides of a ratio; the interval is a seeded bootstrap of the median ratio.
"""

from __future__ import annotations

import random
import statistics

MAD_SCALE = 1.4826  # makes the MAD estimate a normal distribution's standard deviation
OUTLIER_MADS = 3.0
MIN_EXCESS = 0.05
BOOTSTRAP_SAMPLES = 2000


def drop_disturbed(times: list[float]) -> list[float]:
    """The epochs of one run without those disturbed by other load (see module docstring)."""
    if len(times) < 3:
        return list(times)
    med = statistics.median(times)
    mad = MAD_SCALE * statistics.median(abs(t - med) for t in times)
    limit = med + max(OUTLIER_MADS * mad, MIN_EXCESS * med)
    kept = [t for t in times if t <= limit]
    return kept if 2 * len(kept) >= len(times) else sorted(times)[: (len(times) + 1) // 2]


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


def paired_ratio(num: list[float], den: list[float], seed: int = 0) -> dict[str, float | None]:
    """Median of per-round ratios num[r] / den[r] with a 95% bootstrap interval.

    Args:
        num: one value per round (e.g. the median epoch time of a variant in that round).
        den: the baseline's value in the same rounds.
    """
    ratios = [a / b for a, b in zip(num, den, strict=True) if b > 0]
    if not ratios:
        return {"ratio": None, "ci_low": None, "ci_high": None}
    if len(ratios) < 3:
        return {"ratio": statistics.median(ratios), "ci_low": None, "ci_high": None}
    rng = random.Random(seed)
    boot = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_SAMPLES)
    )
    return {
        "ratio": statistics.median(ratios),
        "ci_low": quantile(boot, 0.025),
        "ci_high": quantile(boot, 0.975),
    }
