"""One interface for a layer's aggregation, one implementation per `pipeline.mode`.

An aggregator owns both the communication and the SpMM of a layer, so that a mode can
overlap them (DESIGN.md §2.2). Every mode computes exactly `A·[h | halo(h)]`, the numbers the
single-process run gives, except `compute-only`, which skips the exchange on purpose.

Attention layers (GAT) weight edges by scores computed from the rows themselves, so a fixed
`A` cannot be applied: for them a mode only brings the rows, `[h | halo(h)]` in the column
order of its CSR (`columns`), through its own transport, with halo gradients flowing back.
Legend: N inner rows, H halo rows, E local edges, F in-width, O out-width.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.blocks import block_product, column_block
from leo_cli.comm.exchange import CommStats, HaloPlan, exchange_halo

# Modes whose numbers equal single-process training (compute-only is for benchmarks only).
EXACT_MODES = ("leo", "blocking", "fine-grained", "shared-memory")
MODES = (*EXACT_MODES, "compute-only")


class Aggregator(Protocol):
    """`A·[h | halo(h)]` for the rows of one worker, with gradients flowing back to owners."""

    stats: CommStats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        """Σ_j a_ij h_j over in-edges, halo rows included; h is this worker's inner rows."""
        ...

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """(A·[h | halo(h)], h) with h = x·Wᵀ (update-first layers)."""
        ...

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        """The CSR whose columns `gather` returns rows for, and the plan filling its halo."""
        ...

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        """`[h | halo(h)]` in the column order of `columns(layer)`, differentiably."""
        ...

    def transform_gather(self, x_NF: Tensor, weight_OF: Tensor, layer: int) -> Tensor:
        """`gather(x·Wᵀ)`: the mode may overlap the GEMM with the exchange."""
        ...


class AggregatorBase:
    """Update-first as 'transform, then aggregate'; modes that overlap the two override it."""

    stats: CommStats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        raise NotImplementedError

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        h_NO = F.linear(x_NF, weight_OF)
        return self.aggregate(h_NO, layer), h_NO

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        raise NotImplementedError

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        raise NotImplementedError

    def transform_gather(self, x_NF: Tensor, weight_OF: Tensor, layer: int) -> Tensor:
        return self.gather(F.linear(x_NF, weight_OF), layer)


class LocalAggregator(AggregatorBase):
    """A single worker owns every node: no halo, one SpMM."""

    def __init__(self, adj: kernels.CSR) -> None:
        assert adj.num_cols == adj.num_rows, "a single-worker graph has no halo columns"
        # The block is adj itself (its arrays, not a copy) plus the transpose; `columns`
        # hands out the block's CSR, so no second permutation stays alive either.
        self.block = column_block(adj, 0, adj.num_cols, compact=False)
        self.adj = self.block.fwd
        self.stats = CommStats()

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return block_product(self.block, h_NF)

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self.adj, None

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        return h_NF


class BlockingAggregator(AggregatorBase):
    """Exchange the whole halo, wait, then one SpMM (DGL/PyG-style; the exact reference).

    With an edge-level plan and CSR (`fine_grained_view`) the same code is MGG's scheme:
    every remote edge brings its own row, so bytes follow remote edges, not halo rows.
    """

    def __init__(self, adj: kernels.CSR, plan: HaloPlan) -> None:
        self.adj, self.plan, self.stats = adj, plan, plan.stats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return kernels.spmm(self.adj, exchange_halo(h_NF, self.plan))

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self.adj, self.plan

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        return exchange_halo(h_NF, self.plan)


class ComputeOnlyAggregator(AggregatorBase):
    """The halo is never exchanged (zeros instead): the time perfect overlap would reach.

    Numbers are wrong on purpose; `leo bench` uses it as the floor of the other modes.
    """

    def __init__(self, adj: kernels.CSR, plan: HaloPlan) -> None:
        self.adj, self.plan, self.stats = adj, plan, plan.stats

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return kernels.spmm(self.adj, self.gather(h_NF, layer))

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self.adj, self.plan

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        return torch.cat([h_NF, h_NF.new_zeros((self.plan.num_halo, h_NF.shape[1]))])


class PerLayerAggregator(AggregatorBase):
    """Layer 0 on its own halo view (replicas left out), the other layers on theirs."""

    def __init__(self, first: Aggregator, rest: Aggregator) -> None:
        self.first, self.rest, self.stats = first, rest, rest.stats

    def _of(self, layer: int) -> Aggregator:
        return self.first if layer == 0 else self.rest

    def aggregate(self, h_NF: Tensor, layer: int) -> Tensor:
        return self._of(layer).aggregate(h_NF, layer)

    def transform_aggregate(
        self, x_NF: Tensor, weight_OF: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        return self._of(layer).transform_aggregate(x_NF, weight_OF, layer)

    def columns(self, layer: int) -> tuple[kernels.CSR, HaloPlan | None]:
        return self._of(layer).columns(layer)

    def gather(self, h_NF: Tensor, layer: int) -> Tensor:
        return self._of(layer).gather(h_NF, layer)

    def transform_gather(self, x_NF: Tensor, weight_OF: Tensor, layer: int) -> Tensor:
        return self._of(layer).transform_gather(x_NF, weight_OF, layer)
