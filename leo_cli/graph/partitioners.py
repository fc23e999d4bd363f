"""Node-to-part assignment: METIS (edge-balanced), random and contiguous ranges.

Legend: N nodes, E directed edges.
"""

from __future__ import annotations

import numpy as np
import pymetis

from leo_cli.graph.types import Graph, IntArray

METHODS = ("metis", "random", "range")


def assign_parts(graph: Graph, num_parts: int, method: str, seed: int) -> IntArray:
    """Owner rank of every node, int64 [N] with values in `0..num_parts-1`."""
    assert method in METHODS, method
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    if method == "metis":
        return metis_parts(graph, num_parts, seed)
    if method == "random":
        # A stream of its own: the same seed also drives dataset generators.
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x9A27,)))
        return rng.integers(0, num_parts, graph.num_nodes, dtype=np.int64)
    return range_parts(graph.num_nodes, num_parts)


def range_parts(num_nodes: int, num_parts: int) -> IntArray:
    """Contiguous blocks of node ids of (almost) equal size."""
    return (np.arange(num_nodes, dtype=np.int64) * num_parts) // num_nodes


def metis_parts(graph: Graph, num_parts: int, seed: int) -> IntArray:
    """METIS k-way partition with vertex weights 1 + in-degree.

    Aggregation work follows edges, not nodes, so weighting vertices by their in-degree makes
    parts carry similar edge counts and keeps fast workers from waiting for slow ones.
    """
    n = graph.num_nodes
    order = np.lexsort((graph.edge_index_2E[1], graph.edge_index_2E[0]))
    adjacent = graph.edge_index_2E[1][order]
    deg = np.bincount(graph.edge_index_2E[0], minlength=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=starts[1:])
    vweights = (1 + graph.degree()).astype(np.int64)
    result = pymetis.part_graph(
        num_parts,
        adjacency=pymetis.CSRAdjacency(starts, adjacent.astype(np.int64)),
        vweights=vweights,
        options=pymetis.Options(seed=seed),
    )
    return np.asarray(result.vertex_part, dtype=np.int64)
