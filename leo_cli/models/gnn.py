"""The GNN: a stack of one conv type with counter-based dropout before each layer.

What the stack needs of a convolution comes from its registry record (leo_cli/registry.py):
attention layers (GAT) build their own stack, use ELU between layers as the paper does, and
draw their attention dropout masks from a stream of their own per (seed, epoch, layer); the
others use ReLU.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leo_cli.config.schema import ModelConfig
from leo_cli.models.dropout import (
    Recomputed,
    attention_key,
    counter_dropout,
    relu_dropout,
    rows_key,
    stream_key,
)
from leo_cli.models.gat import gat_convs
from leo_cli.models.layers import LAYERS
from leo_cli.models.local_graph import LayerInput, LocalGraph
from leo_cli.registry import conv_of


class GNN(nn.Module):
    """`num_layers` convs, ReLU between them, dropout on every layer's input (the first
    layer's rate is `input_dropout`, the others' `dropout`)."""

    def __init__(self, cfg: ModelConfig, in_channels: int, out_channels: int) -> None:
        super().__init__()
        spec = conv_of(cfg.name)
        self.attention, self.elu = spec.attention, spec.elu
        if self.attention:
            self.convs = nn.ModuleList(gat_convs(cfg, in_channels, out_channels))
        else:
            conv = LAYERS[cfg.name]
            widths = [in_channels] + [cfg.hidden_channels] * (cfg.num_layers - 1) + [out_channels]
            self.convs = nn.ModuleList(conv(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.dropout = cfg.dropout
        self.input_dropout = cfg.effective_input_dropout

    def forward(self, x_NF: Tensor, g: LocalGraph, seed: int = 0, epoch: int = 0) -> Tensor:
        """Logits of the inner rows; masks keyed by (seed, epoch, layer, global id). Between
        layers, bias, ReLU and the next layer's dropout run as one op (`relu_dropout`); the
        features' dropped copy is drawn again where layer 0's backward needs it (`Recomputed`)."""
        h = x_NF
        last = len(self.convs) - 1
        drawn = Recomputed()  # the features' dropped copies are drawn again by the backward
        for layer, conv in enumerate(self.convs):
            p = self.input_dropout if layer == 0 else self.dropout
            dropped = self.training and p > 0
            key = stream_key(seed, epoch, layer)
            if dropped and layer == 0:
                h = drawn.dropout(h, g.global_ids_N, p, key)
            elif dropped and self.elu:  # else drawn with the ReLU before it
                h = counter_dropout(h, g.global_ids_N, p, key)
            at = LayerInput(layer, static=layer == 0 and not dropped)
            if layer == 0 and g.replicas is not None:
                # Replicated halo rows draw the masks their owners draw (keyed by global id).
                xr = g.replicas.x_RF
                xr = drawn.dropout(xr, g.replicas.ids_R, p, key) if dropped else xr
                at = LayerInput(layer, static=not dropped, replica_RF=xr)
            if self.attention and self.training:
                at = LayerInput(layer, attention_key=attention_key(seed, epoch, layer))
            if self.training:  # rounded rows draw their random bytes from a stream of their own
                at = replace(at, rows_key=rows_key(seed, epoch, layer))
            fused = layer != last and not self.elu  # bias, ReLU, next dropout: one op
            with drawn.saving() if layer == 0 else nullcontext():
                z: Tensor = conv(h, g, at, add_bias=False) if fused else conv(h, g, at)
            if layer == last:
                return z
            if self.elu:
                h = F.elu(z)
                continue
            p_next = self.dropout if self.training else 0.0
            bias, next_key = conv.out_bias, stream_key(seed, epoch, layer + 1)
            assert isinstance(bias, Tensor), "GCN, SAGE and GIN layers end in a bias"
            h = relu_dropout(z, bias, g.global_ids_N, p_next, next_key)
        return h


def build_model(cfg: ModelConfig, in_channels: int, out_channels: int, seed: int) -> GNN:
    """Same seed => same initial weights on every worker."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GNN(cfg, in_channels, out_channels)
