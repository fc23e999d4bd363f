"""scripts/memory_floor.py: the rows its dram-gather floor gathers are those an aggregation
gathers (LEO's CSR of the graph), not the graph's sorted targets."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from leo_cli.config.schema import SyntheticConfig
from leo_cli.graph.datasets.synthetic import generate
from leo_cli.kernels.csr import CSR

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import memory_floor  # noqa: E402


def test_the_floor_gathers_the_csr_column_indices() -> None:
    graph = generate(SyntheticConfig(num_nodes=300, avg_degree=6, num_features=4), seed=0)
    src, dst = (torch.from_numpy(graph.edge_index_2E[i].astype(np.int64)) for i in (0, 1))
    csr = CSR.from_coo(dst, src, None, graph.num_nodes, graph.num_nodes, transpose=False)
    gathered = memory_floor.gathered_rows(graph.edge_index_2E)
    assert torch.equal(gathered, csr.indices.to(torch.int64))
    assert not torch.equal(gathered, gathered.sort().values)  # rows read out of order
