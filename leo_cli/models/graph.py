"""A worker's graph as the layers see it: normalised CSR over `[inner | halo]`, plus exchange.

Legend: N inner rows, H halo rows, E local edges, F width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.exchange import HaloExchanger
from leo_cli.graph.layout import LocalPart


@dataclass
class LocalGraph:
    """What a layer needs: the aggregation matrix, self-loop weights and the exchanger.

    Attributes:
        adj: CSR with inner rows and `[inner | halo]` columns, weighted for the model.
        self_weight_N: weight of each row's own term (GCN's self-loop), or None.
        global_ids_N: global node ids of inner rows (keys of the dropout masks).
        exchanger: brings halo rows in before aggregation (and their gradients back).
    """

    adj: kernels.CSR
    self_weight_N: Tensor | None
    global_ids_N: Tensor
    exchanger: HaloExchanger

    @property
    def num_inner(self) -> int:
        return int(self.global_ids_N.shape[0])

    def aggregate(self, h_NF: Tensor) -> Tensor:
        """Σ_j w_ij h_j over in-edges (halo rows exchanged first); the self term is not included."""
        return kernels.spmm(self.adj, self.exchanger.exchange(h_NF))


def edge_values(part: LocalPart, model: str, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """Per-model edge weights from global degrees, computed in the training dtype.

    gcn: 1/sqrt((d_j+1)(d_i+1)) with self weight 1/(d_i+1); sage: mean, 1/d_i; gin: sum, 1.
    """
    deg = torch.from_numpy(np.asarray(part.degree)).to(dtype)
    rows = torch.repeat_interleave(
        torch.arange(part.num_inner), torch.from_numpy(np.diff(np.asarray(part.indptr)))
    )
    cols = torch.from_numpy(np.asarray(part.indices))
    deg_N = deg[: part.num_inner]
    if model == "gcn":
        values = torch.rsqrt((deg[cols] + 1) * (deg_N[rows] + 1))
        return values, 1.0 / (deg_N + 1)
    if model == "sage":
        return 1.0 / deg_N[rows], None
    assert model == "gin", model
    return torch.ones(cols.shape[0], dtype=dtype), None


def build_local_graph(
    part: LocalPart,
    model: str,
    dtype: torch.dtype,
    exchanger: HaloExchanger,
    device: torch.device,
) -> LocalGraph:
    """Assemble the LocalGraph of one part for one model."""
    values, self_weight = edge_values(part, model, dtype)
    adj = kernels.CSR.from_arrays(
        torch.from_numpy(np.asarray(part.indptr)),
        torch.from_numpy(np.asarray(part.indices)),
        values,
        num_cols=part.num_inner + part.num_halo,
    ).to(device)
    return LocalGraph(
        adj=adj,
        self_weight_N=None if self_weight is None else self_weight.to(device),
        global_ids_N=torch.from_numpy(np.asarray(part.inner_nodes)).to(device),
        exchanger=exchanger,
    )
