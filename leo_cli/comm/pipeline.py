"""The LEO pipeline (`pipeline.mode=leo`): communication hidden behind the layer's own work.

Forward, per layer (DESIGN.md §2.2):
1. boundary-first update: the GEMM of the rows peers need runs first and their chunks are
   posted to the peers (asynchronous, `num_chunks` per peer) before the interior GEMM;
2. the inner column block is aggregated while the chunks are in flight;
3. each incoming chunk is aggregated as soon as it has landed (its own column block).
Backward mirrors it: the halo-gradient chunks are computed and posted first, the inner
backward runs while they travel, and each gradient chunk that lands is added to its owner's
rows. Numbers equal `blocking` up to the order of floating-point sums.

Attention layers (`gather`) use the same boundary-first update and chunked transfers, but
their softmax needs every score of a row, so the rows are assembled before the layer
computes on them; backward posts every halo-gradient chunk, then adds what arrives.

Legend: N inner rows, B boundary rows (sent to some peer), H halo rows, F in-width,
O out-width, S rows sent (sum over peers and chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import AggregatorBase
from leo_cli.comm.blocks import ColumnBlock, chunk_bounds, column_block
from leo_cli.comm.exchange import HaloPlan, Transfer


@dataclass(frozen=True)
class Chunk:
    """One chunk between this worker and a peer: rows sent and halo columns received."""

    peer: int
    send_idx: Tensor  # inner rows sent to the peer in this chunk
    send_pos: Tensor  # the same rows as positions among the boundary rows
    recv_start: int  # halo rows [recv_start, recv_end) arrive in this chunk
    recv_end: int
    block: ColumnBlock  # columns N + [recv_start, recv_end) of the CSR


@dataclass(frozen=True)
class Schedule:
    """The rounds in which chunks are posted and aggregated, for one chunk count: round c
    holds chunk c of every peer (peers with nothing to move in it are left out)."""

    num_chunks: int
    rounds: list[list[Chunk]]


def build_schedule(adj: kernels.CSR, plan: HaloPlan, boundary_B: Tensor, k: int) -> Schedule:
    """Cut every peer's rows into k chunks; round c holds chunk c of every peer."""
    send_off, recv_off = plan.send_offsets(), plan.recv_offsets()
    n, rounds = plan.num_inner, []
    for c in range(k):
        chunks: list[Chunk] = []
        rounds.append(chunks)
        for peer in range(len(plan.send_counts)):
            s = chunk_bounds(plan.send_counts[peer], k)
            r = chunk_bounds(plan.recv_counts[peer], k)
            if s[c + 1] == s[c] and r[c + 1] == r[c]:
                continue
            send_idx = plan.send_idx_S[send_off[peer] + s[c] : send_off[peer] + s[c + 1]]
            lo, hi = recv_off[peer] + r[c], recv_off[peer] + r[c + 1]
            chunks.append(
                Chunk(
                    peer,
                    send_idx,
                    torch.searchsorted(boundary_B, send_idx),
                    lo,
                    hi,
                    column_block(adj, n + lo, n + hi, compact=True),
                )
            )
    return Schedule(k, [chunks for chunks in rounds if chunks])


