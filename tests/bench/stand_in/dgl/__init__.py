"""A stand-in for DGL in tests: the few APIs leo_cli/bench/dgl_peer.py uses, in plain torch.

Like DGL 2.1 beside a torch it was not built for, importing it fails in `dgl.graphbolt`, so
the peer's import without graphbolt is exercised too.
"""

from __future__ import annotations

import torch

from . import (
    graphbolt,  # noqa: F401  (fails as DGL 2.1's does beside another torch)
    nn,  # noqa: F401
)

__version__ = "0.0-stand-in"


class Graph:
    """Edges src -> dst of `num_nodes` nodes."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> None:
        self.src, self.dst, self.num_nodes = src, dst, num_nodes

    def to(self, device: torch.device) -> Graph:
        return Graph(self.src.to(device), self.dst.to(device), self.num_nodes)

    def create_formats_(self) -> None:
        pass

    def in_degrees(self) -> torch.Tensor:
        return torch.bincount(self.dst, minlength=self.num_nodes)

    def sum_in(self, h: torch.Tensor) -> torch.Tensor:
        """Per node, the sum of `h` over its in-edges."""
        return torch.zeros(self.num_nodes, *h.shape[1:]).index_add_(0, self.dst, h[self.src])


def graph(edges: tuple[torch.Tensor, torch.Tensor], num_nodes: int) -> Graph:
    return Graph(edges[0], edges[1], num_nodes)


def remove_self_loop(g: Graph) -> Graph:
    keep = g.src != g.dst
    return Graph(g.src[keep], g.dst[keep], g.num_nodes)


def add_self_loop(g: Graph) -> Graph:
    loops = torch.arange(g.num_nodes)
    return Graph(torch.cat([g.src, loops]), torch.cat([g.dst, loops]), g.num_nodes)
