"""The peers of `leo bench`: PyTorch Geometric's, timed on the same graph, widths, dropout and
optimizer as LEO, and what the peers run as scripts under another interpreter need (the graph
file, their model spec, whether their framework imports there: `dgl_peer.py`).

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
import functools
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leo_cli.bench.dgl_peer import NOT_IMPORTABLE
from leo_cli.comm.dist import uses_cuda
from leo_cli.config import LeoConfig, load_config
from leo_cli.config.schema import ModelConfig
from leo_cli.errors import ConfigError
from leo_cli.graph.datasets import load_dataset
from leo_cli.registry import PEERS, Peer, conv_of, peer_of
from leo_cli.util import files
from leo_cli.util.rss import peak_rss_bytes, trim_heap
from leo_cli.util.timing import process_start_time
from leo_cli.worker.memory import after_setup, fix_mmap_threshold

IN_PROCESS = [p.name for p in PEERS.values() if p.script is None]  # run by this module
GRAPH_FILE = "peer-graph.npz"  # in the bench's out_dir, for the peers run as scripts


def script_path(peer: Peer) -> Path:
    """The script file of a peer that runs under `bench.peer_python`."""
    assert peer.script is not None
    return Path(__file__).with_name(peer.script)


def peer_python(cfg: LeoConfig) -> str:
    """The interpreter of the peers run as scripts: `bench.peer_python`, or LEO's own."""
    return str(cfg.bench.peer_python or sys.executable)


def peer_missing(cfg: LeoConfig, peer: Peer) -> str | None:
    """Why `peer` cannot run here, as a clause (None: it can): its framework does not import,
    or has no layer for `model.name`.

    Raises:
        ConfigError: `bench.peer_python` cannot be run.
    """
    layer = conv_of(cfg.model.name).peer_layer(peer.framework)
    if peer.script is not None:
        if layer is None:
            return f"{peer.framework} has no peer layer for model.name={cfg.model.name}"
        return script_missing(peer_python(cfg), script_path(peer))
    if importlib.util.find_spec(peer.package) is None:
        return f"{peer.package} is not installed (make install adds it)"
    if layer not in PEER_MODELS:
        return (
            f"the {peer.framework} peers compare {' and '.join(PEER_MODELS)} only; "
            f"model.name={cfg.model.name}"
        )
    return None


