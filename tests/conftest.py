"""Shared fixtures: small generated graphs and the location of ../shared/datasets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from leo_cli.graph.types import Graph, symmetrize


def shared_datasets() -> Path:
    env = os.environ.get("LEO_SHARED_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture
def planetoid_root() -> Path:
    root = shared_datasets() / "planetoid"
    if not (root / "ind.cora.graph").is_file():
        pytest.skip(f"real Cora files not found under {root} (set LEO_SHARED_DATASETS)")
    return root


def random_graph(
    num_nodes: int = 60,
    num_edges: int = 200,
    num_features: int = 5,
    num_classes: int = 3,
    seed: int = 0,
) -> Graph:
    """A small random undirected graph with random features, labels and splits."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, num_nodes, size=(2, num_edges))
    split = rng.integers(0, 3, num_nodes)
    return Graph(
        name="random",
        edge_index_2E=symmetrize(edges, num_nodes),
        x_NF=rng.standard_normal((num_nodes, num_features)).astype(np.float32),
        y_N=rng.integers(0, num_classes, num_nodes).astype(np.int64),
        train_mask_N=split == 0,
        val_mask_N=split == 1,
        test_mask_N=split == 2,
        num_classes=num_classes,
    )
