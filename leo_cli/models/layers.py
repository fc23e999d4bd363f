"""GCN, GraphSAGE (mean) and GIN layers on a worker's LocalGraph.

Every layer has one linear map applied to aggregated neighbours. Aggregation is linear, so
`W·(A·x) = A·(x·W)`: the layer transforms before aggregating whenever that shrinks the rows
that cross the wire (update-first, as MGG does), and aggregates first otherwise.
Legend: N inner rows, F in-width, O out-width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leo_cli.models.local_graph import LayerInput, Linear, LocalGraph


def linear_propagate(
    x_NF: Tensor, lin: nn.Linear, g: LocalGraph, at: LayerInput, self_scale: Tensor | None = None
) -> Tensor:
    """lin(Â·x + s⊙x) without bias, in whichever order moves fewer columns: the linear map
    first where the layer narrows (update-first, as MGG and DGL do: `propagate(x·Wᵀ)`), the
    aggregation first otherwise (`lin(propagate(x))`). Aggregation is linear, so both orders
    give the same numbers up to rounding."""
    if lin.out_features < lin.in_features:
        return g.propagate(Linear(x_NF, lin.weight), at, self_scale)
    out: Tensor = lin(g.propagate(x_NF, at, self_scale))
    return out


class GCNConv(nn.Module):
    """Kipf & Welling: D^-1/2 (A+I) D^-1/2 X W + b (the self-loops are on the CSR's diagonal,
    models/local_graph.py)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.xavier_uniform_(self.lin.weight)

    @property
    def out_bias(self) -> Tensor:
        """The bias `forward(add_bias=False)` leaves out (the stack adds it with the ReLU)."""
        return self.bias

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput, add_bias: bool = True) -> Tensor:
        out = linear_propagate(x_NF, self.lin, g, at)
        return out + self.bias if add_bias else out


class SAGEConv(nn.Module):
    """GraphSAGE with the mean aggregator: W_l·mean_j x_j + W_r·x_i + b."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(in_channels, out_channels, bias=False)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=True)

    @property
    def out_bias(self) -> Tensor:
        """The bias `forward(add_bias=False)` leaves out (kept on `lin_r`, as PyG's keys go)."""
        return self.lin_r.bias

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput, add_bias: bool = True) -> Tensor:
        root = F.linear(x_NF, self.lin_r.weight, self.lin_r.bias if add_bias else None)
        return linear_propagate(x_NF, self.lin_l, g, at) + root


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

    @property
    def out_bias(self) -> Tensor:
        """The bias `forward(add_bias=False)` leaves out (the MLP's last)."""
        return self.lin2.bias

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput, add_bias: bool = True) -> Tensor:
        z = linear_propagate(x_NF, self.lin1, g, at, 1 + self.eps)
        bias = self.lin2.bias if add_bias else None
        return F.linear(torch.relu(z + self.bias1), self.lin2.weight, bias)


# The layer class of each convolution of the registry that aggregates with fixed edge weights
# (attention layers: models/gat.py).
LAYERS: dict[str, type[nn.Module]] = {"gcn": GCNConv, "sage": SAGEConv, "gin": GINConv}
