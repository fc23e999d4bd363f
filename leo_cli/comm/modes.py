"""The aggregator of a pipeline mode, built from its registry record (leo_cli/registry.py).

Every mode aggregates through the same column blocks (comm/aggregate.py); a record says which
transport moves its rows (`TRANSPORTS`, keyed by the record's `transport`), whether it cuts
transfers into chunks, splits the update boundary-first, or lays its halo out one row per
remote edge. Nothing here compares mode names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import Aggregator, BlockAggregator, PerLayerAggregator, Rounding
from leo_cli.comm.blocks import ColumnBlock
from leo_cli.comm.exchange import CommStats, HaloPlan
from leo_cli.comm.inplace import InPlace
from leo_cli.comm.shm import SharedMemory
from leo_cli.comm.transport import AllToAll, NoTransfer, PointToPoint, Transport
from leo_cli.registry import Mode

# `auto` chunking: one chunk per this many bytes of a peer's rows at the widest layer...
AUTO_CHUNK_BYTES = 4 << 20
# ... and never more than this many chunks per peer (each chunk is one message per peer).
AUTO_MAX_CHUNKS = 4


def auto_chunk_count(largest_bytes: int) -> int:
    """`pipeline.num_chunks=auto` without a plan: chunks of about 4 MiB per peer, 1 to 4.

    Small halos go in one message (a message costs a fixed latency); large ones in a few
    chunks so that aggregation can start on the first while the rest is in flight.
    """
    return max(1, min(AUTO_MAX_CHUNKS, -(-largest_bytes // AUTO_CHUNK_BYTES)))


def auto_chunks(plan: HaloPlan, row_bytes: int) -> int:
    """`auto_chunk_count` of this worker's largest peer transfer, rows of `row_bytes`."""
    return auto_chunk_count(max([*plan.send_counts, *plan.recv_counts, 0]) * row_bytes)


@dataclass(frozen=True)
class Wiring:
    """What a transport may need besides the halo plan."""

    stats: CommStats  # shared by every aggregator of the worker
    halo_local_H: Tensor  # owner-local row of every halo row (shared memory)
    width: int  # the widest row any layer moves (sizes shared segments)
    dtype: torch.dtype  # of gradients, and of rows unless they are rounded
    rounding: Rounding | None = None  # how rows are rounded and travel (pipeline.halo_dtype)
    # (r, c) with Aᵀ = diag(r)·A·diag(c) (the mean), where gradients are read as rows
    grad_scales: tuple[Tensor, Tensor] | None = None


def _shared_memory(plan: HaloPlan, w: Wiring, partial_grads: bool) -> Transport:
    grads = w.dtype if partial_grads else None  # else no gradients' segment
    if w.rounding is None:
        return SharedMemory(plan, w.stats, w.halo_local_H, w.width, (w.dtype, grads))
    codec = w.rounding.codec  # rows travel packed (int8: with their scale), wider than F
    width = max(codec.wire_width(w.width), w.width)
    return SharedMemory(plan, w.stats, w.halo_local_H, width, (codec.wire_dtype, grads))


# How each transport of the registry (`Mode.transport`) is made; the flag: halo gradients
# return as partial sums (`send_grads`), not only rows.
TRANSPORTS: dict[str, Callable[[HaloPlan, Wiring, bool], Transport]] = {
    "point-to-point": lambda plan, w, _: PointToPoint(plan, w.stats),
    "all-to-all": lambda plan, w, _: AllToAll(plan, w.stats),
    "segment": _shared_memory,
    "none": lambda plan, w, _: NoTransfer(plan, w.stats),
}


def no_halo_plan(num_inner: int, device: torch.device) -> HaloPlan:
    """The plan of a worker that owns every node: nothing to send or receive."""
    return HaloPlan(num_inner, torch.zeros(0, dtype=torch.int64, device=device), [0], [0])


