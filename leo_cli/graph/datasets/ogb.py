"""OGB node-property datasets (`ogbn-arxiv`, `ogbn-products`, `ogbn-papers100M`), offline.

Loading goes through the `ogb` package's `NodePropPredDataset` (imported lazily: it pulls in
pandas), but never lets it touch the network or stdin: the raw files and the split are checked
first, with a clear error when one is missing, and the marker file and folder whose absence
makes ogb prompt or fail (`RELEASE_v1.txt`, `processed/`) are created. ogb caches its parsed
graph as a torch pickle in `processed/`, which torch's `weights_only` default refuses to read
back, hence `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` for the duration of the call.

Nodes without a label (NaN in papers100M) get label 0 and are left out of every split mask.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.errors import DataError
from leo_cli.graph.types import BoolArray, Graph, IntArray, check_graph, symmetrize

_CSV_RAW = (
    "edge.csv.gz",
    "num-node-list.csv.gz",
    "num-edge-list.csv.gz",
    "node-feat.csv.gz",
    "node-label.csv.gz",
)
_SPLIT_FILES = ("train.csv.gz", "valid.csv.gz", "test.csv.gz")


@dataclass(frozen=True)
class OgbSpec:
    """What LEO needs to know about one OGB dataset (from ogb's own master table).

    Attributes:
        raw_files: files that must exist in `raw/` (ogb otherwise starts a download).
        split: name of the folder under `split/` holding the standard split.
        num_classes: number of label classes.
        version: release number; ogb asks on stdin unless `RELEASE_v<version>.txt` exists.
    """

    raw_files: tuple[str, ...]
    split: str
    num_classes: int
    version: int = 1


OGB_DATASETS: dict[str, OgbSpec] = {
    "ogbn-arxiv": OgbSpec((*_CSV_RAW, "node_year.csv.gz"), "time", 40),
    "ogbn-products": OgbSpec(_CSV_RAW, "sales_ranking", 47),
    "ogbn-papers100M": OgbSpec(("data.npz", "node-label.npz"), "time", 172),
}
_UNSUPPORTED = {
    "ogbn-proteins": "has 112 binary labels per node (multi-label), not one class per node",
    "ogbn-mag": "is a heterogeneous graph (several node and edge types)",
}


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


def _missing(path: Path, name: str, root: Path) -> DataError:
    """A DataError naming the missing `path` and how to obtain the dataset."""
    folder = dataset_dir(name, root).name
    return DataError(
        f"{path} is missing: download {name} with the ogb package on a machine with network "
        f"(NodePropPredDataset(name={name!r}, root=...)) and copy its `{folder}` folder into "
        f"data.root = {root} (see datasets/ogbn.md)."
    )


def check_files(name: str, root: Path) -> None:
    """Raise a DataError unless every file ogb reads for `name` is present under `root`."""
    spec = OGB_DATASETS[name]
    folder = dataset_dir(name, root)
    if not (folder / "processed" / "data_processed").is_file():
        for file in spec.raw_files:
            if not (folder / "raw" / file).is_file():
                raise _missing(folder / "raw" / file, name, root)
    split_dir = folder / "split" / spec.split
    if not (split_dir / "split_dict.pt").is_file():
        for file in _SPLIT_FILES:
            if not (split_dir / file).is_file():
                raise _missing(split_dir / file, name, root)


def prepare_folder(name: str, root: Path) -> None:
    """Create the release marker and `processed/` so that ogb neither prompts nor fails."""
    folder = dataset_dir(name, root)
    try:
        (folder / f"RELEASE_v{OGB_DATASETS[name].version}.txt").touch(exist_ok=True)
        (folder / "processed").mkdir(exist_ok=True)
    except OSError as err:
        raise DataError(
            f"cannot write to {folder} ({err.strerror}): ogb caches its parsed graph there, so "
            "data.root must be writable (copy the folder somewhere writable)."
        ) from None


@contextlib.contextmanager
def _ogb_environment() -> Iterator[None]:
    """Let torch read ogb's cache and keep ogb's progress prints off stdout."""
    key = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    previous = os.environ.get(key)
    os.environ[key] = "1"
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            # torch warns that the variable is set (that is the point); importing ogb pulls in
            # torch_geometric, whose use of torch.jit.script is deprecated: not the user's concern.
            warnings.filterwarnings("ignore", message=".*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        if previous is None:
            del os.environ[key]
        else:
            os.environ[key] = previous


def _read_with_ogb(name: str, root: Path) -> tuple[dict[str, Any], np.ndarray, dict[str, Any]]:
    """(graph dict, labels, split dict) as `NodePropPredDataset` returns them."""
    with _ogb_environment():
        from ogb.nodeproppred import NodePropPredDataset

        try:
            dataset = NodePropPredDataset(name=name, root=str(root))
            split = dataset.get_idx_split()
        except (OSError, ValueError, RuntimeError, KeyError, EOFError) as err:
            raise DataError(
                f"ogb could not read {dataset_dir(name, root)} ({type(err).__name__}: {err}); "
                "see datasets/ogbn.md for the expected layout."
            ) from None
    graph, labels = dataset[0]
    return graph, np.asarray(labels), split


def _labels(
    labels: np.ndarray, num_nodes: int, num_classes: int, name: str
) -> tuple[IntArray, BoolArray]:
    """Flat int64 labels (unlabelled -> 0) and the mask of labelled nodes."""
    flat = labels.reshape(-1)
    if flat.shape[0] != num_nodes:
        raise DataError(f"{name}: {flat.shape[0]} labels for {num_nodes} nodes.")
    labelled = np.isfinite(flat) if flat.dtype.kind == "f" else np.ones(flat.shape, np.bool_)
    y = np.where(labelled, flat, 0).astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(
            f"{name}: labels must lie in 0..{num_classes - 1}, found {y.min()}..{y.max()}."
        )
    return y, labelled


def _split_mask(index: Any, labelled: BoolArray, what: str) -> BoolArray:
    """Boolean mask of the node ids in `index`, restricted to labelled nodes."""
    ids = np.asarray(index, dtype=np.int64).reshape(-1)
    num_nodes = labelled.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise DataError(f"{what} holds node ids outside 0..{num_nodes - 1}.")
    mask = np.zeros(num_nodes, dtype=np.bool_)
    mask[ids] = True
    return mask & labelled


def load_ogb(name: str, root: Path) -> Graph:
    """Load OGB node-property dataset `name` from `root` without network access.

    Args:
        name: `ogbn-arxiv`, `ogbn-products` or `ogbn-papers100M` (any letter case).
        root: `data.root`, holding the folder `ogbn_<name>/` as ogb downloads it.

    Returns:
        The graph, made symmetric, with ogb's standard split.

    Raises:
        DataError: the name is not supported, or files are missing or unreadable.
    """
    name = canonical_name(name)
    spec = OGB_DATASETS[name]
    check_files(name, root)
    prepare_folder(name, root)
    raw, labels, split = _read_with_ogb(name, root)
    if raw.get("node_feat") is None:
        raise DataError(f"{name} in {dataset_dir(name, root)} has no node features.")
    num_nodes = int(raw["num_nodes"])
    split_dir = dataset_dir(name, root) / "split" / spec.split
    y, labelled = _labels(labels, num_nodes, spec.num_classes, name)
    graph = Graph(
        name=name,
        edge_index_2E=symmetrize(np.asarray(raw["edge_index"], dtype=np.int64), num_nodes),
        x_NF=np.asarray(raw["node_feat"], dtype=np.float32),
        y_N=y,
        train_mask_N=_split_mask(split["train"], labelled, f"{split_dir}/train"),
        val_mask_N=_split_mask(split["valid"], labelled, f"{split_dir}/valid"),
        test_mask_N=_split_mask(split["test"], labelled, f"{split_dir}/test"),
        num_classes=spec.num_classes,
    )
    check_graph(graph)
    return graph
