"""A worker's graph as the layers see it: normalised CSR over `[inner | halo]` and the
aggregator of the pipeline mode, which owns both the halo exchange and the SpMM.

Attention layers see it through an `EdgeView` per layer: the in-edges of the aggregator's
columns plus one self-loop per row, and the global ids of both ends of every edge.
Legend: N inner rows, H halo rows, K columns of a view, E local edges, F in-width, O out-width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import Aggregator
from leo_cli.comm.exchange import halo_ids
from leo_cli.comm.levels import Replicas
from leo_cli.graph.layout import LocalPart
from leo_cli.kernels.csr import INT32_MAX, row_of_edges
from leo_cli.models.dropout import edge_ids
from leo_cli.registry import conv_of


@dataclass(frozen=True)
class EdgeView:
    """What an attention layer aggregates over.

    Attributes:
        csr: inner rows, the columns of the aggregator's `gather`; the in-edges (an explicit
            self-loop dropped) plus one self-loop per row; values unused.
        edge_ids_E: id of every edge's (global source, global destination) pair, in CSR
            order (the keys of attention dropout).
    """

    csr: kernels.CSR
    edge_ids_E: Tensor


def attention_view(adj: kernels.CSR, col_ids_K: Tensor, ids_N: Tensor) -> EdgeView:
    """The EdgeView of a CSR whose columns have global ids `col_ids_K` (inner rows `ids_N`)."""
    n = adj.num_rows
    rows_E, cols_E = row_of_edges(adj.indptr), adj.indices.long()
    keep_E = col_ids_K[cols_E] != ids_N[rows_E]  # softmax over in-edges and one self-loop
    diag_N = torch.arange(n, device=adj.device)
    rows_E, cols_E = torch.cat([rows_E[keep_E], diag_N]), torch.cat([cols_E[keep_E], diag_N])
    csr = kernels.CSR.from_coo(rows_E, cols_E, None, n, adj.num_cols)
    src_E = col_ids_K[csr.indices.long()]
    return EdgeView(csr, edge_ids(src_E, ids_N[row_of_edges(csr.indptr)]))


@dataclass(frozen=True)
class LayerInput:
    """Where a layer sits and what its input is.

    Attributes:
        layer: index of the layer (per-layer plans key on it).
        static: the input is the raw features, unchanged since set-up (layer 0 without
            input dropout, or evaluation): a precomputed `Â·X` may stand in.
        replica_RF: layer 0's input rows of replicated halo nodes, dropout applied.
        attention_key: key of the layer's attention dropout masks (training), or None.
        rows_key: key of the stochastic rounding of the rows it reads (`pipeline.halo_dtype`
            int8, training), or None: round to nearest.
    """

    layer: int
    static: bool = False
    replica_RF: Tensor | None = None
    attention_key: int | None = None
    rows_key: int | None = None


@dataclass(frozen=True)
class Linear:
    """`x·Wᵀ` not computed yet, handed to `LocalGraph.propagate` as its input: the aggregation
    computes it where its mode wants (the LEO pipeline: boundary rows first, so their rows
    leave before the interior's GEMM), as PyG's `propagate(x=self.lin(x))` with the GEMM left
    to the one that moves the rows."""

    x_NF: Tensor
    weight_OF: Tensor


@dataclass
class LocalGraph:
    """What a layer needs: global ids and the aggregator (whose CSR holds GCN's self-loops on
    its diagonal); the cache levels (static aggregate, replicas) sit here, out of the layers'
    sight.

    Attributes:
        global_ids_N: global node ids of inner rows (keys of the dropout masks).
        aggregator: sums in-neighbours over `[inner | halo]` columns, exchanging halo rows
            (and their gradients) as its pipeline mode does.
        replicas: layer-0 input rows of replicated halo nodes (cache level L1), or None.
        static_agg_NF: `Â·X` of layer 0 computed once (cache level L1s), or None.
    """

    global_ids_N: Tensor
    aggregator: Aggregator
    replicas: Replicas | None = None
    static_agg_NF: Tensor | None = None
    edge_views: dict[int, EdgeView] = field(default_factory=dict)

    def propagate(
        self, h: Tensor | Linear, at: LayerInput, self_scale: Tensor | None = None
    ) -> Tensor:
        """Σ_j â_ij h_j + s_i h_i: message passing over in-edges, halo rows included (PyG's
        `propagate`), `self_scale` s the weight of each row's own term (None: none).

        `h` is a layer's input rows, or a pending `Linear` x·Wᵀ. Where the input is static
        (layer 0 without input dropout), the precomputed `Â·X` stands in (L1s); replicated
        halo rows are aggregated at input width and added (L1).
        """
        weight = h.weight_OF if isinstance(h, Linear) else None
        x_NF = h.x_NF if isinstance(h, Linear) else h
        if at.static and at.layer == 0 and self.static_agg_NF is not None:
            agg_NF = self.static_agg_NF
            if self_scale is not None:
                agg_NF = agg_NF + self_scale * x_NF
            return agg_NF if weight is None else F.linear(agg_NF, weight)
        if weight is None:
            out = self.aggregator.aggregate(x_NF, at.layer, at.rows_key)
            h_NF = x_NF
        else:
            out, h_NF = self.aggregator.transform_aggregate(x_NF, weight, at.layer, at.rows_key)
        out = self.add_replicas(out, at.replica_RF, weight, at.layer)
        return out if self_scale is None else out + self_scale * h_NF

    def gather(self, h_NF: Tensor, at: LayerInput) -> Tensor:
        """`[h | halo(h)]` in the columns of `edge_view(layer)` (attention layers)."""
        return self.aggregator.gather(h_NF, at.layer, at.rows_key)

    def transform_gather(self, x_NF: Tensor, weight_OF: Tensor, at: LayerInput) -> Tensor:
        """`gather(x·Wᵀ)`: the mode may overlap the GEMM with the exchange."""
        return self.aggregator.transform_gather(x_NF, weight_OF, at.layer, at.rows_key)

    def edge_view(self, layer: int) -> EdgeView:
        assert layer in self.edge_views, "attention layers need prepare_attention() at set-up"
        return self.edge_views[layer]

    def prepare_attention(self, num_layers: int) -> None:
        """Build every layer's EdgeView. Collective: every worker calls it at set-up."""
        # One view per (CSR, plan): halo_ids is collective per plan, and a worker may share
        # a CSR between layers whose plans differ (comm/levels.py).
        built: dict[tuple[int, int], EdgeView] = {}
        for layer in range(num_layers):
            adj, plan = self.aggregator.columns(layer)
            key = (id(adj), id(plan))
            if key not in built:
                ids_N = self.global_ids_N
                col_ids_K = ids_N if plan is None else halo_ids(plan, ids_N)
                built[key] = attention_view(adj, col_ids_K, ids_N)
            self.edge_views[layer] = built[key]

    def add_replicas(
        self, out_NO: Tensor, xr_RF: Tensor | None, weight_OF: Tensor | None, layer: int
    ) -> Tensor:
        """Layer 0: add the replicated columns' share `(Â_R·X'_R)·Wᵀ` (left out of exchange)."""
        if layer != 0 or self.replicas is None:
            return out_NO
        assert xr_RF is not None, "layer 0 needs the replicated rows when replicas exist"
        return self.replicas.add_into(out_NO, xr_RF, weight_OF)


def edge_values(
    part: LocalPart, model: str, dtype: torch.dtype, edges: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor | None]:
    """Edge weights of a convolution from global degrees, computed in the training dtype, by
    its registry record's `edge_weights`: symmetric 1/sqrt((d_j+1)(d_i+1)) with self weight
    1/(d_i+1) (GCN); mean 1/d_i; sum 1; attention 1 (its weights are scores, per step).
    `edges`: the row and column of every edge, where the caller has them.
    """
    kind = conv_of(model).edge_weights
    deg = torch.from_numpy(np.asarray(part.degree)).to(dtype)
    if edges is None:
        cols = torch.from_numpy(np.asarray(part.indices))
        rows = row_of_edges(torch.from_numpy(np.asarray(part.indptr)), cols.dtype)
    else:
        rows, cols = edges
    deg_N = deg[: part.num_inner]
    if kind == "symmetric":
        deg1 = deg + 1  # per node, not per edge: the same numbers in fewer passes
        values = deg1.index_select(0, cols).mul_(deg1[: part.num_inner].index_select(0, rows))
        return values.rsqrt_(), 1.0 / (deg_N + 1)
    if kind == "mean":
        return 1.0 / deg_N.index_select(0, rows), None
    assert kind in ("sum", "attention"), kind
    return torch.ones(cols.shape[0], dtype=dtype), None


def transpose_scales(
    part: LocalPart, model: str, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor] | None:
    """(r, c) of the inner rows with `Aᵀ = diag(r)·A·diag(c)`, where the graph is symmetric
    (every loader symmetrizes): the mean's `a_ij = 1/d_i` gives r = d, c = 1/d; symmetric
    and sum weights are their own transpose (None). A backward that reads the gradient as
    rows (rounded rows, the shared segment) reads `Aᵀ·g` so (comm/aggregate.py)."""
    if conv_of(model).edge_weights != "mean":
        return None
    deg_N = torch.from_numpy(np.asarray(part.degree)[: part.num_inner]).to(dtype)
    deg_N = deg_N.clamp(min=1).to(device)  # a row without edges is read by none
    return deg_N, 1.0 / deg_N


def part_adjacency(
    part: LocalPart,
    model: str,
    dtype: torch.dtype,
    device: torch.device,
    transpose: bool = True,
) -> kernels.CSR:
    """The part's CSR (inner rows, `[inner | halo]` columns) weighted for `model`, with each
    inner row's self-loop weight (GCN's) on its diagonal: the aggregation then sums a row's
    own term with its neighbours' in one pass, forward and backward. Without `transpose`,
    forward-only."""
    indptr = torch.from_numpy(np.asarray(part.indptr))
    indices = torch.from_numpy(np.asarray(part.indices))
    num_cols = part.num_inner + part.num_halo
    fits = max(indices.shape[0] + part.num_inner, num_cols) <= INT32_MAX  # with the diagonal
    index_dtype = torch.int32 if fits else torch.int64  # int32: half the bytes to move
    indptr, indices = indptr.to(index_dtype), indices.to(index_dtype)
    rows_E = row_of_edges(indptr, indices.dtype)  # once, for the weights and the diagonal
    values, self_weight = edge_values(part, model, dtype, (rows_E, indices))
    if conv_of(model).diagonal:
        assert self_weight is not None, "a diagonal convolution has self-loop weights"
        indptr, indices, values = with_diagonal(indptr, indices, values, self_weight, rows_E)
    del rows_E
    adj = kernels.CSR.from_arrays(indptr, indices, values, num_cols=num_cols, transpose=transpose)
    return adj.to(device)


def with_diagonal(
    indptr: Tensor, indices: Tensor, values: Tensor, diag_N: Tensor, rows_E: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """CSR arrays with entry (i, i) of value `diag_N[i]` added to every row i < N, at its place
    among the row's columns (kept in increasing order where they were); `rows_E`: the row of
    every edge, where the caller has it."""
    n = diag_N.shape[0]
    rows_E = rows_E if rows_E is not None else row_of_edges(indptr, indices.dtype)
    first_N = torch.arange(n, dtype=torch.int64)
    below_N = torch.bincount(rows_E[indices < rows_E], minlength=n)
    at_N = indptr[:n].long() + below_N + first_N  # where each diagonal entry lands
    out_E = torch.ones(indices.shape[0] + n, dtype=torch.bool)
    out_E[at_N] = False
    kept_E = torch.nonzero(out_E).squeeze(1)  # once for both arrays (a mask scatter each)
    del out_E
    new_indices = torch.empty(kept_E.shape[0] + n, dtype=indices.dtype)
    new_indices.index_copy_(0, kept_E, indices)
    new_indices[at_N] = first_N.to(indices.dtype)
    new_values = torch.empty(kept_E.shape[0] + n, dtype=values.dtype)
    new_values.index_copy_(0, kept_E, values)
    new_values[at_N] = diag_N.to(values.dtype)
    shift = torch.cat([first_N, torch.tensor([n])]).to(indptr.dtype)
    return indptr + shift, new_indices, new_values