def make_aggregator(
    mode: Mode,
    adj: kernels.CSR,
    plan: HaloPlan | None,
    wiring: Wiring,
    num_chunks: list[int],
    *,
    attention: bool = False,
    layers: slice = slice(None),
    inner: ColumnBlock | None = None,
    in_place: InPlace | None = None,
) -> BlockAggregator:
    """The aggregator of `mode` for one worker.

    Args:
        mode: the registry record of `pipeline.mode`.
        adj: local CSR, inner rows and `[inner | halo]` columns.
        plan: halo plan of this worker; None for a single worker (no halo, nothing moves).
        wiring: the statistics, widths and rows its transport may need.
        num_chunks: chunks per peer of every layer, for modes that chunk.
        attention: the model builds attention views from `columns` (the aggregator then
            keeps the whole CSR beside its column blocks).
        layers: the layers it serves, a slice of `num_chunks` (schedules are built for their
            chunk counts only).
        inner: an inner column block to share with another view of the same part.
        in_place: the rows read in place from same-host owners (comm/inplace.py).
    """
    if plan is None:
        assert adj.num_cols == adj.num_rows, "a single-worker graph has no halo columns"
        alone = no_halo_plan(adj.num_rows, adj.device)
        transport: Transport = NoTransfer(alone, wiring.stats)
        return BlockAggregator(
            adj, alone, transport, [1], inner=inner, attention=attention, layers=layers,
            rounding=wiring.rounding, grad_rows=wiring.rounding is not None,  # nothing moves
            grad_scales=wiring.grad_scales,
        )  # fmt: skip
    # Rounded rows read gradients as rows; so do rows read in place (unless replicas ask for
    # partial sums: comm/inplace.py) and a transport that moves them so, but for attention
    # layers (they gather `[h | halo]`).
    grad_rows = wiring.rounding is not None or (
        not attention
        and (mode.wire.gradients_as_rows if in_place is None else in_place.grads_as_rows)
    )
    transport = TRANSPORTS[mode.transport](plan, wiring, attention or not grad_rows)
    chunks = num_chunks if mode.chunks else [1]
    return BlockAggregator(
        adj,
        plan,
        transport,
        chunks,
        overlap=mode.overlap,
        inner=inner,
        attention=attention,
        layers=layers,
        in_place=in_place,
        rounding=wiring.rounding,
        grad_rows=grad_rows,
        grad_scales=wiring.grad_scales,
    )


def make_layer_aggregators(
    mode: Mode,
    layer0: tuple[kernels.CSR, HaloPlan | None],
    others: tuple[kernels.CSR, HaloPlan | None],
    wiring: Wiring,
    num_chunks: list[int],
    *,
    attention: bool = False,
    static_layer0: bool = False,
    in_place: InPlace | None = None,
) -> Aggregator:
    """One aggregator, or one for layer 0 (replicas left out of its halo) and one for the rest
    (sharing their inner column block and statistics).

    `static_layer0`: layer 0 never aggregates (its static aggregate stands in), so nothing is
    built for its chunk count unless a deeper layer uses it too. `in_place`: rows read in
    place at every layer (both aggregators share it).
    """
    # One view (the same CSR and plan): a shared CSR alone is not enough, as peers send each
    # view's rows by its own plan.
    same_view = layer0[0] is others[0] and layer0[1] is others[1]
    alone = same_view or others[1] is None or not mode.cache_levels
    layers = slice(1, None) if static_layer0 or not alone else slice(None)
    rest = make_aggregator(
        mode, *others, wiring, num_chunks, attention=attention, layers=layers, in_place=in_place
    )
    if alone:
        return rest
    first = make_aggregator(
        mode, *layer0, wiring, num_chunks, attention=attention, layers=slice(0, 1),
        inner=rest.inner, in_place=in_place,  # views differ in their halo columns only
    )  # fmt: skip
    return PerLayerAggregator(first, rest)
