"""Rate lookups on a hardware profile: seconds of each kind of work the cost model prices.

The profile (planner/profile/hardware.py) is the probe's data and its file; what the cost
model asks of it (an SpMM over so many edges at a width, a GEMM, a mask, a pass, a transfer
over a link) is looked up here, by interpolating between the measured widths and sizes.
`Rates(hw, r)` prices rank r's work with its own rates; `Rates(hw)` with the slowest rank's.
"""

from __future__ import annotations

import bisect
import math
import statistics

from leo_cli.errors import CacheError
from leo_cli.planner.profile.hardware import (
    HardwareProfile,
    Link,
    LinkFit,
    interpolate,
    per_row_rate,
)


def settled(rates_by_size: list[float]) -> list[float]:
    """Rates measured at growing working-set sizes, none above the one before it past the
    fastest: a larger working set does not stream faster once it has left the caches, so a
    measured rise there is noise of one timing (seen: a pass at 32 MiB timed 2x faster than
    at 16 MiB, which priced a rank's passes 2x too cheap). Below the fastest size the rates
    stand (small sizes pay per-call overheads)."""
    peak = max(range(len(rates_by_size)), key=rates_by_size.__getitem__)
    out = list(rates_by_size)
    for i in range(peak + 1, len(out)):
        out[i] = min(out[i], out[i - 1])
    return out


