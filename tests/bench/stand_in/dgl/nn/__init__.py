"""The stand-in's layers: DGL's signatures, simple sums over in-edges."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class GraphConv(nn.Module):
    def __init__(self, in_feats: int, out_feats: int, norm: str = "both") -> None:
        super().__init__()
        self.lin = nn.Linear(in_feats, out_feats)

    def forward(self, g, x: Tensor) -> Tensor:  # noqa: ANN001
        scale = g.in_degrees().clamp(min=1).float().rsqrt().unsqueeze(1)
        return self.lin(g.sum_in(x * scale) * scale)


class SAGEConv(nn.Module):
    def __init__(self, in_feats: int, out_feats: int, aggregator_type: str) -> None:
        super().__init__()
        self.fc_self, self.fc_neigh = nn.Linear(in_feats, out_feats), nn.Linear(in_feats, out_feats)

    def forward(self, g, x: Tensor) -> Tensor:  # noqa: ANN001
        mean = g.sum_in(x) / g.in_degrees().clamp(min=1).unsqueeze(1)
        return self.fc_self(x) + self.fc_neigh(mean)


class GINConv(nn.Module):
    def __init__(self, apply_func: Callable[[Tensor], Tensor], aggregator_type: str,
                 learn_eps: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.apply_func, self.eps = apply_func, nn.Parameter(torch.zeros(1))

    def forward(self, g, x: Tensor) -> Tensor:  # noqa: ANN001
        return self.apply_func((1 + self.eps) * x + g.sum_in(x))


class GATConv(nn.Module):
    """Heads of a mean over in-edges (no attention): the shapes DGL's GATConv returns."""

    def __init__(self, in_feats: int, out_feats: int, num_heads: int, attn_drop: float = 0.0):
        super().__init__()
        self.heads, self.lin = num_heads, nn.Linear(in_feats, out_feats * num_heads)

    def forward(self, g, x: Tensor) -> Tensor:  # noqa: ANN001
        mean = g.sum_in(self.lin(x)) / g.in_degrees().clamp(min=1).unsqueeze(1)
        return mean.view(x.shape[0], self.heads, -1)
