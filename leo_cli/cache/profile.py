"""Access profiling: what each part's halo costs, read from the part files alone.

For every rank: inner rows, boundary rows (sent to some peer), edges between inner rows,
and per halo row its owner and its reuse (how many local edges read it). The cost model
and the policies work from these numbers only, so a plan can be made without a process
group. Legend: N inner rows, H halo rows, P parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from leo_cli.graph.layout import LocalPart
from leo_cli.graph.types import IntArray


@dataclass(frozen=True)
class PartProfile:
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

    @property
    def halo_edges(self) -> int:
        return int(self.reuse_H.sum())

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
    def from_part(cls, part: LocalPart) -> PartProfile:
        n = part.num_inner
        indices = np.asarray(part.indices)
        remote = indices >= n
        reuse = np.bincount(indices[remote] - n, minlength=part.num_halo).astype(np.int64)
        indptr: IntArray = np.asarray(part.indptr, dtype=np.int64)
        degrees = indptr[1:] - indptr[:-1]
        rows = np.repeat(np.arange(n), degrees)
        return cls(
            rank=part.rank,
            num_inner=n,
            num_boundary=int(np.unique(np.asarray(part.send_idx)).shape[0]),
            inner_edges=int((~remote).sum()),
            reuse_H=reuse,
            owner_H=np.asarray(part.halo_owner, dtype=np.int64),
            send_counts=[int(c) for c in part.send_counts],
            recv_counts=[int(c) for c in part.recv_counts],
            rows_reading_halo=int(np.unique(rows[remote]).shape[0]),
            rows_reading_peer=readers_per_peer(
                rows[remote], np.asarray(part.halo_owner)[indices[remote] - n], part.num_parts
            ),
        )


def readers_per_peer(rows_E: IntArray, owner_E: IntArray, num_parts: int) -> list[int]:
    """Distinct rows reading each peer's halo rows, from the (row, owner) of each halo edge."""
    pairs = np.unique(owner_E.astype(np.int64) * (int(rows_E.max(initial=0)) + 1) + rows_E)
    owners = pairs // (int(rows_E.max(initial=0)) + 1)
    return [int(c) for c in np.bincount(owners, minlength=num_parts)]
