"""GAT (Velickovic et al. 2018) on a worker's LocalGraph: multi-head attention over in-edges.

Per head h, with z = x·W_h: e_ij = LeakyReLU(a_src·z_j + a_dst·z_i) over the in-edges of i
and its self-loop, alpha = softmax_j(e_ij), out_i = Σ_j alpha_ij z_j; heads are concatenated
between layers and averaged at the output. A source's half of the score is a linear map of x
too (a_src·z_j = x_j·(W_hᵀ a_src)), so the row a halo node sends is `[z | a_src·z]` =
x·[W | W_src]ᵀ: one GEMM, width heads x (channels + 1), exchanged like any update-first row.
The softmax of a row reads only its own in-edges, so it is local; the backward pass returns
the halo rows' gradients of both parts through the same exchange.
Legend: N inner rows, K columns of the layer's EdgeView, E its edges, H heads, C channels per
head, F in-width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leo_cli import kernels
from leo_cli.config.schema import ModelConfig
from leo_cli.models.dropout import counter_dropout
from leo_cli.models.local_graph import LayerInput, LocalGraph

NEGATIVE_SLOPE = 0.2  # LeakyReLU of the scores, as in the paper


class GATConv(nn.Module):
    """One multi-head attention layer; `concat` joins the heads, else they are averaged."""

    def __init__(
        self, in_channels: int, channels: int, heads: int, concat: bool, attention_dropout: float
    ) -> None:
        super().__init__()
        self.heads, self.channels, self.concat = heads, channels, concat
        self.attention_dropout = attention_dropout
        self.lin = nn.Linear(in_channels, heads * channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, channels))
        self.att_dst = nn.Parameter(torch.empty(heads, channels))
        self.bias = nn.Parameter(torch.zeros(heads * channels if concat else channels))
        for p in (self.lin.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(p)

    def row_weight(self) -> Tensor:
        """[W | W_src]: x times its transpose gives the row a node sends, `[z | a_src·z]`."""
        w_HCF = self.lin.weight.view(self.heads, self.channels, -1)
        w_src_HF = torch.einsum("hc,hcf->hf", self.att_src, w_HCF)
        return torch.cat([self.lin.weight, w_src_HF])

    def rows(self, x_NF: Tensor, g: LocalGraph, at: LayerInput) -> Tensor:
        """`[z | a_src·z]` of inner and halo columns, exchanging the narrower of x and it."""
        weight = self.row_weight()
        if weight.shape[0] < x_NF.shape[1]:
            return g.transform_gather(x_NF, weight, at)
        return F.linear(g.gather(x_NF, at), weight)

    def forward(self, x_NF: Tensor, g: LocalGraph, at: LayerInput) -> Tensor:
        n, hc = x_NF.shape[0], self.heads * self.channels
        view = g.edge_view(at.layer)
        rows_K = self.rows(x_NF, g, at)
        z_KHC = rows_K[:, :hc].reshape(-1, self.heads, self.channels)
        a_dst_NH = (z_KHC[:n] * self.att_dst).sum(-1)
        scores_EH = kernels.gat_scores(view.csr, rows_K[:, hc:], a_dst_NH, NEGATIVE_SLOPE)
        alpha_EH = kernels.edge_softmax(view.csr, scores_EH)
        if at.attention_key is not None and self.attention_dropout > 0:
            alpha_EH = counter_dropout(
                alpha_EH, view.edge_ids_E, self.attention_dropout, at.attention_key
            )
        out_NHC = kernels.gat_spmm(view.csr, alpha_EH, z_KHC)
        out = out_NHC.reshape(n, hc) if self.concat else out_NHC.mean(1)
        return out + self.bias


def gat_convs(cfg: ModelConfig, in_channels: int, out_channels: int) -> list[nn.Module]:
    """`num_layers - 1` hidden layers of `heads` x hidden_channels (concatenated), then an
    output layer of `output_heads` heads of out_channels (averaged)."""
    convs: list[nn.Module] = []
    width = in_channels
    for _ in range(cfg.num_layers - 1):
        convs.append(GATConv(width, cfg.hidden_channels, cfg.heads, True, cfg.attention_dropout))
        width = cfg.heads * cfg.hidden_channels
    convs.append(GATConv(width, out_channels, cfg.output_heads, False, cfg.attention_dropout))
    return convs
