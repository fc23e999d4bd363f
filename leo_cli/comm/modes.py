"""Choosing the aggregator of a `pipeline.mode` (only modes that exist; no silent fallback)."""

from __future__ import annotations

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import (
    Aggregator,
    BlockingAggregator,
    ComputeOnlyAggregator,
    LocalAggregator,
    PerLayerAggregator,
)
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.pipeline import PipelinedAggregator
from leo_cli.comm.shm import SharedMemoryAggregator
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


def make_aggregator(
    mode: str,
    adj: kernels.CSR,
    plan: HaloPlan,
    world_size: int,
    *,
    num_chunks: list[int],
    width: int,
    halo_local_H: Tensor,
    attention: bool = False,
    layers: slice = slice(None),
) -> Aggregator:
    """The aggregator of `mode` for one worker.

    Args:
        mode: `pipeline.mode` (or `compute-only`, for benchmarks).
        adj: local CSR, inner rows and `[inner | halo]` columns.
        plan: halo plan of this worker.
        world_size: number of workers (1 means no halo and no communication).
        num_chunks: chunks per peer of every layer, for the pipelined mode.
        width: the widest rows any layer exchanges (sizes shared segments).
        halo_local_H: owner-local row of every halo node (shared-memory mode).
        attention: the model builds attention views from `columns` (the pipelined mode
            then keeps the whole CSR beside its column blocks).
        layers: the layers it serves, a slice of `num_chunks` (the pipelined mode builds
            the schedules of their chunk counts only).
    """
    if world_size == 1:
        return LocalAggregator(adj)
    if mode == "blocking":
        return BlockingAggregator(adj, plan)
    if mode == "leo":
        return PipelinedAggregator(adj, plan, num_chunks, attention=attention, layers=layers)
    if mode == "fine-grained":
        return BlockingAggregator(*fine_grained_view(adj, plan))
    if mode == "shared-memory":
        return SharedMemoryAggregator(adj, plan, halo_local_H, width)
    if mode == "compute-only":
        return ComputeOnlyAggregator(adj, plan)
    raise ValueError(f"unknown pipeline mode {mode!r}")


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
    (the pipelined ones sharing their inner column block).

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
    if isinstance(rest, PipelinedAggregator):
        first: Aggregator = PipelinedAggregator(
            *layer0, num_chunks, inner=rest.inner, attention=attention, layers=slice(0, 1)
        )
    else:
        kwargs["layers"] = slice(0, 1)
        first = make_aggregator(mode, *layer0, world_size, **kwargs)  # type: ignore[arg-type]
    return PerLayerAggregator(first, rest)
