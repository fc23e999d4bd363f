"""LEO's GCN and PyG's GCNConv, given the same weights, compute the same float64 logits:
an independent check of LEO's normalisation (global degrees, self-loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_graph

from leo_cli.bench.peers import PygGAT, PygGCN, adjacency
from leo_cli.config import load_config
from leo_cli.graph.layout import build_parts
from leo_cli.graph.types import DatasetInfo
from leo_cli.registry import peer_of
from leo_cli.worker.assemble import assemble

pytest.importorskip("torch_geometric")


@pytest.mark.parametrize("system", ["pyg", "pyg-csr"])
def test_leo_gcn_equals_pyg_gcnconv(system: str) -> None:
    g = random_graph(num_nodes=80, num_edges=300, num_features=6, num_classes=3, seed=4)
    cfg = load_config(
        None,
        [
            "train.dtype=float64",
            "model.hidden_channels=5",
            "model.num_layers=3",
            "pipeline.mode=leo",  # assemble runs a resolved mode (auto is the launcher's)
        ],
    )
    part = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    info = DatasetInfo.of(g)
    job = assemble(cfg, part, info, 1, torch.device("cpu"))
    peer = PygGCN(cfg.model, 6, 3).double()
    for ours, theirs in zip(job.model.convs, peer.convs, strict=True):
        theirs.lin.weight.data.copy_(ours.lin.weight.data)
        theirs.bias.data.copy_(ours.bias.data)
    job.model.eval()
    peer.eval()
    x = torch.from_numpy(g.x_NF).double()
    with torch.no_grad():
        leo_logits = job.model(x, job.graph)
        pyg_logits = peer(
            x, adjacency(g.edge_index_2E, g.num_nodes, peer_of(system), torch.float64)
        )
    torch.testing.assert_close(leo_logits, pyg_logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("system", ["pyg", "pyg-csr"])
def test_leo_gat_equals_pyg_gatconv(system: str) -> None:
    """Scores, self-loops, per-row softmax, concatenated then averaged heads, ELU: as GATConv."""
    g = random_graph(num_nodes=80, num_edges=300, num_features=6, num_classes=3, seed=4)
    cfg = load_config(
        None,
        [
            "train.dtype=float64",
            "model.name=gat",
            "model.heads=3",
            "model.output_heads=2",
            "model.hidden_channels=4",
            "model.num_layers=3",
            "pipeline.mode=leo",
        ],
    )
    part = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    info = DatasetInfo.of(g)
    job = assemble(cfg, part, info, 1, torch.device("cpu"))
    peer = PygGAT(cfg.model, 6, 3).double()
    for ours, theirs in zip(job.model.convs, peer.convs, strict=True):
        theirs.lin.weight.data.copy_(ours.lin.weight.data)
        theirs.att_src.data.copy_(ours.att_src.data.unsqueeze(0))
        theirs.att_dst.data.copy_(ours.att_dst.data.unsqueeze(0))
        theirs.bias.data.copy_(ours.bias.data)
    job.model.eval()
    peer.eval()
    x = torch.from_numpy(g.x_NF).double()
    with torch.no_grad():
        leo_logits = job.model(x, job.graph)
        pyg_logits = peer(
            x, adjacency(g.edge_index_2E, g.num_nodes, peer_of(system), torch.float64)
        )
    torch.testing.assert_close(leo_logits, pyg_logits, rtol=1e-12, atol=1e-12)
