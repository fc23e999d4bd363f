"""Cache policies: which halo rows each rank keeps at which level, under the budgets.

`none` exchanges every halo row (L2); `degree` replicates the most-read rows (L1) first; `leo`
lets the cost model choose the replicas per rank and the chunk counts that minimise the slowest
rank's predicted step. Every policy but `none` uses the static aggregate (L1s) when layer 0's
input never changes, and moves rows past `cache.halo_budget_mb` to L3 where they can be read in
place. Attention models and rounded rows (`pipeline.halo_dtype`) get fewer levels.

Specification: docs/design/cache-levels.md.
Legend: H halo rows of a rank, R replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from leo_cli.errors import CacheError
from leo_cli.graph.types import IntArray
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape, Prediction, predict
from leo_cli.planner.plan import RankCache
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.profile.rates import Rates
from leo_cli.planner.reach import Reach
from leo_cli.registry import planned_mode, policy_of

PLANNED = planned_mode()  # the mode whose levels and chunks a policy decides
CHUNK_CHOICES = (1, 2, 4, 8)
REPLICA_FRACTIONS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
# Shares of every rank's whole halo replicated at once: the curve of cache-plan.png, and the
# policy's starting point (the best of them that fits the budgets).
SWEEP_SHARES = (0.0, 0.125, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Budgets:
    """Bytes per rank for L1 replicas and for the L2 halo buffer."""

    replica_bytes: list[int]
    halo_bytes: list[int]


@dataclass
class Decision:
    """What a policy decided, and what the cost model predicts for it.

    `sweep`: the predicted step with every rank replicating the same share of its halo, one
    point per share of SWEEP_SHARES (`replica_share`, `replica_budget_mb` the largest rank's
    replica bytes, `predicted_epoch_time_s`, `within_budget`); empty where replicas do not
    apply (no policy, the static aggregate, attention, no hardware profile).
    """

    caches: list[RankCache]
    num_chunks: list[int]
    prediction: Prediction | None
    sweep: list[dict[str, float | bool]] = field(default_factory=list)


def spill_to_l3(
    accesses: list[PartAccess], budgets: Budgets, row_bytes: int, reach: Reach
) -> list[IntArray]:
    """Per rank, the rows that go to L3 so its deduplicated halo buffer fits
    `cache.halo_budget_mb`: the least-read rows among those it can read in place.

    Raises:
        CacheError: a rank's buffer does not fit even with every such row at L3.
    """
    out = []
    for r, p in enumerate(accesses):
        keep = budgets.halo_bytes[r] // max(row_bytes, 1)  # rows the buffer holds
        excess = p.num_halo - keep
        if excess <= 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        movable = np.nonzero(reach.published[r][p.owner_H])[0]
        if movable.shape[0] < excess:
            need = p.num_halo * row_bytes
            how = (
                "rows spill to L3 only where they are read in place: CPU workers on one host, "
                "pipeline.transport auto or shared-memory, a mode that reads in place, no "
                "attention, pipeline.halo_dtype float32"
                if movable.shape[0] == 0
                else f"only {movable.shape[0]} of its rows can be read in place instead"
            )
            raise CacheError(
                f"cache.halo_budget_mb is below the halo buffer of rank {r} ({need / 2**20:.1f} "
                f"MiB); raise it ({how})."
            )
        least_read = movable[np.argsort(p.reuse_H[movable], kind="stable")[:excess]]
        out.append(np.sort(least_read).astype(np.int64))
    return out


def replica_order(p: PartAccess, shape: ModelShape, hw: HardwareProfile | None) -> IntArray:
    """Halo rows in the order they are worth replicating.

    `degree` (no hardware): most-read first. With rates: a row saves its transfer at the
    exchanged width (both directions) and the aggregation of its edges at that width (both
    directions); it costs its mask and the aggregation of its edges at input width. The
    per-edge part decides the direction: rows whose edges are cheap to move first.
    """
    if hw is None:
        return np.argsort(-p.reuse_H, kind="stable").astype(np.int64)
    a, w = shape.widths[0], shape.exchanged_width(0)
    rates = Rates(hw, p.rank)  # the part's own worker aggregates it
    per_edge = rates.spmm_seconds(1_000_000, a) - 2 * rates.spmm_seconds(1_000_000, w)
    return np.argsort(p.reuse_H * np.sign(per_edge) * 1.0, kind="stable").astype(np.int64)


def most_read(p: PartAccess, shape: ModelShape, budget: int, spill: IntArray) -> IntArray:
    """The `degree` policy's replicas: the most-read halo rows that fit the budget, spilled
    rows left out."""
    return unspilled(replica_order(p, shape, None), spill)[: fits(p.num_halo, shape, budget)]


def unspilled(order: IntArray, spill: IntArray) -> IntArray:
    """`order` without the rows spilled to L3. A replica serves layer 0 only: at the later
    layers a replicated row travels through the L2 buffer, so a spilled row replicated
    would overflow the budget it spilled for."""
    return order[~np.isin(order, spill)]


def fits(count: int, shape: ModelShape, budget: int) -> int:
    """How many replica rows (input width) fit a budget of bytes."""
    return min(count, budget // max(shape.widths[0] * shape.dtype_bytes, 1))


def decide(
    policy: str,
    accesses: list[PartAccess],
    shape: ModelShape,
    budgets: Budgets,
    hw: HardwareProfile | None,
    static_aggregate: bool,
    reach: Reach | None = None,
) -> Decision:
    """The policy's levels for every rank, and the chunk count of every layer; `reach`:
    which owners' rows each rank can read in place (default: none)."""
    rule = policy_of(policy)
    static = rule.caches and static_aggregate and shape.input_dropout == 0
    static = static and not shape.attention
    row_bytes = max(shape.wire_row(shape.exchanged_width(i)) for i in range(shape.num_layers))
    reach = reach or Reach.none(len(accesses[0].recv_counts) if accesses else 0)
    spills = [np.zeros(0, dtype=np.int64) for _ in accesses]
    if rule.caches:
        spills = spill_to_l3(accesses, budgets, row_bytes, reach)
    base = [RankCache(static, l3_rows=s) for s in spills]
    chunks = [1] * shape.num_layers
    curve: list[dict[str, float | bool]] = []
    orders: list[IntArray] = []
    halo = any(p.num_halo > 0 for p in accesses)
    if rule.caches and not static and shape.admits_replicas and hw is not None and halo:
        ranked = [replica_order(p, shape, hw) for p in accesses]
        orders = [unspilled(o, s) for o, s in zip(ranked, spills, strict=True)]
        curve = sweep(accesses, shape, budgets, hw, orders, (spills, reach))
    if not rule.caches or static or not shape.admits_replicas or not halo:
        caches = base
    elif rule.replicas == "most-read":
        caches = [
            with_l3(np.sort(most_read(p, shape, b, s)), s)
            for p, b, s in zip(accesses, budgets.replica_bytes, spills, strict=True)
        ]
    else:
        assert hw is not None, f"the {policy} policy needs a hardware profile"
        caches = choose_replicas(accesses, shape, budgets, hw, (orders, curve), (spills, reach))
    if hw is None:
        return Decision(caches, chunks, None)
    chunks = choose_chunks(accesses, caches, shape, hw, reach)
    prediction = predict(accesses, caches, shape, hw, PLANNED, chunks, reach)
    return Decision(caches, chunks, prediction, curve)


