"""scripts/memory_floor.py: the rows its dram-gather floor gathers are those LEO's aggregation
gathers (the column indices of a worker's CSR), in that order, not the graph's sorted
targets."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from leo_cli.config.schema import SyntheticConfig
from leo_cli.graph.datasets.synthetic import generate
from leo_cli.graph.layout import build_parts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import memory_floor  # noqa: E402


def test_the_floor_gathers_the_column_indices_of_a_workers_csr() -> None:
    graph = generate(SyntheticConfig(num_nodes=300, avg_degree=6, num_features=4), seed=0)
    (part,) = build_parts(graph, np.zeros(graph.num_nodes, dtype=np.int64), 1)
    gathered = memory_floor.gathered_rows(graph.edge_index_2E)
    assert torch.equal(gathered, torch.as_tensor(np.asarray(part.indices), dtype=torch.int64))
    assert not torch.equal(gathered, gathered.sort().values)  # rows read out of order
