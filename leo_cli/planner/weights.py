"""Each worker's speed for the model at hand, from the probe's per-rank rates: the weights that
size the parts when `partition.part_weights=measured`; and what one node and one in-edge cost,
the vertex weights of unequal parts (`work_costs`).

A rank's speed is the work it gets through per second of its own computation, as the cost
model prices it with that rank's rates, halo left out; shares start equal and are refined a few
times, so rates that change with a part's size are priced at the size the part will have.

Specification: docs/design/planning.md.
Legend: N nodes, E directed edges, P parts.
"""

from __future__ import annotations

import statistics

import numpy as np

from leo_cli.config.schema import MAX_SHARE_RATIO
from leo_cli.errors import CacheError
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape, predict
from leo_cli.planner.plan import RankCache
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.registry import planned_mode

REFINEMENTS = 3  # share updates; the shares move by well under 1% after the third


def measured_weights(
    hw: HardwareProfile, shape: ModelShape, num_nodes: int, num_edges: int, static: bool
) -> list[float]:
    """Each rank's share of the work (summing to 1), proportional to its measured speed.

    Args:
        hw: the profile, measured with one worker per part.
        shape: the model.
        num_nodes, num_edges: the graph's N and E.
        static: layer 0 runs on the static aggregate (cache level L1s).

    Raises:
        CacheError: the profile was measured with another worker count.
    """
    num = hw.world_size
    shares = [1.0 / num] * num
    for _ in range(REFINEMENTS):
        busy = busy_seconds(hw, shape, num_nodes, num_edges, static, shares)
        speeds = [s / max(b, 1e-12) for s, b in zip(shares, busy, strict=True)]
        shares = bounded([v / sum(speeds) for v in speeds])
    return shares


def bounded(shares: list[float]) -> list[float]:
    """Shares with none below the largest / MAX_SHARE_RATIO (a rank measured near zero speed
    still gets a part of that size), summing to 1."""
    floor = max(shares) / MAX_SHARE_RATIO
    raised = [max(s, floor) for s in shares]
    return [s / sum(raised) for s in raised]


def busy_seconds(
    hw: HardwareProfile,
    shape: ModelShape,
    num_nodes: int,
    num_edges: int,
    static: bool,
    shares: list[float],
) -> list[float]:
    """Each rank's predicted seconds of its own work on a halo-less part of its share."""
    num = len(shares)
    if hw.world_size != num:
        raise CacheError(
            f"The hardware profile was measured with {hw.world_size} workers, not {num}; "
            "probe again with partition.num_parts workers."
        )
    sizes = [(max(1, round(s * num_nodes)), round(s * num_edges)) for s in shares]
    return halo_less_busy(hw, shape, static, sizes)


def work_costs(
    hw: HardwareProfile, shape: ModelShape, num_nodes: int, num_edges: int, static: bool
) -> tuple[float, float]:
    """Seconds of one training step per node and per in-edge: what a node weighs when the
    parts are unequal (graph/partitioners.py `WorkMeasure`, the `cost` rule).

    Priced on a halo-less part of the average size (N/P nodes, E/P edges) with every rank's
    own rates, averaged over the ranks (their differences are in the part weights, not in
    what a node weighs). At a given part size the SpMM is linear in the edges, so the same
    part with twice the edges gives the seconds per edge; the rest of the part's time, per
    node, is its dense work (GEMMs, masks, passes; all of layer 0's on the static aggregate).
    """
    num = hw.world_size
    nodes, edges = max(1, round(num_nodes / num)), max(1, round(num_edges / num))
    once = halo_less_busy(hw, shape, static, [(nodes, edges)] * num)
    twice = halo_less_busy(hw, shape, static, [(nodes, 2 * edges)] * num)
    per_edge = statistics.fmean(b - a for a, b in zip(once, twice, strict=True)) / edges
    per_node = (statistics.fmean(once) - per_edge * edges) / nodes
    # The rates are interpolated between measured sizes; METIS needs every weight positive.
    per_edge = max(per_edge, 0.0)
    return max(per_node, 1e-3 * statistics.fmean(once) / nodes), per_edge


def halo_less_busy(
    hw: HardwareProfile, shape: ModelShape, static: bool, sizes: list[tuple[int, int]]
) -> list[float]:
    """Each rank's predicted seconds of its own work on a part of (nodes, in-edges) without
    halo, priced with its own rates (one size per rank of the profile)."""
    num = len(sizes)
    none = np.zeros(0, dtype=np.int64)
    parts = [
        PartAccess(
            rank=r,
            num_inner=nodes,
            num_boundary=0,
            inner_edges=edges,
            reuse_H=none,
            owner_H=none,
            send_counts=[0] * num,
            recv_counts=[0] * num,
            rows_reading_halo=0,
        )
        for r, (nodes, edges) in enumerate(sizes)
    ]
    caches = [RankCache(static) for _ in parts]
    chunks = [1] * shape.num_layers
    prediction = predict(parts, caches, shape, hw, planned_mode(), chunks)
    return [t["busy_s"] for t in prediction.per_rank]
