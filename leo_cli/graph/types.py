"""The in-memory graph every dataset loader returns.

Legend: N nodes, E directed edges, F feature width.
Graphs are stored undirected: every edge appears in both directions, without duplicates and
without self-loops (`edge_index[0]` = source, `edge_index[1]` = target of a message), sorted by
(target, source). Node ids are int32 when they fit (half the bytes of the largest array).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
IdArray = npt.NDArray[np.signedinteger[Any]]
FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]
ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)

# Elements per block of the chunked passes: big enough for numpy's speed, small enough that a
# block's temporaries (a few int64 copies) stay in the tens of megabytes.
CHUNK = 1 << 22
# The most nodes a graph may have: `target * N + source` (the symmetrising key) stays in int64.
MAX_NODES = math.isqrt(np.iinfo(np.int64).max)
# The most label classes: the output layer is hidden x classes on every worker.
MAX_CLASSES = 1 << 16


@dataclass
class Graph:
    """A node-classification graph.

    Attributes:
        name: dataset name.
        edge_index_2E: int32 (int64 past 2^31 nodes) [2, E], symmetric, no self-loops, no
            duplicates, sorted by (target, source).
        x_NF: float32 node features.
        y_N: int64 labels in `0..num_classes-1`.
        train_mask_N, val_mask_N, test_mask_N: boolean split masks.
        num_classes: number of label classes.
    """

    name: str
    edge_index_2E: IdArray
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
        """sha256 over all arrays: identifies the exact graph a partition was built from.

        Edges are hashed as int64 whatever their dtype, so a fingerprint does not change with
        the id width; arrays are hashed in place (no `tobytes` copy).
        """
        h = hashlib.sha256(self.name.encode())
        edges = self.edge_index_2E
        h.update(str((np.dtype(np.int64).str, edges.shape)).encode())
        for row in edges:
            for lo in range(0, row.shape[0], CHUNK):
                h.update(np.ascontiguousarray(row[lo : lo + CHUNK], dtype=np.int64).data)
        for arr in (self.x_NF, self.y_N, self.train_mask_N, self.val_mask_N, self.test_mask_N):
            a = np.ascontiguousarray(arr)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.reshape(-1).view(np.uint8).data)
        return h.hexdigest()


@dataclass(frozen=True)
class DatasetInfo:
    """What a worker needs to know of the whole dataset (META.json's `dataset` holds it)."""

    num_features: int
    num_classes: int
    num_train: int  # training nodes of the whole graph: each worker's loss is scaled by it

    @classmethod
    def of(cls, graph: Graph) -> DatasetInfo:
        return cls(graph.num_features, graph.num_classes, int(graph.train_mask_N.sum()))

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> DatasetInfo:
        """From a partition folder's META.json (checked on reading: graph/meta_check.py)."""
        d = meta["dataset"]
        return cls(int(d["num_features"]), int(d["num_classes"]), int(d["num_train"]))


def id_dtype(num_nodes: int) -> np.dtype[np.signedinteger[Any]]:
    """int32 when every node id fits, else int64."""
    return np.dtype(np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64)


def symmetrize(edge_index_2E: npt.NDArray[np.integer[Any]], num_nodes: int) -> IdArray:
    """Both directions of every edge, self-loops removed, duplicates merged, sorted by
    (target, source); ids as `id_dtype(num_nodes)`.

    Works on one int64 key per directed edge (target * N + source), sorted and deduplicated
    in place, so the peak is that key array plus the output, whatever the input's size.
    """
    assert num_nodes <= MAX_NODES, num_nodes  # loaders refuse larger graphs as a DataError
    key = edge_keys(edge_index_2E, num_nodes)
    key.sort()
    key = compact_unique(key)
    out = np.empty((2, key.shape[0]), dtype=id_dtype(num_nodes))
    for lo in range(0, key.shape[0], CHUNK):
        block = key[lo : lo + CHUNK]
        out[0, lo : lo + CHUNK] = block % num_nodes
        out[1, lo : lo + CHUNK] = block // num_nodes
    return out


def edge_keys(edge_index_2E: npt.NDArray[np.integer[Any]], num_nodes: int) -> IntArray:
    """`target * N + source` of both directions of every non-loop edge, unsorted, int64."""
    src, dst = edge_index_2E[0], edge_index_2E[1]
    num_kept = int(np.count_nonzero(src != dst))
    key = np.empty(2 * num_kept, dtype=np.int64)
    at = 0
    for lo in range(0, src.shape[0], CHUNK):
        s = src[lo : lo + CHUNK].astype(np.int64)
        d = dst[lo : lo + CHUNK].astype(np.int64)
        keep = s != d
        s, d = s[keep], d[keep]
        fwd, bwd = key[at : at + s.shape[0]], key[num_kept + at : num_kept + at + s.shape[0]]
        np.multiply(d, num_nodes, out=fwd)
        fwd += s
        np.multiply(s, num_nodes, out=bwd)
        bwd += d
        at += s.shape[0]
    return key


def compact_unique(key: IntArray) -> IntArray:
    """Drop repeats from a sorted array in place, block by block; returns the unique prefix.

    Writing never overtakes reading (a block's survivors land at or before the block), and
    each block's last value is kept aside before it can be overwritten.
    """
    at = 0
    prev: int | None = None
    for lo in range(0, key.shape[0], CHUNK):
        block = key[lo : lo + CHUNK]
        keep = np.empty(block.shape[0], dtype=np.bool_)
        keep[0] = prev is None or block[0] != prev
        np.not_equal(block[1:], block[:-1], out=keep[1:])
        prev = int(block[-1])
        survivors = block[keep]
        key[at : at + survivors.shape[0]] = survivors
        at += survivors.shape[0]
    return key[:at]


def unique_int(values: IntArray) -> IntArray:
    """Sorted unique values of an int64 array.

    `np.unique` hashes large int64 arrays in numpy 2.x (25 s for 20M values here); a sort and
    a neighbour comparison take 0.3 s.
    """
    return compact_unique(np.sort(values)).copy()


def check_graph(g: Graph) -> None:
    """Internal invariants every loader must meet (asserts, not user errors)."""
    n = g.num_nodes
    assert g.edge_index_2E.dtype in (np.int32, np.int64) and g.edge_index_2E.shape[0] == 2
    assert g.x_NF.dtype == np.float32 and g.x_NF.ndim == 2
    assert g.y_N.shape == (n,) and g.y_N.dtype == np.int64
    for m in (g.train_mask_N, g.val_mask_N, g.test_mask_N):
        assert m.shape == (n,) and m.dtype == np.bool_
    if g.num_edges:
        assert g.edge_index_2E.min() >= 0 and g.edge_index_2E.max() < n


def row_normalise(x: np.ndarray) -> FloatArray:
    """Divide each row by its sum (zero rows stay zero), as float32: PyG's
    `NormalizeFeatures`."""
    row_sum = np.asarray(x.sum(axis=1, keepdims=True), dtype=np.float64)
    scale = np.divide(1.0, row_sum, out=np.zeros_like(row_sum), where=row_sum != 0)
    return np.asarray(x * scale, dtype=np.float32)