class PipelinedAggregator(AggregatorBase):
    """LEO mode: boundary-first update, chunked asynchronous halo, per-chunk aggregation."""

    def __init__(
        self,
        adj: kernels.CSR,
        plan: HaloPlan,
        num_chunks: list[int],
        inner: ColumnBlock | None = None,
        attention: bool = False,
        layers: slice = slice(None),
    ) -> None:
        """Args:
        adj: local CSR (inner rows, `[inner | halo]` columns) of the exchanged halo.
        plan: its halo plan.
        num_chunks: chunks per peer of every layer (the last one serves deeper layers).
        inner: the inner column block of another view of the same part, to share: views
            re-lay out halo columns only, so every view's inner block is the same (and it
            holds most of the edges).
        attention: keep adj for `columns` (attention layers build their edge views from
            it); otherwise it is dropped once every column block is built, since the blocks
            hold every edge again.
        layers: the layers it serves, as a slice of `num_chunks` (`slice(1, None)`: layer 1
            and deeper): schedules, each holding every halo edge again, are built for their
            chunk counts only.
        """
        self.plan, self.stats = plan, plan.stats
        self.num_chunks = num_chunks
        self.boundary_B = torch.unique(plan.send_idx_S)  # sorted
        interior = torch.ones(plan.num_inner, dtype=torch.bool, device=adj.device)
        interior[self.boundary_B] = False
        self.interior_I = torch.nonzero(interior).squeeze(1)
        if inner is None:
            inner = column_block(adj, 0, plan.num_inner, compact=False)
        assert inner.col_end == plan.num_inner and inner.fwd.num_rows == adj.num_rows
        self.inner = inner
        counts = set(num_chunks[layers]) or {num_chunks[-1]}
        self._schedules = {k: build_schedule(adj, plan, self.boundary_B, k) for k in counts}
        self.adj = adj if attention else None

    def schedule(self, layer: int) -> Schedule:
        """The chunking of a layer (built at set-up, once per chunk count)."""
        k = self.num_chunks[min(layer, len(self.num_chunks) - 1)]
        assert k in self._schedules, f"layer {layer} is not one this aggregator was built for"
        return self._schedules[k]

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        out: Tensor = _Pipelined.apply(h_NF, None, self, layer)  # type: ignore[no-untyped-call]
        return out

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        out, h_NO = _Pipelined.apply(x_NF, weight_OF, self, layer)  # type: ignore[no-untyped-call]
        return out, h_NO

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        assert self.adj is not None, "attention layers need PipelinedAggregator(attention=True)"
        return self.adj, self.plan

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        out: Tensor = _PipelinedGather.apply(h_NF, None, self, layer)  # type: ignore[no-untyped-call]
        return out

    def transform_gather(self, x_NF: Tensor, weight_OF: Tensor, layer: int) -> Tensor:
        out: Tensor = _PipelinedGather.apply(x_NF, weight_OF, self, layer)  # type: ignore[no-untyped-call]
        return out

    # -- forward pieces ------------------------------------------------------------------

    def update_and_post(
        self, x_NF: Tensor, weight: Tensor | None, sched: Schedule
    ) -> tuple[Tensor, Transfer]:
        """h = x·Wᵀ with the boundary rows first, their chunks posted before the interior."""
        if weight is None:
            return x_NF, self.post_rows(x_NF, sched, by_position=False)
        h_BO = F.linear(x_NF.index_select(0, self.boundary_B), weight)
        transfer = self.post_rows(h_BO, sched, by_position=True)
        h_NO = x_NF.new_empty((x_NF.shape[0], weight.shape[0]))
        h_NO.index_copy_(0, self.boundary_B, h_BO)
        h_NO.index_copy_(
            0, self.interior_I, F.linear(x_NF.index_select(0, self.interior_I), weight)
        )
        return h_NO, transfer

    def post_rows(self, rows: Tensor, sched: Schedule, by_position: bool) -> Transfer:
        """Post every round: halo chunks in, boundary chunks out."""
        transfer = Transfer(self.stats, rows.device)
        halo_HF = rows.new_empty((self.plan.num_halo, rows.shape[1]))
        for chunks in sched.rounds:
            recvs = [(c.peer, halo_HF[c.recv_start : c.recv_end]) for c in chunks]
            sends = [
                (c.peer, kernels.gather_rows(rows, c.send_pos if by_position else c.send_idx))
                for c in chunks
            ]
            transfer.post(recvs, sends)
        return transfer

    def aggregate_arrivals(self, h_NF: Tensor, transfer: Transfer, sched: Schedule) -> Tensor:
        """Inner block first, then every round's chunks as soon as the round has landed."""
        out_NF = self.inner.forward(h_NF)
        for r, chunks in enumerate(sched.rounds):
            for c, halo in zip(chunks, transfer.wait(r), strict=True):
                if c.block.num_edges > 0:
                    c.block.add_into(out_NF, halo)
        transfer.finish()
        return out_NF

    def collect_arrivals(self, h_NF: Tensor, transfer: Transfer, sched: Schedule) -> Tensor:
        """`[h | halo]`, every round's chunks copied into place once the round has landed."""
        halo_HF = h_NF.new_empty((self.plan.num_halo, h_NF.shape[1]))
        for r, chunks in enumerate(sched.rounds):
            for c, rows in zip(chunks, transfer.wait(r), strict=True):
                halo_HF[c.recv_start : c.recv_end] = rows
        transfer.finish()
        return torch.cat([h_NF, halo_HF])

    # -- backward pieces -----------------------------------------------------------------

    def return_halo_grads(self, grad_full: Tensor, sched: Schedule) -> Tensor:
        """Gradient of h from that of `[h | halo]`: halo-gradient chunks go to their owners."""
        n, width = self.plan.num_inner, grad_full.shape[1]
        transfer = Transfer(self.stats, grad_full.device)
        for chunks in sched.rounds:
            recvs = [(c.peer, grad_full.new_empty((c.send_idx.shape[0], width))) for c in chunks]
            sends = [(c.peer, grad_full[n + c.recv_start : n + c.recv_end]) for c in chunks]
            transfer.post(recvs, sends)
        grad_h = grad_full[:n].clone()
        for r, chunks in enumerate(sched.rounds):
            for c, grad in zip(chunks, transfer.wait(r), strict=True):
                grad_h.index_add_(0, c.send_idx, grad)
        transfer.finish()
        return grad_h

    def backward_halo(self, grad_NO: Tensor, sched: Schedule) -> Tensor:
        """Gradient of h: each round's halo-gradient chunks leave for their owners as soon as
        they exist, the inner block's backward runs meanwhile, arrivals are added last."""
        transfer = Transfer(self.stats, grad_NO.device)
        width = grad_NO.shape[1]
        for chunks in sched.rounds:
            recvs = [(c.peer, grad_NO.new_empty((c.send_idx.shape[0], width))) for c in chunks]
            transfer.post(recvs, [(c.peer, c.block.backward(grad_NO)) for c in chunks])
        grad_h = self.inner.backward(grad_NO)
        for r, chunks in enumerate(sched.rounds):
            for c, grad in zip(chunks, transfer.wait(r), strict=True):
                grad_h.index_add_(0, c.send_idx, grad)
        transfer.finish()
        return grad_h


