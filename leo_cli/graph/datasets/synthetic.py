"""The built-in synthetic graph: a degree-corrected stochastic block model (DC-SBM).

Communities are the classes, expected degrees follow a power law, `homophily` is the share of
edges drawn inside a community, and features are a per-class Gaussian centroid plus noise, so
a GCN beats an MLP. Splits: 10% train, 10% validation, 80% test. Vectorised throughout, every
stage on its own seeded stream: the graph depends only on (seed, SyntheticConfig).

Specification: docs/design/datasets.md; dataset card: datasets/synthetic.md.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from leo_cli.config.schema import SyntheticConfig
from leo_cli.graph.types import (
    CHUNK,
    BoolArray,
    FloatArray,
    Graph,
    IdArray,
    IntArray,
    ProgressFn,
    check_graph,
    id_dtype,
    symmetrize,
)

TRAIN_FRACTION = 0.10
VAL_FRACTION = 0.10

# Independent random streams, one per stage (values are arbitrary but fixed forever).
_STREAM_LABELS, _STREAM_DEGREES, _STREAM_EDGES, _STREAM_FEATURES, _STREAM_SPLITS = range(5)
_FEATURE_CHUNK_ROWS = 1 << 16

Float64Array = npt.NDArray[np.float64]


def _rng(seed: int, stream: int) -> np.random.Generator:
    """Generator for one stage; negative seeds are folded into the unsigned 64-bit range."""
    return np.random.default_rng(np.random.SeedSequence([seed % (1 << 64), stream]))


def expected_degrees(cfg: SyntheticConfig, rng: np.random.Generator) -> Float64Array:
    """Power-law expected degrees with mean `avg_degree`, capped at sqrt(N * avg_degree).

    Pareto weights with density ~ w^(-degree_exponent) for w >= 1, sampled by inversion. The cap
    keeps the largest hub bounded (below N) even for exponents <= 2, whose mean diverges.
    """
    u = rng.random(cfg.num_nodes)
    weight = np.power(1.0 - u, -1.0 / (cfg.degree_exponent - 1.0))
    degree: Float64Array = weight * (cfg.avg_degree / weight.mean())
    cap = min(float(np.sqrt(cfg.num_nodes * cfg.avg_degree)), cfg.num_nodes - 1.0)
    np.minimum(degree, cap, out=degree)
    return degree


class _CommunitySampler:
    """Samples nodes by weight, either anywhere, inside a given community or outside it.

    Nodes are laid out community by community; one cumulative-weight array over that layout
    serves all communities: community c owns the weight interval [start[c], start[c] + total[c]).
    A draw is a position in [0, total weight); the node is the one whose interval contains it.
    """

    def __init__(self, labels_N: IntArray, weight_N: Float64Array, num_classes: int) -> None:
        self.order_N = np.argsort(labels_N, kind="stable")
        self.cum_N = np.cumsum(weight_N[self.order_N])
        sizes_C = np.bincount(labels_N, minlength=num_classes)
        self.has_other = bool(np.count_nonzero(sizes_C) > 1)
        self.last_C = np.cumsum(sizes_C) - 1
        self.first_C = self.last_C + 1 - sizes_C
        self.total_C = np.bincount(labels_N, weights=weight_N, minlength=num_classes)
        self.start_C = np.concatenate([[0.0], np.cumsum(self.total_C)[:-1]])
        self.total = float(self.cum_N[-1])

    def inside(self, community: IntArray, u: Float64Array) -> Float64Array:
        """Positions drawn by weight inside `community` (`u` uniform in [0, 1))."""
        return self.start_C[community] + u * self.total_C[community]

    def outside(self, community: IntArray, u: Float64Array) -> Float64Array:
        """Positions drawn by weight over every community except `community`."""
        r = u * (self.total - self.total_C[community])
        # Skip over the excluded community's interval.
        return np.where(r >= self.start_C[community], r + self.total_C[community], r)

    def layout_index(self, r: Float64Array) -> IntArray:
        """Layout index of the node owning each position (int64)."""
        pos = np.searchsorted(self.cum_N, r, side="right")
        return np.minimum(pos, np.int64(self.cum_N.shape[0] - 1))


def sample_edges(
    cfg: SyntheticConfig,
    labels_N: IntArray,
    degree_N: Float64Array,
    rng: np.random.Generator,
) -> IdArray:
    """Undirected DC-SBM edges, one column per draw (duplicates and self-loops still included).

    Ids are `id_dtype(N)`. Besides the [2, M] result, only two float64 draws of M values and one
    int64 permutation are ever whole; the rest runs in blocks of `CHUNK` draws.
    """
    num_edges = max(1, int(round(cfg.num_nodes * cfg.avg_degree / 2)))
    sampler = _CommunitySampler(labels_N, degree_N, cfg.num_classes)
    edges_2M = np.empty((2, num_edges), dtype=id_dtype(cfg.num_nodes))
    # Sources: sorted uniform positions map straight to sorted layout indices (no argsort).
    pos = rng.random(num_edges)
    pos.sort()
    pos *= sampler.total
    for lo in range(0, num_edges, CHUNK):
        src_pos = np.searchsorted(sampler.cum_N, pos[lo : lo + CHUNK])
        src_pos = np.minimum(src_pos, sampler.cum_N.shape[0] - 1)
        edges_2M[0, lo : lo + CHUNK] = sampler.order_N[src_pos]
    del pos
    r = rng.random(num_edges)  # uniform draws, turned into target positions in place
    intra = np.empty(num_edges, dtype=np.bool_)
    for lo in range(0, num_edges, CHUNK):  # same stream as one call of `num_edges` draws
        intra[lo : lo + CHUNK] = rng.random(min(CHUNK, num_edges - lo)) < cfg.homophily
    if not sampler.has_other:  # a single non-empty community: there is no "other" one
        intra[:] = True
    for lo in range(0, num_edges, CHUNK):
        community = labels_N[edges_2M[0, lo : lo + CHUNK]]
        u = r[lo : lo + CHUNK]
        pick = np.where(
            intra[lo : lo + CHUNK], sampler.inside(community, u), sampler.outside(community, u)
        )
        r[lo : lo + CHUNK] = pick
    # Binary search over a million-entry table is cache-bound for random queries; searching
    # the queries in sorted order is about 8x faster, even counting the argsort.
    perm = np.argsort(r)
    for lo in range(0, num_edges, CHUNK):
        sel = perm[lo : lo + CHUNK]
        dst_pos = sampler.layout_index(r[sel])
        community = labels_N[edges_2M[0, sel]]
        # Rounding at an interval's end may step one node past the community: clamp into it.
        clamped = np.clip(dst_pos, sampler.first_C[community], sampler.last_C[community])
        dst_pos = np.where(intra[sel], clamped, dst_pos)
        edges_2M[1, sel] = sampler.order_N[dst_pos]
    return edges_2M


def sample_features(
    cfg: SyntheticConfig, labels_N: IntArray, rng: np.random.Generator
) -> FloatArray:
    """Class centroid (standard normal, per class) plus noise of std `feature_noise`, float32.

    Filled in row chunks so that no float64 or second N x F temporary is ever allocated.
    """
    shape = (cfg.num_classes, cfg.num_features)
    centroid_CF = rng.standard_normal(shape, dtype=np.float32)
    x_NF = np.empty((cfg.num_nodes, cfg.num_features), dtype=np.float32)
    noise = np.float32(cfg.feature_noise)
    for lo in range(0, cfg.num_nodes, _FEATURE_CHUNK_ROWS):
        block = x_NF[lo : lo + _FEATURE_CHUNK_ROWS]
        rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block *= noise
        block += centroid_CF[labels_N[lo : lo + _FEATURE_CHUNK_ROWS]]
    return x_NF


def sample_splits(num_nodes: int, rng: np.random.Generator) -> tuple[BoolArray, ...]:
    """Disjoint random train/val/test masks covering every node (train >= 1 node)."""
    perm = rng.permutation(num_nodes)
    num_train = max(1, int(TRAIN_FRACTION * num_nodes))
    num_val = int(VAL_FRACTION * num_nodes)
    bounds = [0, num_train, num_train + num_val, num_nodes]
    masks = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        mask = np.zeros(num_nodes, dtype=np.bool_)
        mask[perm[lo:hi]] = True
        masks.append(mask)
    return tuple(masks)


def generate(cfg: SyntheticConfig, seed: int, progress: ProgressFn | None = None) -> Graph:
    """The synthetic graph for `cfg`, fully determined by (`seed`, `cfg`).

    Args:
        cfg: generator parameters (`data.synthetic`).
        seed: run seed (`run.seed`).
        progress: called as `("load", step, 4)` after each of the generator's four steps.

    Returns:
        A symmetric graph without self-loops or duplicate edges, named `synthetic`.
    """
    labels_N = _rng(seed, _STREAM_LABELS).integers(0, cfg.num_classes, cfg.num_nodes)
    labels_N = labels_N.astype(np.int64)
    degree_N = expected_degrees(cfg, _rng(seed, _STREAM_DEGREES))
    step = progress or (lambda stage, done, total: None)
    edges_2M = sample_edges(cfg, labels_N, degree_N, _rng(seed, _STREAM_EDGES))
    del degree_N
    step("load", 1, 4)
    edge_index_2E = symmetrize(edges_2M, cfg.num_nodes)
    del edges_2M
    step("load", 2, 4)
    x_NF = sample_features(cfg, labels_N, _rng(seed, _STREAM_FEATURES))
    step("load", 3, 4)
    train, val, test = sample_splits(cfg.num_nodes, _rng(seed, _STREAM_SPLITS))
    graph = Graph(
        name="synthetic",
        edge_index_2E=edge_index_2E,
        x_NF=x_NF,
        y_N=labels_N,
        train_mask_N=train,
        val_mask_N=val,
        test_mask_N=test,
        num_classes=cfg.num_classes,
    )
    check_graph(graph)
    return graph