def with_l3(replicas: IntArray, spill: IntArray) -> RankCache:
    """A rank's replicas and its L3 rows (sorted by `spill_to_l3`; never replicated:
    `unspilled` keeps them apart)."""
    assert not np.isin(replicas, spill).any(), "a spilled row was replicated"
    return RankCache(False, replicas, spill)


def counts_at(share: float, accesses: list[PartAccess], orders: list[IntArray]) -> list[int]:
    """Rows each rank replicates at `share` of its halo: at most the rows its order holds
    (spilled rows are not in it)."""
    return [min(int(share * p.num_halo), len(o)) for p, o in zip(accesses, orders, strict=True)]


Spilled = tuple[list[IntArray], Reach]  # every rank's L3 rows, and where they are read


def sweep(
    accesses: list[PartAccess],
    shape: ModelShape,
    budgets: Budgets,
    hw: HardwareProfile,
    orders: list[IntArray],
    spilled: Spilled,
) -> list[dict[str, float | bool]]:
    """Predicted step (one chunk per layer) with every rank replicating the same share of
    its halo, in the order the leo policy ranks rows (`orders`; see `Decision.sweep`)."""
    spills, reach = spilled
    row_bytes = shape.widths[0] * shape.dtype_bytes
    chunks = [1] * shape.num_layers
    out: list[dict[str, float | bool]] = []
    for share in SWEEP_SHARES:
        counts = counts_at(share, accesses, orders)
        caches = [
            with_l3(np.sort(o[:c]), s) for o, c, s in zip(orders, counts, spills, strict=True)
        ]
        t = predict(accesses, caches, shape, hw, PLANNED, chunks, reach).epoch_time_s
        fits_all = all(
            c * row_bytes <= b for c, b in zip(counts, budgets.replica_bytes, strict=True)
        )
        out.append(
            {
                "replica_share": share,
                "replica_budget_mb": max(counts) * row_bytes / 2**20,
                "predicted_epoch_time_s": t,
                "within_budget": fits_all,
            }
        )
    return out


