"""One computation for a layer's aggregation; the pipeline mode only chooses how rows move.

An aggregator owns both the communication and the SpMM of a layer: the inner column block of
the CSR, then one block per peer and chunk (comm/blocks.py), halo gradients added into their
owners' rows (or the output gradient read as rows, below). The transport (comm/transport.py)
moves the rows, and `overlap` splits the update so rows leave early. Attention layers get the
rows `[h | halo(h)]` instead. Where rows are rounded to `pipeline.halo_dtype`
(comm/rounding.py), the transport moves gradients as rows (the shared segment), or rows are
read in place (comm/inplace.py), the backward reads its output gradient as rows too
(`backward_rows`).

Specification: docs/design/aggregation.md, docs/design/rounding.md.
Legend: N inner rows, B boundary rows, H halo rows, F in-width, O out-width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock, Schedule, build_schedule, column_block
from leo_cli.comm.exchange import CommStats, HaloPlan, distinct_rows
from leo_cli.comm.inplace import InPlace
from leo_cli.comm.rounding import RowCodec, backward_key
from leo_cli.comm.transport import Pending, Transport


@dataclass(frozen=True)
class Rounding:
    """How a worker rounds the rows its aggregations read (`pipeline.halo_dtype`).

    Attributes:
        codec: the rounding and wire form (comm/rounding.py).
        ids_N: global id of every inner row (int8's random bits are keyed by it).
    """

    codec: RowCodec
    ids_N: Tensor


class Aggregator(Protocol):
    """`A·[h | halo(h)]` for the rows of one worker, with gradients flowing back to owners."""

    stats: CommStats

    def aggregate(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        """Σ_j a_ij h_j over in-edges, halo rows included; h is this worker's inner rows.
        `key`: the layer's rounding key (int8 rows; None rounds to nearest)."""
        ...

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """(A·[h | halo(h)], h) with h = x·Wᵀ (update-first layers)."""
        ...

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        """The CSR whose columns `gather` returns rows for, and the plan filling its halo."""
        ...

    def gather(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        """`[h | halo(h)]` in the column order of `columns(layer)`, differentiably."""
        ...

    def transform_gather(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> Tensor:
        """`gather(x·Wᵀ)`: the mode may overlap the GEMM with the exchange."""
        ...


# The boundary-first split gathers the boundary rows' inputs and places both parts' rows
# of h: on a CPU about one more GEMM's time, to hide at most the interior's GEMM. Below this
# share of interior rows (a part whose rows nearly all have readers) the update runs whole.
SPLIT_MIN_INTERIOR = 0.25


def splits_update(num_inner: int, num_boundary: int) -> bool:
    """Whether a pipelined mode splits its update boundary-first (`update_and_send`): where
    it has boundary rows to send first and at least `SPLIT_MIN_INTERIOR` of the inner rows
    are interior (no peer reads them)."""
    interior = num_inner - num_boundary
    return num_boundary > 0 and interior >= max(1.0, SPLIT_MIN_INTERIOR * num_inner)


class BlockAggregator:
    """The aggregation of every mode: column blocks, a transport, optionally boundary-first."""

    def __init__(
        self,
        adj: kernels.CSR,
        plan: HaloPlan,
        transport: Transport,
        num_chunks: list[int],
        *,
        overlap: bool = False,
        inner: ColumnBlock | None = None,
        attention: bool = False,
        layers: slice = slice(None),
        in_place: InPlace | None = None,
        rounding: Rounding | None = None,
        grad_rows: bool = False,
        grad_scales: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """Args:
        adj: local CSR (inner rows, `[inner | halo]` columns) of the exchanged halo.
        plan: its halo plan.
        transport: how the chunks' rows move (comm/transport.py).
        num_chunks: chunks per peer of every layer (the last one serves deeper layers).
        overlap: split the update boundary-first so rows leave before the interior GEMM,
            where the interior is large enough to hide anything (`splits_update`).
        inner: the inner column block of another view of the same part, to share: views
            re-lay out halo columns only, so every view's inner block is the same (and it
            holds most of the edges).
        attention: keep adj for `columns` (attention layers build their edge views from it);
            otherwise it is dropped once the blocks are built, which hold every edge again.
        layers: the layers it serves, as a slice of `num_chunks` (`slice(1, None)`: layer 1
            and deeper): schedules, each holding every halo edge again, are built for their
            chunk counts only.
        in_place: the L3 rows this worker reads in place and the rows it publishes for its
            peers to read so (comm/inplace.py); their edges are not in `adj`.
        rounding: how every row the aggregation reads is rounded, inner rows included,
            and travels (`pipeline.halo_dtype`); None: as computed.
        grad_rows: the backward reads the output gradient as rows (`backward_rows`), as
            it must where rows are rounded or read in place (comm/modes.py decides);
            otherwise halo gradients return as partial sums.
        grad_scales: (r, c) of every inner row where `Aᵀ = diag(r)·A·diag(c)` needs them
            (the mean), or None (r = c = 1); read by `backward_rows` only.
        """
        self.plan, self.transport, self.stats = plan, transport, transport.stats
        self.num_chunks, self.in_place = num_chunks, in_place
        self.rounding, self.grad_scales, self.grad_rows = rounding, grad_scales, grad_rows
        assert rounding is None or grad_rows, "rounded rows read their gradient as rows"
        assert in_place is None or self.grad_rows == in_place.grads_as_rows, "in-place grads"
        assert in_place is None or not attention, "attention layers gather rows, not in place"
        assert in_place is None or rounding is None, "published rows are not rounded"
        sent = (
            plan.send_idx_S
            if in_place is None
            else torch.cat([plan.send_idx_S, in_place.boundary_B])
        )
        self.boundary_B = distinct_rows(sent, plan.num_inner)  # sorted: computed (and sent) first
        if in_place is not None:  # where the published rows sit among them
            self.published_P = torch.searchsorted(self.boundary_B, in_place.boundary_B)
        self.overlap = overlap and splits_update(plan.num_inner, self.boundary_B.shape[0])
        if self.overlap:
            interior = torch.ones(plan.num_inner, dtype=torch.bool, device=adj.device)
            interior[self.boundary_B] = False
            self.interior_I = torch.nonzero(interior).squeeze(1)
        transpose = not self.grad_rows  # a backward as rows runs every block forward
        if inner is None:
            inner = column_block(adj, 0, plan.num_inner, compact=False, transpose=transpose)
        assert inner.col_end == plan.num_inner and inner.fwd.num_rows == adj.num_rows
        assert transpose <= (inner.bwd is not None), "a shared inner block without transpose"
        self.inner = inner
        counts = set(num_chunks[layers]) or {num_chunks[-1]}
        self._schedules = {
            k: build_schedule(adj, plan, self.boundary_B, k, transpose) for k in counts
        }
        self.adj = adj if attention else None

    def schedule(self, layer: int) -> Schedule:
        """The chunking of a layer (built at set-up, once per chunk count)."""
        k = self.num_chunks[min(layer, len(self.num_chunks) - 1)]
        assert k in self._schedules, f"layer {layer} is not one this aggregator was built for"
        return self._schedules[k]

    def aggregate(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        out: Tensor = _Aggregate.apply(h_NF, None, self, (layer, key))  # type: ignore[no-untyped-call]
        return out

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> tuple[Tensor, Tensor]:
        out, h_NO = _Aggregate.apply(x_NF, weight_OF, self, (layer, key))  # type: ignore[no-untyped-call]
        return out, h_NO

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        assert self.adj is not None, "attention layers need an aggregator built with attention"
        alone = len(self.plan.send_counts) == 1  # a single worker: no halo to fill
        return self.adj, None if alone else self.plan

    def gather(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        out: Tensor = _Gather.apply(h_NF, None, self, (layer, key))  # type: ignore[no-untyped-call]
        return out

    def transform_gather(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> Tensor:
        out: Tensor = _Gather.apply(x_NF, weight_OF, self, (layer, key))  # type: ignore[no-untyped-call]
        return out

    # -- forward pieces ------------------------------------------------------------------

    def wire(self, h_XF: Tensor, rows_X: Tensor | None, key: int | None) -> Tensor:
        """Rows as they travel: rounded and packed, or as computed. `rows_X`: which inner
        rows they are (None: all of them, in order)."""
        r = self.rounding
        if r is None:
            return h_XF
        return r.codec.encode(h_XF, r.ids_N if rows_X is None else r.ids_N[rows_X], key)

    def arrived(self, rows: Tensor, dtype: torch.dtype) -> Tensor:
        """Rows that travelled, in `dtype`."""
        return rows if self.rounding is None else self.rounding.codec.decode(rows, dtype)

    def update_and_send(
        self, x_NF: Tensor, weight: Tensor | None, sched: Schedule, layer: int, key: int | None
    ) -> tuple[Tensor, Tensor, Pending]:
        """h = x·Wᵀ (or x), the rows the inner block reads (h, rounded where rows are), and
        h's rows on their way (published, sent); boundary rows first with `overlap`."""
        if weight is None or not self.overlap:
            h_NO = x_NF if weight is None else F.linear(x_NF, weight)
            if self.in_place is not None:
                self.in_place.publish(h_NO, layer, self.in_place.boundary_B)
            wire_NW = self.wire(h_NO, None, key)
            pending = self.transport.send_rows(wire_NW, sched, by_position=False)
            return h_NO, self.arrived(wire_NW, h_NO.dtype), pending
        h_BO = F.linear(x_NF.index_select(0, self.boundary_B), weight)
        if self.in_place is not None:
            self.in_place.publish(h_BO, layer, self.published_P)
        wire_BW = self.wire(h_BO, self.boundary_B, key)
        pending = self.transport.send_rows(wire_BW, sched, by_position=True)
        h_IO = F.linear(x_NF.index_select(0, self.interior_I), weight)
        h_NO = x_NF.new_empty((x_NF.shape[0], weight.shape[0]))
        h_NO.index_copy_(0, self.boundary_B, h_BO)
        h_NO.index_copy_(0, self.interior_I, h_IO)
        if self.rounding is None:
            return h_NO, h_NO, pending
        # Rounding is a rule of each row alone: the boundary rows read here are the ones sent
        # (encoded once), the interior rows are rounded on their own.
        read_NO = torch.empty_like(h_NO)
        read_NO.index_copy_(0, self.boundary_B, self.arrived(wire_BW, h_NO.dtype))
        wire_IW = self.wire(h_IO, self.interior_I, key)
        read_NO.index_copy_(0, self.interior_I, self.arrived(wire_IW, h_NO.dtype))
        return h_NO, read_NO, pending

    def aggregate_arrivals(
        self, read_NF: Tensor, pending: Pending, sched: Schedule, layer: int
    ) -> Tensor:
        """Inner block first (with the rows read in place), then every round's chunks as soon
        as the round has landed. `read_NF`: this worker's rows as the aggregation reads them."""
        if self.in_place is None:
            out_NF = self.inner.forward(read_NF)
        else:
            out_NF = self.in_place.aggregate(self.inner, read_NF, layer)
        for r, chunks in enumerate(sched.rounds):
            landed = iter(pending.wait(r))
            for c in chunks:  # one chunk's rows alive at a time where they are made lazily
                halo = next(landed)  # (shared memory): not zip, whose tuple keeps the last
                if c.block.num_edges > 0:
                    c.block.add_into(out_NF, self.arrived(halo, out_NF.dtype))
                del halo
            assert next(landed, None) is None, "more buffers landed than chunks"
        pending.finish()
        return out_NF

    def collect_arrivals(self, read_NF: Tensor, pending: Pending, sched: Schedule) -> Tensor:
        """`[h | halo]`, every round's chunks copied into place once the round has landed."""
        n = read_NF.shape[0]
        full = read_NF.new_empty((n + sched.num_halo, read_NF.shape[1]))
        full[:n] = read_NF
        halo_HF = full[n:]
        for r, chunks in enumerate(sched.rounds):
            for c, rows in zip(chunks, pending.wait(r), strict=True):
                halo_HF[c.recv_start : c.recv_end] = self.arrived(rows, full.dtype)
        pending.finish()
        return full

    # -- backward pieces -----------------------------------------------------------------

    def backward_halo(self, grad_NO: Tensor, sched: Schedule, layer: int) -> Tensor:
        """Gradient of h: the halo-gradient chunks leave for their owners first (and those of
        the rows read in place are published), the inner block's backward runs, the gradients
        of this worker's sent and published rows are added last."""
        pending = self.transport.send_grads(sched, lambda c: c.block.backward(grad_NO), grad_NO)
        if self.in_place is not None:
            self.in_place.publish_grads(grad_NO, layer)
        grad_h = self.add_returned(self.inner.backward(grad_NO), pending, sched)
        if self.in_place is not None:
            self.in_place.add_returned(grad_h, layer)
        return grad_h

    def backward_rows(
        self, grad_NO: Tensor, sched: Schedule, layer: int, key: int | None
    ) -> Tensor:
        """Gradient of h read as rows: `Aᵀ·g = r ⊙ A·[c ⊙ g | halo(c ⊙ g)]` on a symmetric
        graph (docs/design/rounding.md), the rows `c ⊙ g` (rounded where rows are) moved as the
        forward's rows."""
        scales = self.grad_scales
        g_NO = grad_NO if scales is None else grad_NO * scales[1].unsqueeze(1)
        if self.in_place is not None:  # its readers aggregate them as the forward's rows
            self.in_place.publish(g_NO, layer, self.in_place.boundary_B)
        wire_NW = self.wire(g_NO, None, backward_key(key))
        pending = self.transport.send_rows(wire_NW, sched, by_position=False)
        grad_h = self.aggregate_arrivals(self.arrived(wire_NW, g_NO.dtype), pending, sched, layer)
        return grad_h if scales is None else grad_h.mul_(scales[0].unsqueeze(1))

    def return_halo_grads(self, grad_full: Tensor, sched: Schedule) -> Tensor:
        """Gradient of h from that of `[h | halo]`: halo-gradient chunks go to their owners."""
        n = self.plan.num_inner
        pending = self.transport.send_grads(
            sched, lambda c: grad_full[n + c.recv_start : n + c.recv_end], grad_full
        )
        return self.add_returned(grad_full[:n].clone(), pending, sched)

    def add_returned(self, grad_h: Tensor, pending: Pending, sched: Schedule) -> Tensor:
        """grad_h += the gradients peers computed for the rows this worker sent them."""
        for r, chunks in enumerate(sched.rounds):
            for c, grad in zip(chunks, pending.wait(r), strict=True):
                grad_h.index_add_(0, c.send_idx, grad)
        pending.finish()
        return grad_h


def _weight_grads(
    saved: tuple[Tensor, ...], needs: tuple[bool, ...], g_h: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """Gradients of x and W of h = x·Wᵀ (the layer's update, inside the aggregation), from the
    saved (x, W) and which inputs need a gradient."""
    x_NF, weight = saved
    grad_x = g_h @ weight if needs[0] else None
    grad_w = g_h.t() @ x_NF if needs[1] else None
    return grad_x, grad_w


class _Aggregate(torch.autograd.Function):
    """(x, W) -> (A·[h | halo(h)], h) with h = x·Wᵀ, or x -> A·[x | halo(x)] without W."""

    @staticmethod
    def forward(
        ctx: Any,
        x_NF: Tensor,
        weight: Tensor | None,
        agg: BlockAggregator,
        at: tuple[int, int | None],
    ) -> Any:
        layer, key = at
        sched = agg.schedule(layer)
        h_NO, read_NO, pending = agg.update_and_send(x_NF, weight, sched, layer, key)
        out_NO = agg.aggregate_arrivals(read_NO, pending, sched, layer)
        ctx.agg, ctx.sched, ctx.at = agg, sched, at
        ctx.set_materialize_grads(False)
        if weight is None:
            return out_NO
        ctx.save_for_backward(x_NF, weight)
        return out_NO, h_NO

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_h: Tensor | None = None) -> Any:
        agg: BlockAggregator = ctx.agg
        if grad_out is None:
            assert grad_h is not None
            grad_out = grad_h.new_zeros(grad_h.shape)
        layer, key = ctx.at
        if agg.grad_rows:
            g_h = agg.backward_rows(grad_out, ctx.sched, layer, key)
        else:
            g_h = agg.backward_halo(grad_out, ctx.sched, layer)
        if grad_h is not None:
            g_h += grad_h
        saved = ctx.saved_tensors  # read once: a read may draw dropped features again
        if not saved:
            return g_h, None, None, None
        return (*_weight_grads(saved, ctx.needs_input_grad, g_h), None, None)


class _Gather(torch.autograd.Function):
    """(x, W) -> `[h | halo(h)]` with h = x·Wᵀ, or x -> `[x | halo(x)]`."""

    @staticmethod
    def forward(
        ctx: Any,
        x_NF: Tensor,
        weight: Tensor | None,
        agg: BlockAggregator,
        at: tuple[int, int | None],
    ) -> Tensor:
        layer, key = at
        sched = agg.schedule(layer)
        _, read_NO, pending = agg.update_and_send(x_NF, weight, sched, layer, key)
        ctx.agg, ctx.sched = agg, sched
        if weight is not None:
            ctx.save_for_backward(x_NF, weight)
        return agg.collect_arrivals(read_NO, pending, sched)

    @staticmethod
    def backward(ctx: Any, grad_full: Tensor) -> Any:
        g_h = ctx.agg.return_halo_grads(grad_full.contiguous(), ctx.sched)
        saved = ctx.saved_tensors  # read once: a read may draw dropped features again
        if not saved:
            return g_h, None, None, None
        return (*_weight_grads(saved, ctx.needs_input_grad, g_h), None, None)


class PerLayerAggregator:
    """Layer 0 on its own halo view (replicas left out), the other layers on theirs."""

    def __init__(self, first: Aggregator, rest: Aggregator) -> None:
        self.first, self.rest, self.stats = first, rest, rest.stats

    def _of(self, layer: int) -> Aggregator:
        return self.first if layer == 0 else self.rest

    def aggregate(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        return self._of(layer).aggregate(h_NF, layer, key)

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> tuple[Tensor, Tensor]:
        return self._of(layer).transform_aggregate(x_NF, weight_OF, layer, key)

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self._of(layer).columns(layer)

    def gather(self, h_NF: Tensor, layer: int, key: int | None = None) -> Tensor:
        return self._of(layer).gather(h_NF, layer, key)

    def transform_gather(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int, key: int | None = None
    ) -> Tensor:
        return self._of(layer).transform_gather(x_NF, weight_OF, layer, key)
