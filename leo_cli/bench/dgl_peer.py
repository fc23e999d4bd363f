"""The DGL peer of `leo bench`: DGL's GraphConv, SAGEConv, GINConv or GATConv, full-graph, on
the graph LEO writes to a file, with LEO's widths, dropout and optimizer.

A script, not a module of LEO: it imports only the standard library, torch, numpy and DGL, so
it runs under another interpreter (`bench.peer_python`: a user's DGL environment) as
`python dgl_peer.py GRAPH.npz SPEC.json EPOCHS --threads N`. It prints the JSON line the PyG
peers print (per-epoch step seconds, final test accuracy, set-up, wall time, peak memory).
`--check` prints DGL's version, or one sentence and exit code 3 where DGL does not import.

The models follow DGL's examples: self-loops added for GraphConv (norm `both`) and GATConv,
ReLU between layers (ELU for GAT, hidden heads concatenated, output heads averaged), Adam;
dropout on every layer's input as LEO and the PyG peers apply it (the first layer's rate is
`input_dropout`). DGL imports `dgl.graphbolt` (its sampling data loader) on `import dgl`,
which needs a library built for the same torch; full-graph training never uses it, so where
it fails to load, DGL is imported again without it.
Legend: N nodes, F features, C classes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

NOT_IMPORTABLE = 3  # exit code of --check (and of a run) where DGL does not import


def import_dgl() -> Any:
    """`dgl`, imported without `dgl.graphbolt` where that part fails to load.

    Raises:
        ImportError: DGL is not installed, or fails to import for another reason.
    """
    try:
        import dgl
    except (ImportError, OSError) as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        if not any("graphbolt" in f.filename for f in frames):
            raise ImportError(str(exc)) from None
        for name in [n for n in sys.modules if n == "dgl" or n.startswith("dgl.")]:
            del sys.modules[name]
        sys.modules["dgl.graphbolt"] = types.ModuleType("dgl.graphbolt")
        import dgl
    return dgl


def start_time() -> float:
    """When this process started (wall clock, from /proc), so imports count; now elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def peak_rss_bytes() -> int:
    """Peak resident set of this process (Linux's VmHWM; 0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def make_layer(dglnn: Any, spec: dict[str, Any], width: int, out: int, last: bool) -> nn.Module:
    """One DGL layer of `spec["layer"]` from `width` to `out` channels (GAT: per head)."""
    layer = spec["layer"]
    if layer == "GraphConv":
        return dglnn.GraphConv(width, out, norm="both")  # type: ignore[no-any-return]
    if layer == "SAGEConv":
        return dglnn.SAGEConv(width, out, "mean")  # type: ignore[no-any-return]
    if layer == "GINConv":
        mlp = nn.Sequential(nn.Linear(width, out), nn.ReLU(), nn.Linear(out, out))
        return dglnn.GINConv(mlp, "sum", learn_eps=True)  # type: ignore[no-any-return]
    if layer == "GATConv":
        heads = spec["output_heads"] if last else spec["heads"]
        return dglnn.GATConv(  # type: ignore[no-any-return]
            width, out, num_heads=heads, attn_drop=spec["attention_dropout"]
        )
    raise ValueError(f"no DGL layer {layer!r}")


class DglNet(nn.Module):
    """`num_layers` DGL layers with dropout on every layer's input and ReLU (GAT: ELU)
    between them."""

    def __init__(self, dglnn: Any, spec: dict[str, Any], in_channels: int, out_channels: int):
        super().__init__()
        self.attention = spec["attention"]  # heads: [N, heads, C] out of every layer
        hidden, num = spec["hidden_channels"], spec["num_layers"]
        convs, width = [], in_channels
        for i in range(num):
            last = i == num - 1
            convs.append(make_layer(dglnn, spec, width, out_channels if last else hidden, last))
            width = hidden * (spec["heads"] if self.attention else 1)
        self.convs = nn.ModuleList(convs)
        self.dropout, self.input_dropout = spec["dropout"], spec["input_dropout"]

    def forward(self, g: Any, x_NF: Tensor) -> Tensor:
        h = x_NF
        for layer, conv in enumerate(self.convs):
            last = layer == len(self.convs) - 1
            p = self.input_dropout if layer == 0 else self.dropout
            h = conv(g, F.dropout(h, p=p, training=self.training))
            if self.attention:  # [N, heads, C]: concatenated, the output's averaged
                h = h.mean(dim=1) if last else h.flatten(1)
            if not last:
                h = F.elu(h) if self.attention else h.relu()
        return h


def load_graph(dgl: Any, path: Path, spec: dict[str, Any], device: torch.device) -> Any:
    """The graph file as a DGL graph (self-loops where the layer normalises with them) and
    its node data: x, y, train and test masks."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    src, dst = (torch.from_numpy(a.astype(np.int64)) for a in arrays["edge_index_2E"])
    g = dgl.graph((src, dst), num_nodes=int(arrays["y_N"].shape[0]))
    if spec["layer"] in ("GraphConv", "GATConv"):
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    g = g.to(device)
    g.create_formats_()  # the sparse formats DGL's kernels use, made before the first step
    tensors = {k: torch.from_numpy(arrays[k]).to(device) for k in arrays if k != "edge_index_2E"}
    return g, tensors


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(graph: Path, spec: dict[str, Any], num_epochs: int) -> dict[str, Any]:
    """Train `num_epochs` full-graph epochs; what the PyG peers report."""
    started = start_time()
    dgl = import_dgl()
    from dgl import nn as dglnn

    device = torch.device(spec["device"])
    torch.manual_seed(spec["seed"])
    g, t = load_graph(dgl, graph, spec, device)
    x, y, train_mask, test_mask = t["x_NF"], t["y_N"].long(), t["train_mask_N"], t["test_mask_N"]
    num_classes = int(y.max()) + 1
    model = DglNet(dglnn, spec, x.shape[1], num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    sync(device)
    setup_s = time.time() - started
    times = []
    for _ in range(num_epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(g, x)[train_mask], y[train_mask])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        pred = model(g, x).argmax(dim=1)
    correct = (pred[test_mask] == y[test_mask]).float()
    return {
        "epoch_times": times,
        "test_acc": float(correct.mean()) if bool(test_mask.any()) else None,
        "final_loss": float(loss.detach()),
        "setup_s": setup_s,
        "run_setup_s": setup_s,  # a peer reuses nothing
        "wall_s": time.time() - started,
        "peak_rss_bytes": [peak_rss_bytes()],
        "peak_rss_total_bytes": peak_rss_bytes(),
        "framework_version": str(dgl.__version__),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dgl_peer.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("graph", type=Path, nargs="?", help="graph file (.npz) LEO wrote")
    parser.add_argument("spec", type=Path, nargs="?", help="model and optimizer (.json)")
    parser.add_argument("epochs", type=int, nargs="?", help="epochs (warm-up included)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--check", action="store_true", help="only say whether DGL imports")
    args = parser.parse_args(argv)
    try:
        dgl = import_dgl()
    except ImportError as exc:
        print(f"DGL does not import under {sys.executable} ({exc}).")
        return NOT_IMPORTABLE
    if args.check:
        print(json.dumps({"dgl": str(dgl.__version__)}))
        return 0
    if args.graph is None or args.spec is None or args.epochs is None:
        parser.error("GRAPH, SPEC and EPOCHS are needed (or --check)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    spec = json.loads(args.spec.read_text())
    print(json.dumps(train(args.graph, spec, args.epochs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
