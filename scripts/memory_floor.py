"""The memory floor of one worker's GCN epoch on the bench graph: the least memory traffic a
full-graph epoch must make, timed as plain reads, writes and row gathers on this machine.

Usage: python scripts/memory_floor.py [--config leo_cli/bench/default.yaml] [--repeats 5]

The graph is the config's synthetic graph (`data.synthetic`, `run.seed`); the model a GCN of
`model.num_layers` = 2 (F -> H -> C, float32, PyG's order: the weight before the
aggregation), no static aggregate, dropout between the layers. Each tensor the epoch must
touch is counted once per use that cannot be fused away:

- forward: X read (X W0), X W0 written; its aggregation reads the CSR (row pointers and
  column indices, int32; the normalisation as two N-vectors, no per-edge values) and gathers
  a row of X W0 per edge, writes Z0; the bias, ReLU and dropout read Z0, write H and a
  one-bit mask; H W1 reads H, writes N x C; its aggregation as above at width C; the loss
  reads the logits and writes their gradient;
- backward: the width-C aggregation again (transposed: same CSR, the graph is symmetric);
  grad W1 and grad Z0 in one pass over H, the mask and the width-C gradient, writing grad
  Z0; the width-H aggregation of it; grad W0 reads X and grad (X W0). Adam's few parameters
  are left out.

Two floors are printed: `streaming`, every gathered operand read once (rows reused from
cache), and `dram-gather`, where every width-H row gathered by the two width-H aggregations
is read from memory in the graph's own column order (the width-C table, N x C x 4 bytes,
counted as cached). The streamed bytes are timed as a sum over a float32 buffer of the
bytes read and a fill of one of the bytes written; the gathers as `index_select` of the
graph's column indices from an N x H table into a small reused buffer. Medians of
`--repeats`, on torch's default thread count.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from leo_cli.config import load_config
from leo_cli.graph.datasets.synthetic import generate

F32 = 4
I32 = 4
CHUNK_ROWS = 4096  # gathered rows per index_select: the output stays in L2


def gathered_rows(edge_index_2E: np.ndarray) -> torch.Tensor:
    """The rows an aggregation gathers, in the order it gathers them: the CSR's column indices
    (the sources: edges are sorted by target, then source; the targets, sorted, would read
    the table row by row)."""
    return torch.from_numpy(np.ascontiguousarray(edge_index_2E[0]).astype(np.int64))


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_time(read: int, written: int, repeats: int) -> float:
    """Median seconds to read `read` bytes (a sum) and write `written` bytes (a fill)."""
    reads = torch.ones(read // F32)
    writes = torch.empty(written // F32)
    return timed(lambda: (reads.sum(), writes.fill_(1.0)), repeats)


def traffic(n: int, e: int, f: int, h: int, c: int) -> dict[str, int]:
    """Bytes read and written by the epoch outside the gathers, and the gathered bytes of
    the width-H and width-C aggregations (per use, as from memory)."""
    csr = (n + 1) * I32 + e * I32 + 2 * n * F32  # row pointers, columns, the two scalings
    nh, nc = n * h * F32, n * c * F32
    mask = n * h // 8
    read = (
        2 * n * f * F32  # X, forward and grad W0
        + 4 * csr  # four aggregations
        + nh  # Z0 for bias/ReLU/dropout
        + nh  # H for H W1
        + nc  # logits for the loss
        + nh + mask + nc  # backward: H, the mask, grad of H W1
        + nh  # grad (X W0) for grad W0
    )  # fmt: skip
    written = (
        nh  # X W0
        + nh  # Z0
        + nh + mask  # H and the mask
        + nc + nc  # H W1, logits
        + nc  # loss gradient
        + nc  # grad (H W1)
        + nh  # grad Z0
        + nh  # grad (X W0)
    )  # fmt: skip
    return {
        "read": read,
        "written": written,
        "gathered_h_cached": 2 * nh,  # the two width-H tables, once each
        "gathered_c_cached": 2 * nc,
        "gathered_h_dram": 2 * e * h * F32,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="leo_cli/bench/default.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(Path(args.config))
    if cfg.model.name != "gcn" or cfg.model.num_layers != 2:
        raise SystemExit(
            f"{args.config}: the floor is counted for a 2-layer GCN (model.name=gcn, "
            f"model.num_layers=2), not {cfg.model.name} of {cfg.model.num_layers}"
        )
    graph = generate(cfg.data.synthetic, cfg.run.seed)
    n, e = graph.num_nodes, int(graph.edge_index_2E.shape[1])
    f, h, c = graph.x_NF.shape[1], cfg.model.hidden_channels, graph.num_classes
    cols = gathered_rows(graph.edge_index_2E)
    del graph
    bytes_ = traffic(n, e, f, h, c)
    streamed = bytes_["read"] + bytes_["written"]
    streamed += bytes_["gathered_h_cached"] + bytes_["gathered_c_cached"]

    read = bytes_["read"] + bytes_["gathered_h_cached"] + bytes_["gathered_c_cached"]
    stream_s = stream_time(read, bytes_["written"], args.repeats)
    table = torch.randn(n, h)
    out = torch.empty(CHUNK_ROWS, h)
    chunks = list(cols.split(CHUNK_ROWS))

    def gather() -> None:
        for idx in chunks:
            torch.index_select(table, 0, idx, out=out[: idx.numel()])

    gather_s = 2 * timed(gather, args.repeats)  # two width-H aggregations
    # the dram-gather floor: the cached width-H gathers replaced by the real ones
    cached_h_s = stream_s * bytes_["gathered_h_cached"] / streamed
    dram_s = stream_s - cached_h_s + gather_s
    threads = torch.get_num_threads()
    gathered = bytes_["gathered_h_dram"]
    print(f"graph: {n} nodes, {e} edges, F={f} H={h} C={c}; torch threads {threads}")
    print(f"streamed: {streamed / 1e9:.3f} GB in {stream_s * 1e3:.1f} ms", end=" ")
    print(f"({streamed / stream_s / 1e9:.1f} GB/s)")
    print(f"gathered width-{h} rows: {gathered / 1e9:.3f} GB in {gather_s * 1e3:.1f} ms", end=" ")
    print(f"({gathered / gather_s / 1e9:.1f} GB/s)")
    print(f"floor streaming: {stream_s * 1e3:.1f} ms")
    print(f"floor dram-gather: {dram_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
