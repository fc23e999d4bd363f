"""Choosing the aggregator of a `pipeline.mode` (only modes that exist; no silent fallback).

Every mode aggregates through the same column blocks (comm/aggregate.py); a mode is its
transport, its chunking and whether the update is split boundary-first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import Aggregator, BlockAggregator, PerLayerAggregator
from leo_cli.comm.blocks import ColumnBlock
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.shm import SharedMemory
from leo_cli.comm.transport import AllToAll, NoTransfer, PointToPoint, Transport
from leo_cli.comm.views import fine_grained_view

# `auto` chunking: one chunk per this many bytes of a peer's rows at the widest layer...
AUTO_CHUNK_BYTES = 4 << 20
# ... and never more than this many chunks per peer (each chunk is one message per peer).
AUTO_MAX_CHUNKS = 4


def auto_chunks(plan: HaloPlan, width: int, dtype: torch.dtype) -> int:
    """`pipeline.num_chunks=auto`: chunks of about 4 MiB per peer, 1 to 4 of them.

    Small halos go in one message (a message costs a fixed latency); large ones in a few
    chunks so that aggregation can start on the first while the rest is in flight.
    """
    row_bytes = width * torch.empty(0, dtype=dtype).element_size()
    largest = max([*plan.send_counts, *plan.recv_counts, 0]) * row_bytes
    return max(1, min(AUTO_MAX_CHUNKS, -(-largest // AUTO_CHUNK_BYTES)))


def no_halo_plan(num_inner: int, device: torch.device) -> HaloPlan:
    """The plan of a worker that owns every node: nothing to send or receive."""
    return HaloPlan(num_inner, torch.zeros(0, dtype=torch.int64, device=device), [0], [0])


def make_aggregator(
    mode: str,
    adj: kernels.CSR,
    plan: HaloPlan | None,
    world_size: int,
    *,
    num_chunks: list[int],
    width: int,
    halo_local_H: Tensor,
    attention: bool = False,
    layers: slice = slice(None),
    inner: ColumnBlock | None = None,
) -> Aggregator:
    """The aggregator of `mode` for one worker.

    Args:
        mode: `pipeline.mode` (or `compute-only`, for benchmarks).
        adj: local CSR, inner rows and `[inner | halo]` columns.
        plan: halo plan of this worker (None: a single worker).
        world_size: number of workers (1 means no halo and no communication).
        num_chunks: chunks per peer of every layer, for the pipelined mode.
        width: the widest rows any layer exchanges (sizes shared segments).
        halo_local_H: owner-local row of every halo node (shared-memory mode).
        attention: the model builds attention views from `columns` (the aggregator then
            keeps the whole CSR beside its column blocks).
        layers: the layers it serves, a slice of `num_chunks` (the pipelined mode builds
            the schedules of their chunk counts only).
        inner: an inner column block to share with another view of the same part.
    """
    kwargs = {"inner": inner, "attention": attention, "layers": layers}
    if world_size == 1 or plan is None:
        assert adj.num_cols == adj.num_rows, "a single-worker graph has no halo columns"
        alone = plan or no_halo_plan(adj.num_rows, adj.device)
        return BlockAggregator(adj, alone, NoTransfer(alone), [1], **kwargs)  # type: ignore[arg-type]
    if mode == "fine-grained":
        adj, plan = fine_grained_view(adj, plan)  # its inner columns are the part's
    transport: Transport
    if mode == "leo":
        transport = PointToPoint(plan)
    elif mode in ("blocking", "fine-grained"):
        transport, num_chunks = AllToAll(plan), [1]
    elif mode == "shared-memory":
        transport, num_chunks = SharedMemory(plan, halo_local_H, width, adj.values.dtype), [1]
    elif mode == "compute-only":
        transport, num_chunks = NoTransfer(plan), [1]
    else:
        raise ValueError(f"unknown pipeline mode {mode!r}")
    overlap = mode == "leo"
    return BlockAggregator(adj, plan, transport, num_chunks, overlap=overlap, **kwargs)  # type: ignore[arg-type]


def make_layer_aggregators(
    mode: str,
    layer0: tuple[kernels.CSR, HaloPlan],
    others: tuple[kernels.CSR, HaloPlan],
    world_size: int,
    *,
    num_chunks: list[int],
    width: int,
    halo_local_H: Tensor,
    attention: bool = False,
    static_layer0: bool = False,
) -> Aggregator:
    """One aggregator, or one for layer 0 (replicas left out of its halo) and one for the rest
    (sharing their inner column block).

    `static_layer0`: layer 0 never aggregates (its static aggregate stands in), so nothing is
    built for its chunk count unless a deeper layer uses it too.
    """
    kwargs = {
        "num_chunks": num_chunks,
        "width": width,
        "halo_local_H": halo_local_H,
        "attention": attention,
    }
    same = layer0[0] is others[0]
    alone = same or world_size == 1 or mode in ("shared-memory", "compute-only")
    kwargs["layers"] = slice(1, None) if static_layer0 or not alone else slice(None)
    rest = make_aggregator(mode, *others, world_size, **kwargs)  # type: ignore[arg-type]
    if alone:
        return rest
    kwargs["layers"] = slice(0, 1)
    if isinstance(rest, BlockAggregator):
        kwargs["inner"] = rest.inner  # views differ in their halo columns only
    first = make_aggregator(mode, *layer0, world_size, **kwargs)  # type: ignore[arg-type]
    return PerLayerAggregator(first, rest)
