"""A trained LEO model as the state dict of PyG's own model classes
(`torch_geometric.nn.models`: GCN, GraphSAGE, GIN, GAT), with the call that builds them.

The layers compute the same functions; only where parameters live differs, which each
convolution's record says (registry `Conv.pyg_model`): SAGE's bias sits on `lin_l` in PyG
(LEO: `lin_r`), GIN's MLP is `nn.lins.*` with the first bias separate in LEO, GAT's attention
vectors are `[1, H, C]` in PyG (LEO: `[H, C]`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from leo_cli.config.schema import ModelConfig
from leo_cli.errors import ConfigError
from leo_cli.registry import conv_of


@dataclass(frozen=True)
class Exported:
    """PyG's state dict, its model class and the keyword arguments that build it."""

    state: dict[str, Tensor]
    cls: str
    kwargs: dict[str, object]

    def call(self) -> str:
        """The constructor call, e.g. `GCN(in_channels=1433, hidden_channels=16, ...)`."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"torch_geometric.nn.models.{self.cls}({args})"


def to_pyg(cfg: ModelConfig, state: dict[str, Tensor]) -> Exported:
    """LEO's model state dict (`model` of a checkpoint) as PyG's, renamed by the convolution's
    record (`Conv.pyg_model`).

    Raises:
        ConfigError: the model has no PyG counterpart with the same function (GAT whose output
            layer has another head count than its hidden layers).
        KeyError: `state` is not the state dict of this model.
    """
    conv = conv_of(cfg.name)
    pyg = conv.pyg_model
    if pyg is None:
        raise ConfigError(f"model.name={cfg.name} has no PyG model to export to.")
    layers = cfg.num_layers
    out: dict[str, Tensor] = {}
    for i in range(layers):
        p = f"convs.{i}."
        for theirs, ours in pyg.keys:
            t = state[p + ours]
            out[p + theirs] = t.unsqueeze(0) if theirs in pyg.unsqueezed else t
    hidden = cfg.hidden_channels
    heads = cfg.heads if layers > 1 else cfg.output_heads  # one layer: the output layer alone
    if conv.attention:
        if cfg.output_heads != heads:
            raise ConfigError(
                f"PyG's GAT averages model.heads={cfg.heads} heads in its output layer, this "
                f"model model.output_heads={cfg.output_heads}: load its state dict into your "
                "own GATConv layers, or train with model.output_heads equal to model.heads."
            )
        hidden = cfg.heads * cfg.hidden_channels
    first, last = out["convs.0." + pyg.weight], out[f"convs.{layers - 1}." + pyg.width]
    kwargs: dict[str, object] = {"in_channels": int(first.shape[1]), "hidden_channels": hidden}
    kwargs |= {"num_layers": layers, "out_channels": int(last.shape[0])}
    if conv.attention:
        kwargs["heads"] = heads
    if conv.elu:
        kwargs["act"] = "elu"
    return Exported(out, pyg.cls, kwargs)
