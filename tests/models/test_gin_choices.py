"""GIN's documented departures from PyG's defaults (README, GINConv docstring) hold."""

from __future__ import annotations

from torch import nn

from leo_cli.models.layers import GINConv


def test_gin_learns_eps_and_has_no_batchnorm() -> None:
    conv = GINConv(8, 4)
    assert isinstance(conv.eps, nn.Parameter) and conv.eps.requires_grad
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in conv.modules())
