"""OGB node-property datasets (`ogbn-arxiv`, `ogbn-products`, `ogbn-papers100M`), offline.

The raw files are parsed as numbers and never unpickled (ogb's own caches are torch pickles,
which can run code); nothing is written to `data.root` and nothing is downloaded, and
`source_files` lists exactly the files read. The result is what ogb's loader gives; a bad file
is named in a one-sentence `DataError`.

Specification: docs/design/datasets.md; dataset card: datasets/ogbn.md.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from leo_cli.errors import DataError
from leo_cli.graph.types import BoolArray, FloatArray, Graph, IntArray, check_graph, symmetrize

_CSV_RAW = (
    "edge.csv.gz",
    "num-node-list.csv.gz",
    "num-edge-list.csv.gz",
    "node-feat.csv.gz",
    "node-label.csv.gz",
)
_NPZ_RAW = ("data.npz", "node-label.npz")
_SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class OgbSpec:
    """What LEO needs to know about one OGB dataset (from ogb's own master table).

    Attributes:
        raw_files: the files of `raw/` that LEO reads.
        split: name of the folder under `split/` holding the standard split.
        num_classes: number of label classes.
    """

    raw_files: tuple[str, ...]
    split: str
    num_classes: int


OGB_DATASETS: dict[str, OgbSpec] = {
    "ogbn-arxiv": OgbSpec(_CSV_RAW, "time", 40),
    "ogbn-products": OgbSpec(_CSV_RAW, "sales_ranking", 47),
    "ogbn-papers100M": OgbSpec(_NPZ_RAW, "time", 172),
}
_UNSUPPORTED = {
    "ogbn-proteins": "has 112 binary labels per node (multi-label), not one class per node",
    "ogbn-mag": "is a heterogeneous graph (several node and edge types)",
}


@dataclass
class RawGraph:
    """The raw arrays of one OGB graph, checked for shape and range.

    Attributes:
        edge_index_2E: int64 [2, E], directed as stored.
        x_NF: float32 node features.
        labels: the labels as stored (one per node; float with NaN for unlabelled nodes).
        label_file: the file they come from.
    """

    edge_index_2E: IntArray
    x_NF: FloatArray
    labels: np.ndarray
    label_file: Path


def canonical_name(name: str) -> str:
    """The spelling ogb uses for `name` (matched case-insensitively)."""
    by_lower = {known.lower(): known for known in (*OGB_DATASETS, *_UNSUPPORTED)}
    canonical = by_lower.get(name.lower())
    if canonical is None:
        accepted = ", ".join(f"`{n}`" for n in OGB_DATASETS)
        raise DataError(f"data.name = {name!r} is not an OGB dataset LEO can load: use {accepted}.")
    if canonical in _UNSUPPORTED:
        raise DataError(
            f"{canonical} {_UNSUPPORTED[canonical]}, which LEO does not train on; "
            f"use one of {', '.join(OGB_DATASETS)}."
        )
    return canonical


def dataset_dir(name: str, root: Path) -> Path:
    """Folder ogb uses for dataset `name` under `root` (`ogbn-arxiv` -> `root/ogbn_arxiv`)."""
    return root / name.replace("-", "_")


def source_files(name: str, root: Path) -> list[Path]:
    """Every file `load_ogb` reads for dataset `name` (canonical spelling), in reading order."""
    spec = OGB_DATASETS[name]
    folder = dataset_dir(name, root)
    raw = [folder / "raw" / file for file in spec.raw_files]
    return raw + [folder / "split" / spec.split / f"{part}.csv.gz" for part in _SPLITS]


def check_files(name: str, root: Path) -> None:
    """Raise a DataError naming the first file of `source_files` that is missing."""
    for path in source_files(name, root):
        if not path.is_file():
            folder = dataset_dir(name, root).name
            raise DataError(
                f"{path} is missing: download {name} with the ogb package on a machine with "
                f"network (NodePropPredDataset(name={name!r}, root=...)) and copy its `{folder}` "
                f"folder into data.root = {root} (see datasets/ogbn.md)."
            )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def read_csv(path: Path, num_columns: int | None = None) -> np.ndarray:
    """The numbers of header-less gzip CSV file `path` as a 2-D int64 or float64 array.

    Missing entries (`nan`, empty fields, short rows) read as NaN, which makes the array float.

    Raises:
        DataError: naming the file, when it is not gzip CSV, holds something other than
            numbers, or has rows of other than `num_columns` entries.
    """
    import pandas as pd  # imported here: it takes a second to import

    try:
        values = pd.read_csv(path, header=None, compression="gzip").to_numpy()
    except pd.errors.EmptyDataError:
        values = np.zeros((0, num_columns or 0), dtype=np.int64)
    except (OSError, EOFError, ValueError, zlib.error) as err:
        raise DataError(f"{path} is not a readable gzip CSV file ({_one_line(err)}).") from None
    if values.dtype.kind not in "iuf":
        raise DataError(f"{path} holds entries that are not numbers (a header or text?).")
    if num_columns is not None and values.shape[1] != num_columns:
        raise DataError(f"{path} has {values.shape[1]} columns, expected {num_columns}.")
    return np.asarray(values)


def read_ids(path: Path, num_columns: int, num_nodes: int | None = None) -> IntArray:
    """Integer CSV `path` with `num_columns` columns, checked to lie in 0..num_nodes-1.

    Without `num_nodes`, the values only need to be non-negative integers.
    """
    values = read_csv(path, num_columns)
    if values.size and values.dtype.kind != "i":
        raise DataError(
            f"{path} must hold whole numbers only, found missing, fractional or huge entries."
        )
    ids = values.astype(np.int64)
    if ids.size and ids.min() < 0:
        raise DataError(f"{path} holds the negative number {ids.min()}; ids and counts are >= 0.")
    if num_nodes is not None and ids.size and ids.max() >= num_nodes:
        raise DataError(
            f"{path} holds node id {ids.max()}, outside 0..{num_nodes - 1} (the graph's nodes)."
        )
    return ids


def _single_count(path: Path) -> int:
    """The one number in `num-node-list`/`num-edge-list` (node-property sets have one graph)."""
    counts = read_ids(path, 1)
    if counts.shape[0] != 1:
        raise DataError(f"{path} must hold one count (one graph), found {counts.shape[0]} rows.")
    return int(counts[0, 0])


def _features(path: Path, x: np.ndarray, num_nodes: int, counted_in: str) -> FloatArray:
    """Float32 features, one finite row per node (`counted_in` says where the count is from)."""
    if x.ndim != 2 or x.shape[0] != num_nodes:
        raise DataError(
            f"{path} has {x.shape[0]} feature rows, but {counted_in} counts {num_nodes} nodes."
        )
    if x.dtype.kind not in "iuf" or not np.isfinite(x).all():
        raise DataError(f"{path} holds missing, infinite or non-numeric features.")
    return np.asarray(x, dtype=np.float32)


def _read_csv_graph(raw_dir: Path) -> RawGraph:
    """The graph in the gzip CSV files of `raw_dir` (arxiv, products)."""
    num_nodes = _single_count(raw_dir / "num-node-list.csv.gz")
    num_edges = _single_count(raw_dir / "num-edge-list.csv.gz")
    feat_path = raw_dir / "node-feat.csv.gz"
    x = _features(feat_path, read_csv(feat_path), num_nodes, "num-node-list.csv.gz")
    edge_path = raw_dir / "edge.csv.gz"
    edges = read_ids(edge_path, 2, num_nodes)
    if edges.shape[0] != num_edges:
        raise DataError(
            f"{edge_path} has {edges.shape[0]} edges but num-edge-list.csv.gz says {num_edges}."
        )
    label_path = raw_dir / "node-label.csv.gz"
    return RawGraph(edges.T.copy(), x, read_csv(label_path, 1), label_path)


def _read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Arrays `keys` of `.npz` archive `path`, read without pickle support."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [key for key in keys if key not in archive.files]
            if missing:
                raise DataError(f"{path} has no array `{missing[0]}`.")
            return {key: np.asarray(archive[key]) for key in keys}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise DataError(f"{path} is not a readable .npz archive ({_one_line(err)}).") from None


def _read_npz_graph(raw_dir: Path) -> RawGraph:
    """The graph in `data.npz` and `node-label.npz` of `raw_dir` (papers100M)."""
    path = raw_dir / "data.npz"
    data = _read_npz(path, ("edge_index", "num_nodes_list", "num_edges_list", "node_feat"))
    counts = [data[key].reshape(-1) for key in ("num_nodes_list", "num_edges_list")]
    edges = data["edge_index"]
    if any(c.shape != (1,) or c.dtype.kind not in "iu" for c in counts) or edges.ndim != 2:
        raise DataError(f"{path} must hold one graph: one node and one edge count, edge_index.")
    num_nodes, num_edges = int(counts[0][0]), int(counts[1][0])
    if edges.shape != (2, num_edges) or edges.dtype.kind not in "iu":
        raise DataError(f"{path}: edge_index must be integers of shape (2, {num_edges}).")
    x = _features(path, data["node_feat"], num_nodes, "its num_nodes_list")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise DataError(f"{path}: edge_index holds node ids outside 0..{num_nodes - 1}.")
    label_path = raw_dir / "node-label.npz"
    labels = _read_npz(label_path, ("node_label",))["node_label"]
    return RawGraph(edges.astype(np.int64), x, labels, label_path)


def _labels(path: Path, labels: np.ndarray, num_nodes: int, num_classes: int) -> np.ndarray:
    """Flat labels as float64, NaN for unlabelled nodes, checked to be classes."""
    flat = labels.reshape(-1)
    if labels.ndim > 2 or flat.shape[0] != num_nodes or flat.dtype.kind not in "iuf":
        raise DataError(f"{path} must hold one number per node ({num_nodes} nodes).")
    y = flat.astype(np.float64)
    known = y[~np.isnan(y)]
    if known.size and not (np.all(known == np.round(known)) and known.min() >= 0):
        raise DataError(f"{path} holds labels that are not class numbers 0..{num_classes - 1}.")
    if known.size and known.max() >= num_classes:
        raise DataError(f"{path} holds label {known.max():.0f}; classes are 0..{num_classes - 1}.")
    return y


def _split_mask(path: Path, labelled: BoolArray) -> BoolArray:
    """Boolean mask of the node ids listed in `path`, restricted to labelled nodes."""
    ids = read_ids(path, 1, labelled.shape[0]).reshape(-1)
    mask = np.zeros(labelled.shape[0], dtype=np.bool_)
    mask[ids] = True
    return mask & labelled


def load_ogb(name: str, root: Path) -> Graph:
    """Load OGB node-property dataset `name` from `root`, from its raw files only.

    Args:
        name: `ogbn-arxiv`, `ogbn-products` or `ogbn-papers100M` (any letter case).
        root: `data.root`, holding the folder `ogbn_<name>/` as ogb downloads it.

    Returns:
        The graph, made symmetric, with ogb's standard split.

    Raises:
        DataError: the name is not supported, or a file is missing or malformed.
    """
    name = canonical_name(name)
    spec = OGB_DATASETS[name]
    check_files(name, root)
    folder = dataset_dir(name, root)
    binary = spec.raw_files == _NPZ_RAW
    raw = _read_npz_graph(folder / "raw") if binary else _read_csv_graph(folder / "raw")
    num_nodes = raw.x_NF.shape[0]
    y = _labels(raw.label_file, raw.labels, num_nodes, spec.num_classes)
    labelled = ~np.isnan(y)
    split_dir = folder / "split" / spec.split
    train, val, test = (_split_mask(split_dir / f"{p}.csv.gz", labelled) for p in _SPLITS)
    graph = Graph(
        name=name,
        edge_index_2E=symmetrize(raw.edge_index_2E, num_nodes),
        x_NF=raw.x_NF,
        y_N=np.where(labelled, y, 0).astype(np.int64),
        train_mask_N=train,
        val_mask_N=val,
        test_mask_N=test,
        num_classes=spec.num_classes,
    )
    check_graph(graph)
    return graph
