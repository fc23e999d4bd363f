"""The in-memory graph every dataset loader returns.

Legend: N nodes, E directed edges, F feature width.
Graphs are stored undirected: every edge appears in both directions, without duplicates and
without self-loops (`edge_index[0]` = source, `edge_index[1]` = target of a message).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]


@dataclass
class Graph:
    """A node-classification graph.

    Attributes:
        name: dataset name.
        edge_index_2E: int64 [2, E], symmetric, no self-loops, no duplicates.
        x_NF: float32 node features.
        y_N: int64 labels in `0..num_classes-1`.
        train_mask_N, val_mask_N, test_mask_N: boolean split masks.
        num_classes: number of label classes.
    """

    name: str
    edge_index_2E: IntArray
    x_NF: FloatArray
    y_N: IntArray
    train_mask_N: BoolArray
    val_mask_N: BoolArray
    test_mask_N: BoolArray
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return int(self.x_NF.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index_2E.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.x_NF.shape[1])

    def degree(self) -> IntArray:
        """In-degree of every node (equal to out-degree: the graph is symmetric)."""
        return np.bincount(self.edge_index_2E[1], minlength=self.num_nodes).astype(np.int64)

    def fingerprint(self) -> str:
        """sha256 over all arrays: identifies the exact graph a partition was built from."""
        h = hashlib.sha256(self.name.encode())
        for arr in (
            self.edge_index_2E,
            self.x_NF,
            self.y_N,
            self.train_mask_N,
            self.val_mask_N,
            self.test_mask_N,
        ):
            a = np.ascontiguousarray(arr)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        return h.hexdigest()


def symmetrize(edge_index_2E: IntArray, num_nodes: int) -> IntArray:
    """Both directions of every edge, self-loops removed, duplicates merged, sorted by target."""
    src = np.asarray(edge_index_2E[0], dtype=np.int64)
    dst = np.asarray(edge_index_2E[1], dtype=np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    both_src = np.concatenate([src, dst])
    both_dst = np.concatenate([dst, src])
    key = unique_int(both_dst * num_nodes + both_src)
    return np.stack([key % num_nodes, key // num_nodes]).astype(np.int64)


def unique_int(values: IntArray) -> IntArray:
    """Sorted unique values of an int64 array.

    `np.unique` hashes large int64 arrays in numpy 2.x (25 s for 20M values here); a sort and
    a neighbour comparison take 0.3 s.
    """
    key = np.sort(values)
    if key.shape[0] == 0:
        return key
    keep = np.empty(key.shape[0], dtype=np.bool_)
    keep[0] = True
    np.not_equal(key[1:], key[:-1], out=keep[1:])
    return key[keep]


def check_graph(g: Graph) -> None:
    """Internal invariants every loader must meet (asserts, not user errors)."""
    n = g.num_nodes
    assert g.edge_index_2E.dtype == np.int64 and g.edge_index_2E.shape[0] == 2
    assert g.x_NF.dtype == np.float32 and g.x_NF.ndim == 2
    assert g.y_N.shape == (n,) and g.y_N.dtype == np.int64
    for m in (g.train_mask_N, g.val_mask_N, g.test_mask_N):
        assert m.shape == (n,) and m.dtype == np.bool_
    if g.num_edges:
        assert g.edge_index_2E.min() >= 0 and g.edge_index_2E.max() < n
