"""PyTorch Geometric peers, timed on the same graph, widths, dropout and optimizer as LEO.

`pyg` is `GCNConv` on `edge_index` with cached normalisation, trained as PyG's GCN example
does (for `model.name=gat`, `GATConv` with LEO's heads, ELU and both dropouts); `pyg-csr` is
the same model on a sparse CSR adjacency. Each runs in its own process
(`python -m leo_cli.bench.peers CONFIG SYSTEM EPOCHS`), with the thread count LEO's single
worker gets, and prints one JSON line: per-epoch step times, the final test accuracy, its
set-up (process start to the first step: imports, the graph, the adjacency, the model and
GCNConv's cached normalisation, made by one forward pass) and its wall time. They train on the
device LEO's workers use (`launch.device`: on a GPU when LEO trains on one), timed after a
device synchronisation each epoch.
Legend: N nodes, F features, C classes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leo_cli.comm.dist import uses_cuda
from leo_cli.config import LeoConfig, load_config
from leo_cli.config.schema import ModelConfig
from leo_cli.graph.datasets import load_dataset
from leo_cli.registry import conv_of
from leo_cli.util.rss import peak_rss_bytes
from leo_cli.util.timing import process_start_time
from leo_cli.worker.memory import after_setup, fix_mmap_threshold

PEERS = ("pyg", "pyg-csr")


def pyg_available() -> bool:
    return importlib.util.find_spec("torch_geometric") is not None


class PygGCN(nn.Module):
    """`num_layers` GCNConv layers, ReLU and dropout between them, as in PyG's GCN example."""

    def __init__(self, cfg: ModelConfig, in_channels: int, out_channels: int) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        widths = [in_channels] + [cfg.hidden_channels] * (cfg.num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(
            GCNConv(a, b, cached=True) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.dropout = cfg.dropout
        self.input_dropout = cfg.effective_input_dropout

    def forward(self, x_NF: Tensor, adj: Any) -> Tensor:
        h = x_NF
        for layer, conv in enumerate(self.convs):
            p = self.input_dropout if layer == 0 else self.dropout
            h = F.dropout(h, p=p, training=self.training)
            h = conv(h, adj)
            if layer < len(self.convs) - 1:
                h = h.relu()
        return h


class PygGAT(nn.Module):
    """GATConv layers as in PyG's GAT example: heads concatenated, then averaged at the output;
    ELU, dropout on every layer's input and on the attention weights."""

    def __init__(self, cfg: ModelConfig, in_channels: int, out_channels: int) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv

        convs, width = [], in_channels
        for _ in range(cfg.num_layers - 1):
            convs.append(
                GATConv(width, cfg.hidden_channels, heads=cfg.heads, dropout=cfg.attention_dropout)
            )
            width = cfg.heads * cfg.hidden_channels
        convs.append(
            GATConv(
                width,
                out_channels,
                heads=cfg.output_heads,
                concat=False,
                dropout=cfg.attention_dropout,
            )
        )
        self.convs = nn.ModuleList(convs)
        self.dropout = cfg.dropout
        self.input_dropout = cfg.effective_input_dropout

    def forward(self, x_NF: Tensor, adj: Any) -> Tensor:
        h = x_NF
        for layer, conv in enumerate(self.convs):
            p = self.input_dropout if layer == 0 else self.dropout
            h = conv(F.dropout(h, p=p, training=self.training), adj)
            if layer < len(self.convs) - 1:
                h = F.elu(h)
        return h


# The PyG layer each convolution compares with (registry: `Conv.pyg_peer`).
PEER_MODELS: dict[str, type[nn.Module]] = {"GCNConv": PygGCN, "GATConv": PygGAT}


def adjacency(
    edge_index_2E: np.ndarray, num_nodes: int, system: str, dtype: torch.dtype = torch.float32
) -> Any:
    """`edge_index` for `pyg`, a sparse CSR adjacency (adj_t, values of `dtype`) for `pyg-csr`."""
    edge_index = torch.from_numpy(np.ascontiguousarray(edge_index_2E, dtype=np.int64))
    if system == "pyg":
        return edge_index
    from torch_geometric.utils import to_torch_csr_tensor

    # GCNConv aggregates over adj_t (row = target); the graph is symmetric, so adj_t = adj.
    ones = torch.ones(edge_index.shape[1], dtype=dtype)
    return to_torch_csr_tensor(edge_index, ones, size=(num_nodes, num_nodes))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_peer(cfg: LeoConfig, system: str, num_epochs: int) -> dict[str, Any]:
    """Train `num_epochs` full-graph epochs; per-epoch step seconds, final test accuracy,
    set-up and wall seconds."""
    started = process_start_time()
    device = torch.device("cuda" if uses_cuda(cfg.launch) else "cpu")
    torch.manual_seed(cfg.run.seed)
    g = load_dataset(cfg.data, cfg.run.seed)
    x = torch.from_numpy(g.x_NF).to(device)
    y = torch.from_numpy(g.y_N).to(device)
    train = torch.from_numpy(g.train_mask_N).to(device)
    adj = adjacency(g.edge_index_2E, g.num_nodes, system).to(device)
    peer = conv_of(cfg.model.name).pyg_peer
    assert peer is not None, "leo bench runs peers only for models that have one"
    model = PEER_MODELS[peer](cfg.model, g.num_features, g.num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    if peer == "GCNConv":  # cached=True normalises on its first call
        model.eval()
        with torch.no_grad():
            model(x, adj)
    sync(device)
    setup_s = time.time() - started
    after_setup(cfg.launch.keep_freed_memory)  # as LEO's workers do (worker/memory.py)
    times = []
    for _ in range(num_epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, adj)[train], y[train])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        pred = model(x, adj).argmax(dim=1)
    test = torch.from_numpy(g.test_mask_N).to(device)
    acc = float((pred[test] == y[test]).float().mean()) if bool(test.any()) else None
    return {
        "epoch_times": times,
        "test_acc": acc,
        "final_loss": float(loss),
        "setup_s": setup_s,
        "run_setup_s": setup_s,  # a peer reuses nothing
        "wall_s": time.time() - started,
        "peak_rss_bytes": [peak_rss_bytes()],
        "peak_rss_total_bytes": peak_rss_bytes(),  # the peer is one process
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m leo_cli.bench.peers")
    parser.add_argument("config", type=Path, help="resolved config YAML of the benchmark")
    parser.add_argument("system", choices=PEERS)
    parser.add_argument("epochs", type=int, help="epochs to train (warm-up included)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args(argv)
    fix_mmap_threshold()  # the workers' allocator settings (worker/memory.py)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result = train_peer(load_config(args.config), args.system, args.epochs)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
