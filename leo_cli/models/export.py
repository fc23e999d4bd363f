"""A trained LEO model as the state dict of PyG's own model classes
(`torch_geometric.nn.models`: GCN, GraphSAGE, GIN, GAT), with the call that builds them.

The layers compute the same functions; only where parameters live differs: SAGE's bias sits on
`lin_l` in PyG (LEO: `lin_r`), GIN's MLP is `nn.lins.*` with the first bias separate in LEO,
GAT's attention vectors are `[1, H, C]` in PyG (LEO: `[H, C]`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from leo_cli.config.schema import ModelConfig
from leo_cli.errors import ConfigError

PYG_CLASSES = {"gcn": "GCN", "sage": "GraphSAGE", "gin": "GIN", "gat": "GAT"}
FIRST_WEIGHT = {  # PyG's key of the first layer's weight [out, in]
    "gcn": "convs.0.lin.weight",
    "sage": "convs.0.lin_l.weight",
    "gin": "convs.0.nn.lins.0.weight",
    "gat": "convs.0.lin.weight",
}


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
    """LEO's model state dict (`model` of a checkpoint) as PyG's.

    Raises:
        ConfigError: the model has no PyG counterpart with the same function (GAT whose output
            layer has another head count than its hidden layers).
        KeyError: `state` is not the state dict of this model.
    """
    layers = cfg.num_layers
    last = None
    out: dict[str, Tensor] = {}
    for i in range(layers):
        p = f"convs.{i}."
        if cfg.name == "gcn":
            out |= {p + "lin.weight": state[p + "lin.weight"], p + "bias": state[p + "bias"]}
            last = state[p + "lin.weight"]
        elif cfg.name == "sage":
            out |= {
                p + "lin_l.weight": state[p + "lin_l.weight"],
                p + "lin_l.bias": state[p + "lin_r.bias"],
                p + "lin_r.weight": state[p + "lin_r.weight"],
            }
            last = state[p + "lin_l.weight"]
        elif cfg.name == "gin":
            out |= {
                p + "eps": state[p + "eps"],
                p + "nn.lins.0.weight": state[p + "lin1.weight"],
                p + "nn.lins.0.bias": state[p + "bias1"],
                p + "nn.lins.1.weight": state[p + "lin2.weight"],
                p + "nn.lins.1.bias": state[p + "lin2.bias"],
            }
            last = state[p + "lin2.weight"]
        elif cfg.name == "gat":
            out |= {
                p + "lin.weight": state[p + "lin.weight"],
                p + "att_src": state[p + "att_src"].unsqueeze(0),
                p + "att_dst": state[p + "att_dst"].unsqueeze(0),
                p + "bias": state[p + "bias"],
            }
            last = state[p + "bias"]
        else:
            raise ConfigError(f"model.name={cfg.name} has no PyG model to export to.")
    assert last is not None
    hidden = cfg.hidden_channels
    heads = cfg.heads if layers > 1 else cfg.output_heads  # one layer: the output layer alone
    if cfg.name == "gat":
        if cfg.output_heads != heads:
            raise ConfigError(
                f"PyG's GAT averages model.heads={cfg.heads} heads in its output layer, this "
                f"model model.output_heads={cfg.output_heads}: load its state dict into your "
                "own GATConv layers, or train with model.output_heads equal to model.heads."
            )
        hidden = cfg.heads * cfg.hidden_channels
    first = out[FIRST_WEIGHT[cfg.name]]
    kwargs: dict[str, object] = {"in_channels": int(first.shape[1]), "hidden_channels": hidden}
    kwargs |= {"num_layers": layers, "out_channels": int(last.shape[0])}
    if cfg.name == "gat":
        kwargs |= {"heads": heads, "act": "elu"}
    return Exported(out, PYG_CLASSES[cfg.name], kwargs)