class _Pipelined(torch.autograd.Function):
    """(x, W) -> (A·[h | halo(h)], h) with h = x·Wᵀ, or x -> A·[x | halo(x)] without W."""

    @staticmethod
    def forward(
        ctx: Any, x_NF: Tensor, weight: Tensor | None, agg: PipelinedAggregator, layer: int
    ) -> Any:
        sched = agg.schedule(layer)
        h_NO, transfer = agg.update_and_post(x_NF, weight, sched)
        out_NO = agg.aggregate_arrivals(h_NO, transfer, sched)
        ctx.agg, ctx.sched = agg, sched
        ctx.set_materialize_grads(False)
        if weight is None:
            return out_NO
        ctx.save_for_backward(x_NF, weight)
        return out_NO, h_NO

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_h: Tensor | None = None) -> Any:
        agg: PipelinedAggregator = ctx.agg
        if grad_out is None:
            grad_out = grad_h.new_zeros(grad_h.shape) if grad_h is not None else None
        assert grad_out is not None
        g_h = agg.backward_halo(grad_out, ctx.sched)
        if grad_h is not None:
            g_h += grad_h
        if not ctx.saved_tensors:
            return g_h, None, None, None
        x_NF, weight = ctx.saved_tensors
        grad_x = g_h @ weight if ctx.needs_input_grad[0] else None
        grad_w = g_h.t() @ x_NF if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


class _PipelinedGather(torch.autograd.Function):
    """(x, W) -> `[h | halo(h)]` with h = x·Wᵀ (boundary rows first), or x -> `[x | halo(x)]`."""

    @staticmethod
    def forward(
        ctx: Any, x_NF: Tensor, weight: Tensor | None, agg: PipelinedAggregator, layer: int
    ) -> Tensor:
        sched = agg.schedule(layer)
        h_NO, transfer = agg.update_and_post(x_NF, weight, sched)
        ctx.agg, ctx.sched = agg, sched
        if weight is not None:
            ctx.save_for_backward(x_NF, weight)
        return agg.collect_arrivals(h_NO, transfer, sched)

    @staticmethod
    def backward(ctx: Any, grad_full: Tensor) -> Any:
        g_h = ctx.agg.return_halo_grads(grad_full.contiguous(), ctx.sched)
        if not ctx.saved_tensors:
            return g_h, None, None, None
        x_NF, weight = ctx.saved_tensors
        grad_x = g_h @ weight if ctx.needs_input_grad[0] else None
        grad_w = g_h.t() @ x_NF if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None