def choose_replicas(
    accesses: list[PartAccess],
    shape: ModelShape,
    budgets: Budgets,
    hw: HardwareProfile,
    swept: tuple[list[IntArray], list[dict[str, float | bool]]],
    spilled: Spilled,
) -> list[RankCache]:
    """Per rank, the replicated share that minimises the predicted step: from the best
    point of the sweep (`swept`: each rank's row order and the sweep) that fits the budgets,
    two passes over the ranks, each trying a few shares of its budget."""
    orders, curve = swept
    spills, reach = spilled
    fitting = [pt for pt in curve if pt["within_budget"]]
    best = min(fitting, key=lambda pt: float(pt["predicted_epoch_time_s"]))
    counts = counts_at(float(best["replica_share"]), accesses, orders)
    chunks = [1] * shape.num_layers

    made: dict[tuple[int, int], RankCache] = {}  # (rank, count): trials change one rank

    def cache_of(r: int, count: int) -> RankCache:
        if (r, count) not in made:
            made[r, count] = with_l3(np.sort(orders[r][:count]), spills[r])
        return made[r, count]

    def caches_for(cs: list[int]) -> list[RankCache]:
        return [cache_of(r, cs[r]) for r in range(len(accesses))]

    def step_time(r: int, c: int) -> float:
        trial = counts[:r] + [c] + counts[r + 1 :]
        return predict(accesses, caches_for(trial), shape, hw, PLANNED, chunks, reach).epoch_time_s

    for _ in range(2):
        for r, order in enumerate(orders):
            limit = fits(len(order), shape, budgets.replica_bytes[r])
            options = sorted({int(limit * f) for f in REPLICA_FRACTIONS} | {counts[r]})
            counts[r] = min(options, key=lambda c, r=r: step_time(r, c))  # type: ignore[misc]
    return caches_for(counts)


def choose_chunks(
    accesses: list[PartAccess],
    caches: list[RankCache],
    shape: ModelShape,
    hw: HardwareProfile,
    reach: Reach | None = None,
) -> list[int]:
    """Per layer, the chunk count (the same on every rank) with the fastest predicted step.

    Attention models keep one chunk: a row's softmax needs every chunk's scores, so their
    aggregation waits for all arrivals and more chunks only add messages (the cost model
    prices aggregation as overlapping the transfers, which does not hold for them)."""
    chunks = [1] * shape.num_layers
    if shape.attention:
        return chunks
    for layer in range(shape.num_layers):

        def time_with(k: int, layer: int = layer) -> float:
            trial = chunks[:layer] + [k] + chunks[layer + 1 :]
            return predict(accesses, caches, shape, hw, PLANNED, trial, reach).epoch_time_s

        chunks[layer] = min(CHUNK_CHOICES, key=time_with)
    return chunks
