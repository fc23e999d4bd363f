"""Halo access: what each part's halo costs, read from the part files alone (`PartAccess`).

For every rank: inner rows, boundary rows (sent to some peer), edges between inner rows,
and per halo row its owner and its reuse (how many local edges read it). The cost model
and the policies work from these numbers only, so a plan can be made without a process
group. Legend: N inner rows, H halo rows, P parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from leo_cli.graph.layout import LocalPart
from leo_cli.graph.types import IntArray


@dataclass(frozen=True)
class PartAccess:
    """The numbers of one part that the cost model needs.

    Attributes:
        rank: the part's rank.
        num_inner: N.
        num_boundary: inner rows that some peer reads (sent at every exchange).
        inner_edges: edges whose source is an inner row.
        reuse_H: (H) local edges reading each halo row.
        owner_H: (H) rank owning each halo row.
        send_counts: (P) rows sent to each peer.
        recv_counts: (P) halo rows received from each peer.
        rows_reading_halo: inner rows with at least one halo in-edge.
        rows_reading_peer: (P) inner rows with an in-edge from a halo row of each peer (the
            rows of the pipeline's column block of that peer; empty: unknown).
    """

    rank: int
    num_inner: int
    num_boundary: int
    inner_edges: int
    reuse_H: IntArray
    owner_H: IntArray
    send_counts: list[int]
    recv_counts: list[int]
    rows_reading_halo: int
    rows_reading_peer: list[int] = field(default_factory=list)

    @property
    def num_halo(self) -> int:
        return int(self.reuse_H.shape[0])

    @cached_property
    def halo_edges(self) -> int:
        return int(self.reuse_H.sum())

    @cached_property
    def reuse_per_owner(self) -> IntArray:
        """(P) local edges reading the halo rows of each peer."""
        return np.bincount(self.owner_H, weights=self.reuse_H, minlength=len(self.recv_counts))

    def num_blocks(self, num_chunks: int) -> int:
        """Halo column blocks of the pipeline: one per peer sending rows and chunk."""
        peers = sum(1 for c in self.recv_counts if c > 0)
        return peers * num_chunks

    def rows_reading_blocks(self, num_chunks: int) -> float:
        """Rows of all halo column blocks together (a row reading k chunks of a peer is in k
        of them), at most one per halo edge."""
        per_peer = self.rows_reading_peer or [self.rows_reading_halo]
        return float(min(sum(per_peer) * num_chunks, self.halo_edges))

    @classmethod
    def from_part(cls, part: LocalPart) -> PartAccess:
        """Counts marked in boolean arrays (one pass each; a sort of every halo edge took most
        of a plan's time at ogbn-products size)."""
        n = part.num_inner
        indices = np.asarray(part.indices)
        remote = indices >= n
        halo_E = indices[remote] - n
        reuse = np.bincount(halo_E, minlength=part.num_halo).astype(np.int64)
        indptr: IntArray = np.asarray(part.indptr, dtype=np.int64)
        row_ids = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        rows_E = cast(npt.NDArray[np.integer[Any]], np.repeat(row_ids, np.diff(indptr))[remote])
        owner_H = np.asarray(part.halo_owner, dtype=np.int64)
        return cls(
            rank=part.rank,
            num_inner=n,
            num_boundary=count_marked(np.asarray(part.send_idx), n),
            inner_edges=int(indices.shape[0] - halo_E.shape[0]),
            reuse_H=reuse,
            owner_H=owner_H,
            send_counts=[int(c) for c in part.send_counts],
            recv_counts=[int(c) for c in part.recv_counts],
            rows_reading_halo=count_marked(rows_E, n),
            rows_reading_peer=readers_per_peer(rows_E, owner_H[halo_E], n, part.num_parts),
        )


def count_marked(ids: npt.NDArray[np.integer[Any]], size: int) -> int:
    """How many distinct ids in 0..size-1 (a boolean mark per id, no sort)."""
    mark = np.zeros(size, dtype=bool)
    mark[ids] = True
    return int(np.count_nonzero(mark))


def readers_per_peer(
    rows_E: npt.NDArray[np.integer[Any]], owner_E: IntArray, num_rows: int, num_parts: int
) -> list[int]:
    """Distinct rows reading each peer's halo rows, from the (row, owner) of each halo edge."""
    out = [0] * num_parts
    for q in np.flatnonzero(np.bincount(owner_E, minlength=num_parts)):  # peers read from
        out[int(q)] = count_marked(rows_E[owner_E == q], num_rows)
    return out
