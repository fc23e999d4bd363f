"""Node-to-part assignment: METIS (edge-balanced), random, contiguous ranges, or an owners
file made elsewhere; each part's target share of the work (`weights`, normalised) is METIS's
target part weight and the node share of `random` and `range`, or, given a work measure
(`WorkMeasure`: what each node weighs), their share of its total.

Legend: N nodes, E directed edges, P parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pymetis

from leo_cli.errors import ConfigError
from leo_cli.graph.types import CHUNK, BoolArray, Graph, IdArray, IntArray

METHODS = ("metis", "random", "range")  # `file` reads its owners instead (`owners_from_file`)


def assign_parts(
    graph: Graph,
    num_parts: int,
    method: str,
    seed: int,
    prepared: MetisInput | None = None,
    weights: list[float] | None = None,
    work: WorkMeasure | None = None,
) -> IntArray:
    """Owner rank of every node, int64 [N] with values in `0..num_parts-1`.

    `prepared` is METIS's input built earlier (`metis_input`), so callers can release the
    graph's arrays while METIS runs; without it, it is built from `graph` with `work` as its
    vertex weights. `weights`: each part's target share (P positive numbers, normalised here;
    None: equal parts, the very parts of before weights existed). `work`: what a node weighs
    (None: the degree rule for METIS, node counts for `range`). `random` draws every owner
    independently of the node's weight, so each part's expected share of any measure is its
    target share: it needs no measure.
    """
    assert method in METHODS, method
    shares = None if weights is None else normalised(weights)
    assert shares is None or len(shares) == num_parts, "one weight per part"
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    if method == "metis":
        inputs = prepared or metis_input(graph, work=work or DEGREE)
        return metis_parts(inputs, num_parts, seed, shares)
    if method == "random":
        # A stream of its own: the same seed also drives dataset generators.
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x9A27,)))
        if shares is not None:
            return rng.choice(num_parts, size=graph.num_nodes, p=shares).astype(np.int64)
        return rng.integers(0, num_parts, graph.num_nodes, dtype=np.int64)
    vweights = None if shares is None or work is None else work.vertex_weights(graph.degree())
    return range_parts(graph.num_nodes, num_parts, shares, vweights)


def normalised(weights: list[float]) -> list[float]:
    """Weights as shares summing to 1 (METIS's `tpwgts` may not sum above 1)."""
    total = math.fsum(weights)
    shares = [w / total for w in weights]
    excess = math.fsum(shares) - 1.0
    if excess > 0:  # rounding: take it off the largest share
        big = shares.index(max(shares))
        shares[big] -= excess
    return shares


def range_parts(
    num_nodes: int,
    num_parts: int,
    shares: list[float] | None = None,
    vweights: IntArray | None = None,
) -> IntArray:
    """Contiguous blocks of node ids, of (almost) equal size or of the given node shares; with
    `vweights` (one weight per node), of the given shares of their total, each node in the
    block where the middle of its weight falls."""
    ids = np.arange(num_nodes, dtype=np.int64)
    if shares is None:
        return (ids * num_parts) // num_nodes
    if vweights is None:
        ends = np.rint(np.cumsum(shares) * num_nodes).astype(np.int64)
        return np.searchsorted(ends[:-1], ids, side="right").astype(np.int64)
    cumulative = np.cumsum(vweights, dtype=np.float64)
    middles = cumulative - vweights / 2
    bounds = np.cumsum(shares)[:-1] * cumulative[-1]
    return np.searchsorted(bounds, middles, side="right").astype(np.int64)


def owners_from_file(path: Path, num_nodes: int, num_parts: int) -> IntArray:
    """The owners a partitioner wrote elsewhere: one integer rank per node, every part used.

    Raises:
        ConfigError: the file is missing or unreadable, or not one owner in
            0..num_parts-1 per node with every part non-empty (one sentence naming it).
    """
    key = f"partition.owners_path={path}"
    try:
        owners = np.load(path, allow_pickle=False, mmap_mode="r")
    except FileNotFoundError:
        raise ConfigError(f"{key} does not exist; give the .npy file of owners.") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a .npy file"
        raise ConfigError(f"{key} cannot be read ({reason}); give a .npy array.") from None
    problem = owners_problem(owners, num_nodes, num_parts)
    if problem is not None:
        raise ConfigError(f"{key} is not an owners array for this graph: {problem}.")
    return np.asarray(owners, dtype=np.int64)


def owners_problem(owners: np.ndarray, num_nodes: int, num_parts: int) -> str | None:
    """What makes `owners` unfit as one owner rank per node (a phrase), or None."""
    if owners.ndim != 1 or owners.shape[0] != num_nodes:
        return f"it has shape {owners.shape}, the graph has {num_nodes} nodes"
    if not np.issubdtype(owners.dtype, np.integer):
        return f"its dtype is {owners.dtype}, not an integer type"
    if num_nodes and (int(owners.min()) < 0 or int(owners.max()) >= num_parts):
        lo, hi = int(owners.min()), int(owners.max())
        return f"its ranks run from {lo} to {hi}, outside 0..{num_parts - 1}"
    counts = np.bincount(np.asarray(owners, dtype=np.int64), minlength=num_parts)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        return f"part {int(empty[0])} owns no node (partition.num_parts={num_parts})"
    return None


# Integer vertex weights of the `cost` rule: a node without in-edges weighs NODE_UNITS (its
# rounding is then within 0.05% of its weight), unless the graph's total would pass
# WEIGHT_TOTAL_LIMIT, a total METIS sums without overflow in a 32-bit `idx_t` build too (a
# graph of 2M nodes still averages about 1000 a node).
NODE_UNITS = 1000
WEIGHT_TOTAL_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class WorkMeasure:
    """What a node weighs: `per_node` + `per_edge` x its in-degree. METIS's vertex weight,
    the blocks of `range` and the measure of the shares a partition achieves.

    `rule` names where the coefficients come from: `degree` (1 + in-degree, edges and nodes
    alike: the parts of before part weights) or `cost` (the cost model's seconds of one
    training step per node, for its dense work, and per in-edge, for its SpMM: the shares of
    this measure are shares of the predicted busy time).
    """

    rule: Literal["degree", "cost"]
    per_node: float
    per_edge: float

    def vertex_weights(self, degree: IntArray) -> IntArray:
        """Integer weights (int64, each >= 1) proportional to every node's work, given its
        in-degree; the `degree` rule's are exactly 1 + in-degree."""
        if self.rule == "degree":
            return (1 + degree).astype(np.int64)
        assert self.per_node > 0 and self.per_edge >= 0, self
        num = degree.shape[0]
        total = self.per_node * num + self.per_edge * float(degree.sum())
        # Rounding and the floor of 1 add at most one a node; past 2^31 nodes nothing fits
        # 32 bits, and the average weight is kept near 1 (pymetis's own `idx_t` is 64-bit).
        room = max(WEIGHT_TOTAL_LIMIT - num, num)
        scale = min(NODE_UNITS / self.per_node, room / max(total, 1e-300))
        work = scale * (self.per_node + self.per_edge * degree)
        weights: IntArray = np.rint(work).astype(np.int64)
        weights[weights < 1] = 1  # METIS weighs nothing at 0
        return weights

    def shares(self, nodes: list[int], edges: list[int]) -> list[float]:
        """Each part's share of the work, given its inner nodes and their in-edges."""
        work = [self.per_node * n + self.per_edge * e for n, e in zip(nodes, edges, strict=True)]
        total = sum(work) or 1.0
        return [round(w / total, 6) for w in work]

    def meta(self) -> dict[str, float | str]:
        """The rule and its coefficients, as META.json records them."""
        return {"rule": self.rule, "per_node": self.per_node, "per_edge": self.per_edge}


DEGREE = WorkMeasure("degree", 1.0, 1.0)


@dataclass
class MetisInput:
    """METIS's CSR (row starts, neighbours), vertex weights and edge weights (None: all 1),
    int64 as METIS's `idx_t`."""

    starts: IntArray
    adjacent: IntArray
    vweights: IntArray
    eweights: IntArray | None = None


# Sampled edges weigh EDGE_WEIGHT_SCALE / sqrt(their keep probability), rounded: thinned hub
# edges count for more, so METIS still sees how strongly hubs are tied together, but less
# than the 1 / p that would make the sampled cut unbiased: such heavy edges steer METIS's
# heavy-edge matching into contracting hubs together first, which costs more cut than it
# saves (on 600k-node synthetic graphs, 2 seeds: +3% edge cut at a 30% sample against +8% with
# 1 / p and +6% uniform). The scale sets the rounding's resolution: weights are integers, so
# every p above 0.79 rounds to the weight 4 of an unsampled edge (at most 11% light), and
# the error shrinks as edges get thinner and heavier.
EDGE_WEIGHT_SCALE = 4
# The sampling scheme's name in META.json: partitions sampled under another one are rebuilt.
SAMPLING = f"min-degree, {EDGE_WEIGHT_SCALE}/sqrt(p)"


def metis_input(
    graph: Graph, edge_fraction: float = 1.0, seed: int = 0, work: WorkMeasure = DEGREE
) -> MetisInput:
    """METIS's input, built once, with `work`'s vertex weights (default 1 + in-degree).

    Aggregation work follows edges, not nodes, so weighting vertices by their in-degree makes
    parts carry similar edge counts and keeps fast workers from waiting for slow ones. Where
    the step is dominated by per-node work (dense GEMMs, layer 0 on the static aggregate),
    equal edge counts are not equal time: the `cost` rule prices both.

    The graph is symmetric and sorted by (target, source), so its source row already is
    METIS's adjacency array (the neighbours of each node, in order) and in-degrees are the row
    lengths: the input is one int64 copy of the sources (METIS's own index width, so pymetis
    passes it through without another copy).

    With `edge_fraction` < 1, METIS sees only the undirected edges that `sampled_edges` keeps
    (both directions or neither), weighted up by 1 / sqrt(their keep probability); vertex
    weights still count every edge.
    """
    src, dst = edges_by_target(graph)
    degree = np.bincount(dst, minlength=graph.num_nodes).astype(np.int64)
    row_length = degree
    eweights = None
    if edge_fraction < 1:
        keep, eweights = sampled_edges(src, dst, degree, edge_fraction, seed)
        src, dst = src[keep], dst[keep]
        row_length = np.bincount(dst, minlength=graph.num_nodes).astype(np.int64)
    starts = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(row_length, out=starts[1:])
    adjacent = src.astype(pymetis.zero_copy_dtype())
    return MetisInput(starts, adjacent, work.vertex_weights(degree), eweights)


def sampled_edges(
    src: IdArray, dst: IdArray, degree: IntArray, fraction: float, seed: int
) -> tuple[BoolArray, IntArray]:
    """Keep-mask of about `fraction` of the edges, the same for (u, v) and (v, u), and the
    weights of the kept edges (int64, in kept order).

    An edge is kept with probability p = min(1, c / min(deg u, deg v)), `c` sized so that
    `fraction` of the edges are kept: every edge of a low-degree node stays (those few edges
    are what decides where such a node belongs) while edges between two hubs, of which each
    has many, are thinned. Kept edges weigh round(EDGE_WEIGHT_SCALE / sqrt(p)). On the
    power-law synthetic graphs measured (600k and 2.4M nodes, 30-42% of the edges) this lost
    a third to a half of the edge cut a uniform sample of the same size loses. A
    splitmix64-style hash of (min, max, seed) draws each undirected edge, block by block.
    """
    scale = keep_scale(src, dst, degree, fraction)
    keep = np.empty(src.shape[0], dtype=np.bool_)
    weights = []
    salt = np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
    for lo in range(0, src.shape[0], CHUNK):
        a, b = src[lo : lo + CHUNK], dst[lo : lo + CHUNK]
        prob = np.minimum(1.0, scale / np.minimum(degree[a], degree[b]))
        a, b = a.astype(np.uint64), b.astype(np.uint64)
        x = np.minimum(a, b) * np.uint64(0x100000001B3) ^ np.maximum(a, b) ^ salt
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
        kept = (x >> np.uint64(32)) < prob * 2**32
        keep[lo : lo + CHUNK] = kept
        weights.append(np.rint(EDGE_WEIGHT_SCALE / np.sqrt(prob[kept])).astype(np.int64))
    return keep, np.concatenate(weights) if weights else np.zeros(0, dtype=np.int64)


def keep_scale(src: IdArray, dst: IdArray, degree: IntArray, fraction: float) -> float:
    """The `c` for which sum over edges of min(1, c / min-degree) is `fraction` of them.

    Edges are counted by their endpoints' smaller degree (one histogram pass); the expected
    share kept is then monotone in `c`, solved by bisection on the histogram.
    """
    counts = np.zeros(int(degree.max(initial=0)) + 1, dtype=np.int64)
    for lo in range(0, src.shape[0], CHUNK):
        low = np.minimum(degree[src[lo : lo + CHUNK]], degree[dst[lo : lo + CHUNK]])
        counts[: low.max(initial=0) + 1] += np.bincount(low)
    values = np.arange(1, counts.shape[0], dtype=np.float64)
    counts = counts[1:].astype(np.float64)  # every edge's endpoints have degree >= 1
    wanted = fraction * counts.sum()
    lo_c, hi_c = 0.0, float(counts.shape[0])
    for _ in range(60):
        mid = (lo_c + hi_c) / 2
        if float(np.minimum(1.0, mid / values) @ counts) < wanted:
            lo_c = mid
        else:
            hi_c = mid
    return hi_c


def metis_parts(
    inputs: MetisInput, num_parts: int, seed: int, shares: list[float] | None = None
) -> IntArray:
    """METIS partition of `inputs` into `num_parts` (recursive bisection up to 8 parts, as
    pymetis chooses); `shares`: target part weights (`tpwgts`, summing to at most 1)."""
    result = pymetis.part_graph(
        num_parts,
        adjacency=pymetis.CSRAdjacency(inputs.starts, inputs.adjacent),
        vweights=inputs.vweights,
        eweights=inputs.eweights,
        tpwgts=shares,
        options=pymetis.Options(seed=seed),
    )
    return np.asarray(result.vertex_part, dtype=np.int64)


# METIS's memory model (GB = 1e9 bytes, as the stage reports peaks). Fitted on synthetic
# power-law graphs of 0.6M, 1.2M and 2.4M nodes at average degree 50, exact and with edge
# samples (scripts/bench_partition.py): the stage peaked at 109, 117 and 127 bytes per
# directed edge METIS saw above a base of the node arrays; coarsening keeps more levels, each
# nearly as large as the last on such graphs, as the graph grows. The model says 8% more than
# every measurement; graphs with community structure coarsen faster and need less.
MIN_METIS_EDGE_FRACTION = 0.1


def metis_bytes_per_edge(num_nodes: int) -> float:
    """Bytes METIS (and its input) takes per directed edge it sees, growing with log2(N)."""
    return 100.0 + 8.0 * max(0.0, math.log2(max(num_nodes, 1) / 1e5))


@dataclass(frozen=True)
class GraphSize:
    """What METIS's memory depends on: nodes, directed edges, bytes of node features."""

    num_nodes: int
    num_edges: int
    feature_bytes: int

    @classmethod
    def of(cls, graph: Graph) -> GraphSize:
        return cls(graph.num_nodes, graph.num_edges, graph.x_NF.nbytes)


def projected_metis_gb(size: GraphSize, edge_fraction: float) -> float:
    """Projected peak of the partition stage (GB) while METIS sees `edge_fraction` of the
    directed edges: the node arrays (features plus 64 bytes a node) and METIS's working set."""
    node_bytes = size.feature_bytes + 64 * size.num_nodes
    edge_bytes = metis_bytes_per_edge(size.num_nodes) * size.num_edges * edge_fraction
    return (node_bytes + edge_bytes) / 1e9


def metis_edge_fraction(
    size: GraphSize, requested: float, limit_gb: float | None, name: str = "the graph"
) -> float:
    """The share of edges METIS sees: `requested`, lowered (to two decimals, so the same graph
    always gets the same share) until the projected peak fits `limit_gb` (None: no limit).

    Raises:
        ConfigError: not even a tenth of the edges (or `requested`, if less) would fit.
    """
    if limit_gb is None or projected_metis_gb(size, requested) <= limit_gb:
        return requested
    floor = min(requested, MIN_METIS_EDGE_FRACTION)
    node_gb = projected_metis_gb(size, 0.0)
    edge_gb = projected_metis_gb(size, 1.0) - node_gb
    fit = 0.0 if edge_gb <= 0 else math.floor((limit_gb - node_gb) / edge_gb * 100 + 1e-9) / 100
    if fit < floor:
        raise ConfigError(
            f"partition.metis_memory_gb={limit_gb:g} is too small for {name}: METIS would "
            f"need about {projected_metis_gb(size, floor):.3g} GB even on {floor:.0%} of its "
            "edges; raise it (null: no limit) or use partition.method=random"
        )
    return min(requested, fit)


def edges_by_target(graph: Graph) -> IdArray:
    """The graph's edges sorted by (target, source): the arrays themselves when they already
    are (every loader's output), else a sorted copy."""
    src, dst = graph.edge_index_2E
    n = np.int64(graph.num_nodes)
    ordered = True
    prev = np.int64(-1)
    for lo in range(0, src.shape[0], CHUNK):
        key = dst[lo : lo + CHUNK].astype(np.int64) * n + src[lo : lo + CHUNK]
        ordered = ordered and bool(key[0] > prev) and bool(np.all(key[1:] > key[:-1]))
        prev = key[-1]
    if ordered:
        return graph.edge_index_2E
    return graph.edge_index_2E[:, np.lexsort((src, dst))]