class Rates:
    """Seconds of work on the machine a profile describes, for one rank or the slowest.

    Raises:
        CacheError: `rank` is not a rank of the profile.
    """

    def __init__(self, hw: HardwareProfile, rank: int | None = None) -> None:
        self.hw = hw
        self.rank = rank
        self.compute = hw.compute if rank is None else hw.rank_compute(rank)
        self.pass_rates = settled(self.compute.pass_bytes_per_s)  # by pass_bytes

    @property
    def dtype_bytes(self) -> int:
        return self.hw.dtype_bytes

    # -- compute ------------------------------------------------------------------------------

    def spmm_seconds(
        self, num_edges: float, width: int, backward: bool = False, working_bytes: float = 0
    ) -> float:
        """Seconds of one SpMM over `num_edges` edges at `width` (backward: `A^T @ G`).

        `working_bytes`: the bytes of the matrix the edges gather rows from (X forward, G
        backward); the rate is looked up log-log between the measured sizes, clamped (0: the
        smallest, rows that stay cached).
        """
        if num_edges <= 0:
            return 0.0
        c = self.compute
        table = c.spmm_t_edges_per_s if backward else c.spmm_edges_per_s
        per_size = settled([per_row_rate(c.widths, row, width) for row in table])
        size = max(float(working_bytes), float(c.spmm_bytes[0]))
        return num_edges / interpolate(c.spmm_bytes, per_size, size)

    def in_place_slowdown(self) -> float:
        """How many times an SpMM's (or scatter-add's) time when the rows it reads are a
        peer's published rows, read in place (hardware.InPlaceRead; 1 where the profile did not
        measure it)."""
        measured = self.hw.links.in_place
        return 1.0 if measured is None else measured.slowdown(self.rank)

    def gemm_seconds(self, rows: float, in_width: int, out_width: int) -> float:
        """Seconds of `F.linear` on (rows x in_width) with an (out_width x in_width) weight.

        A roofline: the larger of its FLOP (2 x rows x in x out) at the square GEMM's FLOP/s
        (looked up at the geometric mean width) and its bytes (rows x (in + out) elements) at
        the narrow GEMM's bytes/s (looked up at the wider side). A layer's backward costs two
        more of these: (rows x out) @ (out x in) and the weight gradient (in x rows) @ (rows x
        out), with the same FLOP and bytes.
        """
        if rows <= 0:
            return 0.0
        c = self.compute
        flop = 2.0 * rows * in_width * out_width
        compute_s = flop / interpolate(c.widths, c.gemm_flop_per_s, math.sqrt(in_width * out_width))
        moved = rows * (in_width + out_width) * self.hw.dtype_bytes
        memory_s = moved / interpolate(
            c.widths, c.gemm_narrow_bytes_per_s, max(in_width, out_width)
        )
        return max(compute_s, memory_s)

    def mask_seconds(self, rows: float, width: int, backward: bool = False) -> float:
        """Seconds of counter-based dropout on (rows x width): forward (mask + apply) or its
        backward (the mask applied to the gradient)."""
        c = self.compute
        rates = c.mask_backward_rows_per_s if backward else c.mask_rows_per_s
        return rows / per_row_rate(c.widths, rates, width)

    def gather_seconds(self, rows: float, width: int) -> float:
        """Seconds to gather `rows` rows of `width` into a contiguous buffer (pack)."""
        return rows / per_row_rate(self.compute.widths, self.compute.gather_rows_per_s, width)

    def scatter_add_seconds(self, rows: float, width: int) -> float:
        """Seconds to add `rows` received rows of `width` into their places (unpack)."""
        rates = self.compute.scatter_add_rows_per_s
        return rows / per_row_rate(self.compute.widths, rates, width)

    def pass_seconds(self, rows: float, width: int) -> float:
        """Seconds of one elementwise pass writing a fresh (rows x width) tensor (an add, a
        ReLU, a copy), at the rate of the largest measured output size not above its own."""
        num_bytes = rows * width * self.hw.dtype_bytes
        if num_bytes <= 0:
            return 0.0
        c = self.compute
        i = max(0, bisect.bisect_right(c.pass_bytes, num_bytes) - 1)
        return num_bytes / self.pass_rates[i]

    def fresh_seconds(self, rows: float, width: int) -> float:
        """Seconds a fresh (rows x width) buffer costs beyond writing it at the fastest
        measured pass rate: the page faults of new memory (0 where the allocator reuses it).
        Kernels whose probe output was small pay this for their real, larger outputs."""
        num_bytes = rows * width * self.hw.dtype_bytes
        if num_bytes <= 0:
            return 0.0
        return self.pass_seconds(rows, width) - num_bytes / max(self.compute.pass_bytes_per_s)

    # -- links --------------------------------------------------------------------------------

    def transfer_seconds(
        self,
        num_bytes: float,
        num_messages: int,
        link: Link = "gloo",
        *,
        concurrent: bool = True,
        pair: tuple[int, int] | None = None,
    ) -> float:
        """Seconds to move `num_bytes` to one peer in `num_messages` messages over `link`.

        Args:
            num_bytes: bytes sent to that peer (its replies flow at the same time).
            num_messages: messages they travel in (each pays the latency once).
            link: `gloo` (the process group) or `shm` (a shared segment + barrier).
            concurrent: every worker exchanges with every peer at once (a layer's exchange);
                False: this pair alone.
            pair: the two ranks, for their own isolated fit (implies concurrent=False).
        """
        fit = self.link_fit(link, concurrent=concurrent, pair=pair)
        return num_bytes / fit.bandwidth_bytes_per_s + num_messages * fit.latency_s

    def link_fit(
        self, link: Link, *, concurrent: bool = True, pair: tuple[int, int] | None = None
    ) -> LinkFit:
        """The fit for `link`: all pairs at once, one given pair, or the median pair."""
        profile = self.hw.links.gloo if link == "gloo" else self.hw.links.shm
        if profile is None:
            why = "one worker" if self.hw.world_size == 1 else "workers on several hosts"
            raise CacheError(
                f"The hardware profile has no {link} link measurement (probed with {why}); "
                "probe again with every worker on one host and partition.num_parts >= 2."
            )
        if pair is not None:
            wanted = (min(pair), max(pair))
            for fit in profile.pairs:
                if fit.ranks == wanted:
                    return fit
            raise CacheError(
                f"The hardware profile has no pair {wanted} (probed with {self.hw.world_size} "
                "workers); probe again with the worker count you train with."
            )
        if concurrent:
            if self.rank is not None and profile.ranks is not None:
                return profile.ranks[self.rank]
            return profile.concurrent
        return LinkFit(
            bandwidth_bytes_per_s=statistics.median(p.bandwidth_bytes_per_s for p in profile.pairs),
            latency_s=statistics.median(p.latency_s for p in profile.pairs),
        )

    def hosts(self) -> list[str] | None:
        """Each rank's host where the profile spans several (None: one host, or ranks that
        did not say): what decides which pairs share a node's link."""
        names = [r.hostname for r in self.hw.ranks]
        if len(names) != self.hw.world_size or len(set(names)) < 2:
            return None
        return names

    def cross_host_fit(self) -> LinkFit:
        """The process group between hosts: the median of the pairs on different hosts, each
        measured alone (a node's link carrying one pair's exchange)."""
        hosts = self.hosts()
        gloo = self.hw.links.gloo
        assert hosts is not None and gloo is not None, "a profile of several hosts"
        fits = [p for p in gloo.pairs if hosts[p.ranks[0]] != hosts[p.ranks[1]]]
        return LinkFit(
            bandwidth_bytes_per_s=statistics.median(p.bandwidth_bytes_per_s for p in fits),
            latency_s=statistics.median(p.latency_s for p in fits),
        )

    def barrier_seconds(self) -> float:
        """Seconds of one barrier of all workers (0 for a single worker)."""
        return self.hw.links.barrier_s or 0.0

    def alltoall_seconds(self, num_bytes: float) -> float:
        """Seconds of one gloo `all_to_all_single` in which the busiest worker receives (or
        sends) `num_bytes` from (to) all its peers together (0 for a single worker)."""
        fit = self.hw.links.alltoall
        if fit is None:
            return 0.0
        return fit.latency_s + num_bytes / fit.bandwidth_bytes_per_s

    def overlap_share(self) -> float:
        """Share of the shorter of transfer and computation hidden when both run (0 alone)."""
        return self.hw.links.overlap or 0.0