@functools.cache
def script_missing(python: str, script: Path) -> str | None:
    """Why a peer script's framework does not import under `python` (its `--check`), as a
    clause; None when it does. Asked once per interpreter and script.

    Raises:
        ConfigError: `python` cannot be run.
    """
    try:
        proc = subprocess.run(
            [python, str(script), "--check"], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(
            f"bench.peer_python={python} cannot be run ({exc}); name a Python interpreter."
        ) from None
    if proc.returncode == 0:
        return None
    said = (proc.stdout.strip() or proc.stderr.strip() or "no output").splitlines()[-1]
    if proc.returncode == NOT_IMPORTABLE:
        return said.rstrip(".") + "; bench.peer_python names an interpreter that has it"
    return f"{python} {script.name} --check failed ({said})"


def write_peer_files(cfg: LeoConfig, out_dir: Path, peers: list[Peer]) -> None:
    """The graph (`peer-graph.npz`: x_NF, y_N, train_mask_N, test_mask_N, edge_index_2E) and
    each peer's model spec (`peer-<name>.json`) that the peers run as scripts read."""
    scripted = [p for p in peers if p.script is not None]
    if not scripted:
        return
    g = load_dataset(cfg.data, cfg.run.seed)
    with files.atomic_file(out_dir / GRAPH_FILE) as f:
        np.savez(
            f, x_NF=g.x_NF, y_N=g.y_N, train_mask_N=g.train_mask_N, test_mask_N=g.test_mask_N,
            edge_index_2E=g.edge_index_2E,
        )  # fmt: skip
    for peer in scripted:
        files.write_text(spec_path(out_dir, peer), json.dumps(peer_spec(cfg, peer)))


def spec_path(out_dir: Path, peer: Peer) -> Path:
    return out_dir / f"peer-{peer.name}.json"


def peer_spec(cfg: LeoConfig, peer: Peer) -> dict[str, Any]:
    """What a peer script trains: its layer, LEO's widths, dropout and optimizer, the seed
    and the device LEO's workers use."""
    m, t = cfg.model, cfg.train
    return {
        "layer": conv_of(m.name).peer_layer(peer.framework),
        "attention": conv_of(m.name).attention,
        "hidden_channels": m.hidden_channels,
        "num_layers": m.num_layers,
        "dropout": m.dropout,
        "input_dropout": m.effective_input_dropout,
        "heads": m.heads,
        "output_heads": m.output_heads,
        "attention_dropout": m.attention_dropout,
        "lr": t.lr,
        "weight_decay": t.weight_decay,
        "seed": cfg.run.seed,
        "device": "cuda" if uses_cuda(cfg.launch) else "cpu",
    }


def peer_command(cfg: LeoConfig, peer: Peer, out_dir: Path, epochs: int) -> list[str]:
    """The command line of one peer run (before `--threads`): PyG's through this module and
    the resolved config, a script's with the graph file and its spec."""
    if peer.script is None:
        config_path = out_dir / "peer_config.yaml"
        return [sys.executable, "-m", "leo_cli.bench.peers", str(config_path), peer.name,
                str(epochs)]  # fmt: skip
    graph, spec = out_dir / GRAPH_FILE, spec_path(out_dir, peer)
    return [peer_python(cfg), str(script_path(peer)), str(graph), str(spec), str(epochs)]


class PygPeer(nn.Module):
    """A peer's model: PyG's layers for one convolution (`Conv.pyg_peer`), called on the
    features and the adjacency (`adjacency`).

    Attributes:
        normalises_once: the layers compute their normalisation on the first call and keep it
            (GCNConv's `cached=True`): one forward pass belongs to the set-up.
    """

    normalises_once: ClassVar[bool] = False


class PygGCN(PygPeer):
    """`num_layers` GCNConv layers, ReLU and dropout between them, as in PyG's GCN example."""

    normalises_once = True

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


class PygGAT(PygPeer):
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


# The model of each PyG layer a convolution compares with (registry: `Conv.pyg_peer`).
PEER_MODELS: dict[str, Callable[[ModelConfig, int, int], PygPeer]] = {
    "GCNConv": PygGCN,
    "GATConv": PygGAT,
}


def adjacency(
    edge_index_2E: np.ndarray, num_nodes: int, peer: Peer, dtype: torch.dtype = torch.float32
) -> Any:
    """What `peer`'s layers aggregate over (`Peer.adjacency`): `edge_index`, or a sparse CSR
    adjacency (adj_t, values of `dtype`)."""
    edge_index = torch.from_numpy(np.ascontiguousarray(edge_index_2E, dtype=np.int64))
    if peer.adjacency == "edge_index":
        return edge_index
    from torch_geometric.utils import to_torch_csr_tensor

    # GCNConv aggregates over adj_t (row = target); the graph is symmetric, so adj_t = adj.
    ones = torch.ones(edge_index.shape[1], dtype=dtype)
    return to_torch_csr_tensor(edge_index, ones, size=(num_nodes, num_nodes))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_peer(cfg: LeoConfig, peer: Peer, num_epochs: int) -> dict[str, Any]:
    """Train `num_epochs` full-graph epochs; per-epoch step seconds, final test accuracy,
    set-up and wall seconds."""
    started = process_start_time()
    device = torch.device("cuda" if uses_cuda(cfg.launch) else "cpu")
    torch.manual_seed(cfg.run.seed)
    g = load_dataset(cfg.data, cfg.run.seed)
    x = torch.from_numpy(g.x_NF).to(device)
    y = torch.from_numpy(g.y_N).to(device)
    train = torch.from_numpy(g.train_mask_N).to(device)
    adj = adjacency(g.edge_index_2E, g.num_nodes, peer).to(device)
    trim_heap()  # as LEO's workers do once their CSR is built (worker/assemble.py)
    layer = conv_of(cfg.model.name).peer_layer(peer.framework)
    assert layer is not None, "leo bench runs peers only for models that have one"
    model = PEER_MODELS[layer](cfg.model, g.num_features, g.num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    if model.normalises_once:
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
    parser.add_argument("system", choices=IN_PROCESS)
    parser.add_argument("epochs", type=int, help="epochs to train (warm-up included)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args(argv)
    fix_mmap_threshold()  # the workers' allocator settings (worker/memory.py)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result = train_peer(load_config(args.config), peer_of(args.system), args.epochs)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
