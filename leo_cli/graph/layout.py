"""From a graph and an owner per node to each worker's local view (DESIGN.md §2).

Legend: N inner nodes of a part, H halo nodes, E local edges (in-edges of inner nodes),
P parts, F features. Global ids are dataset ids; local ids are `0..N-1` for inner nodes
(in increasing global id) and `N..N+H-1` for halo nodes (grouped by owner, then global id).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from leo_cli.graph.types import BoolArray, FloatArray, Graph, IntArray, unique_int

ProgressFn = Callable[[str, int, int], None]


@dataclass
class LocalPart:
    """Everything worker `rank` needs; arrays named as their files on disk."""

    rank: int
    num_parts: int
    inner_nodes: IntArray
    halo_nodes: IntArray
    halo_owner: IntArray
    halo_owner_local: IntArray
    indptr: IntArray
    indices: IntArray
    edge_weight: FloatArray
    degree: IntArray
    x: FloatArray
    y: IntArray
    train_mask: BoolArray
    val_mask: BoolArray
    test_mask: BoolArray
    recv_idx: IntArray
    recv_counts: IntArray
    send_idx: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    send_counts: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def num_inner(self) -> int:
        return int(self.inner_nodes.shape[0])

    @property
    def num_halo(self) -> int:
        return int(self.halo_nodes.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        """Name -> array for every file of this part."""
        return {k: v for k, v in vars(self).items() if isinstance(v, np.ndarray)}


def gcn_weight(degree_src: IntArray, degree_dst: IntArray) -> FloatArray:
    """Symmetric GCN normalisation 1/sqrt((d_src+1)(d_dst+1)) with global degrees (+ self-loop)."""
    w = 1.0 / np.sqrt((degree_src + 1.0) * (degree_dst + 1.0))
    return w.astype(np.float32)


def local_index(parts_N: IntArray, num_parts: int) -> IntArray:
    """Position of every node among the nodes of its own part (its owner-local id)."""
    order = np.argsort(parts_N, kind="stable")
    counts = np.bincount(parts_N, minlength=num_parts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    idx = np.empty_like(parts_N)
    idx[order] = np.arange(parts_N.shape[0]) - np.repeat(starts, counts)
    return idx


def build_parts(
    graph: Graph, parts_N: IntArray, num_parts: int, progress: ProgressFn | None = None
) -> list[LocalPart]:
    """Build every part's local CSR, halo and per-peer send/recv lists."""
    src, dst = graph.edge_index_2E
    degree = graph.degree()
    owner_local = local_index(parts_N, num_parts)
    by_part = np.argsort(parts_N[dst], kind="stable")
    edge_counts = np.bincount(parts_N[dst], minlength=num_parts)
    bounds = np.concatenate([[0], np.cumsum(edge_counts)])
    parts = []
    for r in range(num_parts):
        sel = by_part[bounds[r] : bounds[r + 1]]
        part = build_one(graph, r, num_parts, parts_N, owner_local, degree, src[sel], dst[sel])
        parts.append(part)
        if progress is not None:
            progress("layout", r + 1, num_parts)
    fill_send_lists(parts)
    return parts


def build_one(
    graph: Graph,
    rank: int,
    num_parts: int,
    parts_N: IntArray,
    owner_local: IntArray,
    degree: IntArray,
    src_E: IntArray,
    dst_E: IntArray,
) -> LocalPart:
    """One part: inner nodes, halo grouped by owner, CSR over `[inner | halo]` columns."""
    inner = np.flatnonzero(parts_N == rank).astype(np.int64)
    n = inner.shape[0]
    remote = parts_N[src_E] != rank
    # Sorting halo keys by (owner, global id) makes each peer's rows one contiguous block.
    remote_key = parts_N[src_E[remote]] * graph.num_nodes + src_E[remote]
    halo_key = unique_int(remote_key)
    halo_pos = np.searchsorted(halo_key, remote_key)
    halo = halo_key % graph.num_nodes
    halo_owner = parts_N[halo]
    cols = owner_local[src_E].copy()
    cols[remote] = n + halo_pos.reshape(-1)
    rows = owner_local[dst_E]
    order = np.lexsort((cols, rows))
    rows, cols = rows[order], cols[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    col_degree = np.concatenate([degree[inner], degree[halo]])
    recv_counts = np.bincount(halo_owner, minlength=num_parts).astype(np.int64)
    return LocalPart(
        rank=rank,
        num_parts=num_parts,
        inner_nodes=inner,
        halo_nodes=halo.astype(np.int64),
        halo_owner=halo_owner.astype(np.int64),
        halo_owner_local=owner_local[halo].astype(np.int64),
        indptr=indptr,
        indices=cols.astype(np.int64),
        edge_weight=gcn_weight(col_degree[cols], degree[inner][rows]),
        degree=col_degree.astype(np.int64),
        x=np.ascontiguousarray(graph.x_NF[inner]),
        y=graph.y_N[inner],
        train_mask=graph.train_mask_N[inner],
        val_mask=graph.val_mask_N[inner],
        test_mask=graph.test_mask_N[inner],
        recv_idx=np.arange(n, n + halo.shape[0], dtype=np.int64),
        recv_counts=recv_counts,
    )


def fill_send_lists(parts: list[LocalPart]) -> None:
    """Owner q sends to r the rows r holds in its halo block of q, in the same order."""
    num_parts = len(parts)
    for q in range(num_parts):
        blocks = []
        for r in range(num_parts):
            p = parts[r]
            start = int(p.recv_counts[:q].sum())
            blocks.append(p.halo_owner_local[start : start + int(p.recv_counts[q])])
        parts[q].send_idx = np.concatenate(blocks).astype(np.int64)
        parts[q].send_counts = np.array([b.shape[0] for b in blocks], dtype=np.int64)


def partition_stats(graph: Graph, parts_N: IntArray, local: list[LocalPart]) -> dict[str, object]:
    """Edge cut, balance, halo sizes and replication factor of an assignment."""
    src, dst = graph.edge_index_2E
    cut_directed = int(np.count_nonzero(parts_N[src] != parts_N[dst]))
    num_undirected = graph.num_edges // 2
    edges = [int(p.indptr[-1]) for p in local]
    nodes = [p.num_inner for p in local]
    halo = [p.num_halo for p in local]
    return {
        "edge_cut": cut_directed // 2,
        "edge_cut_fraction": cut_directed / max(graph.num_edges, 1),
        "balance": max(edges) / max(float(np.mean(edges)), 1e-12),
        "node_balance": max(nodes) / max(float(np.mean(nodes)), 1e-12),
        "nodes": nodes,
        "edges": edges,
        "halo_nodes": halo,
        "replication_factor": (sum(nodes) + sum(halo)) / max(graph.num_nodes, 1),
        "num_undirected_edges": num_undirected,
    }
