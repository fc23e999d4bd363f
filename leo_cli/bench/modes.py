"""What `bench.modes` names: the runs a cache plan prices (registry `Priced`: every mode, and
the planned mode without a cache), each with the part it plays in `leo bench`'s ratios and the
cache policy the bench runs it with.

The roles: the exact reference of every ratio (`baseline`), the computation with no transfer
(`floor`) and the pipeline without a cache (`overlap`); the hidden share is
(baseline - overlap) / (baseline - floor). They are named, not found by capability, so a new
mode never takes one over (tests/test_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from leo_cli.registry import NO_CACHE, Mode, Priced, priced_runs

BenchRole = Literal["baseline", "floor", "overlap"]

ROLES: dict[BenchRole, str] = {
    "baseline": "blocking",
    "floor": "compute-only",
    "overlap": "leo-no-cache",
}


@dataclass(frozen=True)
class BenchMode:
    """One name of `bench.modes` (but `auto`): the run it times and the part it plays.

    Attributes:
        priced: the run: a pipeline mode, with the plan's levels or without a cache.
        role: its part in the ratios (`ROLES`), or None.
    """

    priced: Priced
    role: BenchRole | None = None

    @property
    def name(self) -> str:
        return self.priced.name

    @property
    def runs(self) -> Mode:
        """The pipeline mode a row of it trains in."""
        return self.priced.runs

    @property
    def policy(self) -> str | None:
        """The `cache.policy` its rows run with: None, the config's, for the run with the
        plan's levels; else none (what the paper compares against has no cache)."""
        return None if self.priced.cached else NO_CACHE


def bench_modes() -> list[BenchMode]:
    """Every `bench.modes` name's record, in the registry's order."""
    role = {name: r for r, name in ROLES.items()}
    return [BenchMode(p, role.get(p.name)) for p in priced_runs()]


def bench_mode_of(name: str) -> BenchMode:
    """The record of a `bench.modes` name (validated by the config schema; not `auto`)."""
    return next(m for m in bench_modes() if m.name == name)


def baseline_mode() -> str:
    """The exact reference every ratio of `leo bench` is against: one all-to-all of the
    deduplicated halo, no overlap."""
    return ROLES["baseline"]


def floor_mode() -> str:
    """The computation without any transfer: the floor of the hidden share."""
    return ROLES["floor"]


def overlap_mode() -> str:
    """The pipeline without a cache: what the hidden share measures (same computation as the
    floor, plus the transfers)."""
    return ROLES["overlap"]
