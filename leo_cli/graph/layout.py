"""From a graph and an owner per node to each worker's local view (inner, halo, boundary).

Legend: N inner nodes of a part, H halo nodes, E local edges (in-edges of inner nodes),
P parts, F features. Global ids are dataset ids; local ids are `0..N-1` for inner nodes
(in increasing global id) and `N..N+H-1` for halo nodes (grouped by owner, then global id).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from leo_cli.graph.types import (
    CHUNK,
    BoolArray,
    FloatArray,
    Graph,
    IdArray,
    IntArray,
    ProgressFn,
    unique_int,
)

__all__ = ["LocalPart", "PartSummary", "ProgressFn", "build_parts", "iter_parts", "summarize"]


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
    out = np.empty(degree_src.shape[0], dtype=np.float32)
    for lo in range(0, out.shape[0], CHUNK):  # float64 temporaries one block at a time
        ds, dd = degree_src[lo : lo + CHUNK], degree_dst[lo : lo + CHUNK]
        out[lo : lo + CHUNK] = 1.0 / np.sqrt((ds + 1.0) * (dd + 1.0))
    return out


def local_index(parts_N: IntArray, num_parts: int) -> IntArray:
    """Position of every node among the nodes of its own part (its owner-local id)."""
    order = np.argsort(parts_N, kind="stable")
    counts = np.bincount(parts_N, minlength=num_parts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    idx = np.empty_like(parts_N)
    idx[order] = np.arange(parts_N.shape[0]) - np.repeat(starts, counts)
    return idx


@dataclass
class PartSummary:
    """What outlives a part once it is written: its send-list inputs and its stats."""

    halo_owner_local: IntArray
    recv_counts: IntArray
    num_inner: int
    num_halo: int
    num_edges: int
    num_remote_edges: int


def iter_parts(
    graph: Graph, parts_N: IntArray, num_parts: int, progress: ProgressFn | None = None
) -> Iterator[LocalPart]:
    """Every part's local CSR and halo, one part at a time (send lists left empty).

    Only one part's arrays are alive at once, so callers that write each part before asking
    for the next keep one part, not all of them, in memory.
    """
    src, dst = graph.edge_index_2E
    degree = graph.degree()
    owner_local = local_index(parts_N, num_parts)
    dst_part = np.empty(dst.shape[0], dtype=np.int32)  # owner of each edge's target
    for lo in range(0, dst.shape[0], CHUNK):
        dst_part[lo : lo + CHUNK] = parts_N[dst[lo : lo + CHUNK]]
    for r in range(num_parts):
        sel = np.flatnonzero(dst_part == r)
        yield build_one(graph, r, num_parts, parts_N, owner_local, degree, src[sel], dst[sel])
        if progress is not None:
            progress("layout", r + 1, num_parts)


def build_parts(
    graph: Graph, parts_N: IntArray, num_parts: int, progress: ProgressFn | None = None
) -> list[LocalPart]:
    """Build every part's local CSR, halo and per-peer send/recv lists, in memory."""
    parts = list(iter_parts(graph, parts_N, num_parts, progress))
    sends = send_lists([summarize(p) for p in parts])
    for part, (send_idx, send_counts) in zip(parts, sends, strict=True):
        part.send_idx, part.send_counts = send_idx, send_counts
    return parts


def build_one(
    graph: Graph,
    rank: int,
    num_parts: int,
    parts_N: IntArray,
    owner_local: IntArray,
    degree: IntArray,
    src_E: IdArray,
    dst_E: IdArray,
) -> LocalPart:
    """One part: inner nodes, halo grouped by owner, CSR over `[inner | halo]` columns."""
    inner = np.flatnonzero(parts_N == rank).astype(np.int64)
    n = inner.shape[0]
    remote = parts_N[src_E] != rank
    remote_src = src_E[remote].astype(np.int64)
    # Sorting halo keys by (owner, global id) makes each peer's rows one contiguous block.
    remote_key = parts_N[remote_src] * graph.num_nodes + remote_src
    del remote_src
    halo_key = unique_int(remote_key)
    halo = halo_key % graph.num_nodes
    cols = owner_local[src_E]
    cols[remote] = n + np.searchsorted(halo_key, remote_key)
    del remote_key, halo_key
    rows = owner_local[dst_E]
    counts = np.bincount(rows, minlength=n)
    # Order edges by (row, column) with one in-place sort of a combined key (pairs are unique).
    num_cols = np.int64(n + halo.shape[0])
    rows *= num_cols
    rows += cols
    rows.sort()
    cols = rows % num_cols
    rows //= num_cols
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    halo_owner = parts_N[halo]
    col_degree = np.concatenate([degree[inner], degree[halo]])
    edge_weight = gcn_weight(col_degree[cols], degree[inner][rows])
    del rows
    return LocalPart(
        rank=rank,
        num_parts=num_parts,
        inner_nodes=inner,
        halo_nodes=halo.astype(np.int64),
        halo_owner=halo_owner.astype(np.int64),
        halo_owner_local=owner_local[halo].astype(np.int64),
        indptr=indptr,
        indices=cols.astype(np.int64),
        edge_weight=edge_weight,
        degree=col_degree.astype(np.int64),
        x=np.ascontiguousarray(graph.x_NF[inner]),
        y=graph.y_N[inner],
        train_mask=graph.train_mask_N[inner],
        val_mask=graph.val_mask_N[inner],
        test_mask=graph.test_mask_N[inner],
        recv_idx=np.arange(n, n + halo.shape[0], dtype=np.int64),
        recv_counts=np.bincount(halo_owner, minlength=num_parts).astype(np.int64),
    )


def summarize(part: LocalPart) -> PartSummary:
    """The part's send-list inputs and stats (remote edges: columns past the inner ones)."""
    return PartSummary(
        halo_owner_local=part.halo_owner_local,
        recv_counts=part.recv_counts,
        num_inner=part.num_inner,
        num_halo=part.num_halo,
        num_edges=int(part.indptr[-1]),
        num_remote_edges=int(np.count_nonzero(part.indices >= part.num_inner)),
    )


def send_lists(parts: list[PartSummary]) -> list[tuple[IntArray, IntArray]]:
    """(send_idx, send_counts) of every part: owner q sends to r the rows r holds in its halo
    block of q, in the same order."""
    out = []
    for q in range(len(parts)):
        blocks = []
        for p in parts:
            start = int(p.recv_counts[:q].sum())
            blocks.append(p.halo_owner_local[start : start + int(p.recv_counts[q])])
        send_counts = np.array([b.shape[0] for b in blocks], dtype=np.int64)
        out.append((np.concatenate(blocks).astype(np.int64), send_counts))
    return out


def partition_stats(num_nodes: int, num_edges: int, parts: list[PartSummary]) -> dict[str, object]:
    """Edge cut, balance, halo sizes and replication factor of an assignment."""
    cut_directed = sum(p.num_remote_edges for p in parts)
    edges = [p.num_edges for p in parts]
    nodes = [p.num_inner for p in parts]
    halo = [p.num_halo for p in parts]
    return {
        "edge_cut": cut_directed // 2,
        "edge_cut_fraction": cut_directed / max(num_edges, 1),
        "balance": max(edges) / max(float(np.mean(edges)), 1e-12),
        "node_balance": max(nodes) / max(float(np.mean(nodes)), 1e-12),
        "nodes": nodes,
        "edges": edges,
        "halo_nodes": halo,
        "replication_factor": (sum(nodes) + sum(halo)) / max(num_nodes, 1),
        "num_undirected_edges": num_edges // 2,
    }
