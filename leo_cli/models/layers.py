"""GCN, GraphSAGE (mean) and GIN layers on a worker's LocalGraph.

Every layer has one linear map applied to aggregated neighbours. Aggregation is linear, so
`W·(A·x) = A·(x·W)`: the layer transforms before aggregating whenever that shrinks the rows
that cross the wire (update-first, as MGG does), and aggregates first otherwise.
Legend: N inner rows, F in-width, O out-width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from leo_cli.models.graph import LayerInput, LocalGraph


def propagate(
    x_NF: Tensor, lin: nn.Linear, g: LocalGraph, self_scale: Tensor | None, at: LayerInput
) -> Tensor:
    """lin(A·x + s⊙x) without bias, in whichever order exchanges fewer columns.

    When the input is static and `Â·X` was computed once (cache level L1s), it stands in for
    the aggregation; replicated halo rows (L1) are aggregated here, at input width.
    """
    if at.static and g.static_agg_NF is not None and at.layer == 0:
        agg_NF = g.static_agg_NF
        if self_scale is not None and not g.static_has_self:
            agg_NF = agg_NF + self_scale * x_NF
        static_out: Tensor = lin(agg_NF)
        return static_out
    if lin.out_features < lin.in_features:
        out, h_NO = g.transform_aggregate(x_NF, lin.weight, at.layer)
        out = g.add_replicas(out, at.replica_RF, lin.weight, at.layer)
        return out if self_scale is None else out + self_scale * h_NO
    agg_NF = g.add_replicas(g.aggregate(x_NF, at.layer), at.replica_RF, None, at.layer)
    if self_scale is not None:
        agg_NF = agg_NF + self_scale * x_NF
    result: Tensor = lin(agg_NF)
    return result


def column(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.unsqueeze(1)


class GCNConv(nn.Module):
    """Kipf & Welling: D^-1/2 (A+I) D^-1/2 X W + b."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput) -> Tensor:
        return propagate(x_NF, self.lin, g, column(g.self_weight_N), at) + self.bias


class SAGEConv(nn.Module):
    """GraphSAGE with the mean aggregator: W_l·mean_j x_j + W_r·x_i + b."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_channels, out_channels, bias=False)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=True)

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput) -> Tensor:
        root: Tensor = self.lin_r(x_NF)
        return propagate(x_NF, self.lin_l, g, None, at) + root


class GINConv(nn.Module):
    """GIN (Xu et al. 2019): MLP((1+eps)·x_i + Σ_j x_j) with a 2-layer MLP (Linear, ReLU, Linear).

    Two choices differ from PyG's defaults, on purpose. eps is learnable (the paper's GIN-eps;
    PyG's `GINConv` defaults to `train_eps=False`, GIN-0). The MLP has no BatchNorm (PyG's GIN
    examples put one in it): full-graph batch statistics span every worker, so staying exact
    across worker counts would cost an all-reduce per layer.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(1))
        self.lin1 = nn.Linear(in_channels, out_channels, bias=False)
        self.bias1 = nn.Parameter(torch.zeros(out_channels))
        self.lin2 = nn.Linear(out_channels, out_channels)

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput) -> Tensor:
        z = propagate(x_NF, self.lin1, g, 1 + self.eps, at)
        out: Tensor = self.lin2(torch.relu(z + self.bias1))
        return out


CONVS: dict[str, type[nn.Module]] = {"gcn": GCNConv, "sage": SAGEConv, "gin": GINConv}
