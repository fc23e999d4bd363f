"""The LEO cost model: predicted seconds of every stage of a training step, per rank and mode.

Per layer and direction, a rank's work splits into what must happen before its rows leave
(`pre`: boundary GEMM, dropout masks, packing), what can overlap the transfer (`window`:
interior GEMM, aggregation of inner and replicated columns), the transfer itself (`comm`)
and what needs the arrived rows (`post`: halo aggregation, unpacking). Modes combine them:

- blocking:  max_r(pre + window) + max_r comm + max_r post   (everyone waits for everyone)
- leo:       max_r [max(pre_r + window_r + post_r·(k-1)/k, max_q pre_q + comm_r(k)) + post_r/k]
  (chunk c + 1 travels while chunk c is aggregated; k chunks cost k messages per peer)
- fine-grained: blocking, one row per remote edge; shared-memory: blocking, the transfer is a
  write into the shared segment plus a barrier; compute-only: blocking without transfer.

Rates come from the hardware profile (`leo profile-cache` measures it). Legend: N inner rows,
B boundary rows, R replicated rows, E edges, a/b a layer's input/output width, w the width
it exchanges, k chunks per peer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from leo_cli.cache.hardware import HardwareProfile, Link
from leo_cli.cache.profile import PartProfile
from leo_cli.graph.types import IntArray

MODES = ("leo", "leo-no-cache", "blocking", "fine-grained", "shared-memory", "compute-only")


@dataclass(frozen=True)
class ModelShape:
    """What the model does per layer, as the cost model needs it."""

    widths: tuple[int, ...]
    dropout: float
    input_dropout: float
    dtype_bytes: int
    extra_gemm: bool  # sage's root linear map, gin's second linear map
    attention: bool = False
    """Edge weights computed per step (gat): no aggregate-first of raw inputs, so neither
    replicas nor a static aggregate apply (see cache/policy.py)."""
    rows: tuple[int, ...] = ()
    """Width of the row each layer computes (default: its output width; gat adds a score
    per head)."""

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    def exchanged_width(self, layer: int) -> int:
        a = self.widths[layer]
        b = self.rows[layer] if self.rows else self.widths[layer + 1]
        return b if b < a else a


@dataclass(frozen=True)
class RankCache:
    """One rank's cache levels: halo positions replicated (L1) and fetched per edge (L3)."""

    static_aggregate: bool = False
    replica_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    l3_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Phases:
    """Seconds of one rank in one layer and direction (see module docstring)."""

    pre: float
    window: float
    comm: float
    post: float


@dataclass
class Prediction:
    """Predicted step time of a mode and where it goes."""

    epoch_time_s: float
    stages: dict[str, float]
    per_rank: list[dict[str, float]]


class _Counts:
    """Rows and edges a rank moves and aggregates at one layer, given every rank's cache."""

    def __init__(
        self, profiles: list[PartProfile], caches: list[RankCache], layer: int, per_edge: bool
    ) -> None:
        num = len(profiles)
        self.recv = np.zeros((num, num))  # recv[r, q]: rows r receives from q
        self.halo_edges = np.zeros(num)
        self.replica_edges = np.zeros(num)
        self.replica_rows = np.zeros(num)
        for r, (p, c) in enumerate(zip(profiles, caches, strict=True)):
            l1 = np.zeros(p.num_halo, dtype=bool)
            if layer == 0:
                l1[c.replica_rows] = True
            l3 = np.zeros(p.num_halo, dtype=bool)
            l3[c.l3_rows] = True
            rows_per_row = np.where(l3 | per_edge, p.reuse_H, 1) * ~l1
            self.recv[r] = np.bincount(p.owner_H, weights=rows_per_row, minlength=num)
            self.halo_edges[r] = p.reuse_H[~l1].sum()
            self.replica_edges[r] = p.reuse_H[l1].sum()
            self.replica_rows[r] = l1.sum()
        self.send = self.recv.T.sum(axis=1)  # rows each rank sends (what its readers receive)


def _layer_phases(
    p: PartProfile,
    r: int,
    cnt: _Counts,
    shape: ShapeLayer,
    hw: HardwareProfile,
    mode: str,
    k: int,
) -> tuple[Phases, Phases]:
    """Forward and backward phases of rank r at one layer."""
    a, b, w = shape.a, shape.b, shape.w
    n, bnd = p.num_inner, min(p.num_boundary, p.num_inner)
    row = w * shape.dtype_bytes
    link: Link = "shm" if mode == "shared-memory" else "gloo"
    chunks = k if mode in ("leo", "leo-no-cache") else 1
    mask = hw.mask_seconds(n, a) if shape.p > 0 else 0.0
    mask += hw.mask_seconds(int(cnt.replica_rows[r]), a) if shape.p > 0 else 0.0
    gemm = hw.gemm_seconds(n, a, b) * (2 if shape.extra else 1)
    replicas = hw.spmm_seconds(int(cnt.replica_edges[r]), a)
    replicas += hw.gemm_seconds(min(int(cnt.replica_edges[r]), n), a, b)  # rows reading them
    halo = hw.spmm_seconds(int(cnt.halo_edges[r]), w)
    unpack_rows = min(p.rows_reading_halo, n)
    # Peers exchange at the same time: a rank waits for its slowest peer.
    comm_f = comm_b = 0.0
    if mode != "compute-only" and cnt.recv.shape[0] > 1:
        comm_f = max(hw.transfer_seconds(rows * row, chunks, link) for rows in cnt.recv[r])
        comm_b = max(hw.transfer_seconds(rows * row, chunks, link) for rows in cnt.recv[:, r])
    if mode == "shared-memory":  # every worker writes all its rows, then a barrier
        comm_f = hw.transfer_seconds(n * row, 1, link) + hw.barrier_seconds()
        comm_b = hw.transfer_seconds(cnt.recv[r].sum() * row, 1, link) + hw.barrier_seconds()
    pack = hw.gather_seconds(int(cnt.send[r]), w)
    fwd = Phases(
        pre=mask + hw.gemm_seconds(bnd, a, b) * shape.upd + pack,
        window=hw.gemm_seconds(n - bnd, a, b) * shape.upd
        + hw.spmm_seconds(p.inner_edges, w)
        + replicas,
        comm=comm_f,
        post=halo + hw.scatter_add_seconds(unpack_rows, w) + gemm * (not shape.upd),
    )
    grad_gemm = gemm * (2 if shape.layer > 0 else 1)
    bwd = Phases(
        pre=halo + hw.gather_seconds(unpack_rows, w),
        window=hw.spmm_seconds(p.inner_edges, w),
        comm=comm_b,
        post=hw.scatter_add_seconds(int(cnt.send[r]), w) + grad_gemm,
    )
    return fwd, bwd


@dataclass(frozen=True)
class ShapeLayer:
    layer: int
    a: int
    b: int
    w: int
    p: float
    upd: bool
    extra: bool
    dtype_bytes: int


def _combine(phases: list[Phases], mode: str, k: int) -> tuple[float, float, list[float]]:
    """Seconds of one layer and direction over all ranks, the exposed wait, per-rank times."""
    if mode in ("leo", "leo-no-cache"):
        start = max(ph.pre for ph in phases)
        times = []
        for ph in phases:
            ready = ph.pre + ph.window + ph.post * (k - 1) / k
            times.append(max(ready, start + ph.comm) + ph.post / k)
        waits = [t - (ph.pre + ph.window + ph.post) for t, ph in zip(times, phases, strict=True)]
        return max(times), float(np.mean(waits)), times
    compute = max(ph.pre + ph.window for ph in phases)
    comm = max(ph.comm for ph in phases)
    post = max(ph.post for ph in phases)
    times = [compute + comm + post] * len(phases)
    return times[0], comm, times


def predict(
    profiles: list[PartProfile],
    caches: list[RankCache],
    shape: ModelShape,
    hw: HardwareProfile,
    mode: str,
    num_chunks: list[int],
) -> Prediction:
    """Predicted training-step time of `mode` (evaluation excluded, as epoch_time_s is)."""
    per_rank = [{"forward_s": 0.0, "backward_s": 0.0} for _ in profiles]
    stages = {"forward_s": 0.0, "backward_s": 0.0, "comm_wait_s": 0.0}
    for layer in range(shape.num_layers):
        a, b = shape.widths[layer], shape.widths[layer + 1]
        p = shape.input_dropout if layer == 0 else shape.dropout
        w = shape.exchanged_width(layer)
        sl = ShapeLayer(
            layer, a, b, w, p, w < a, shape.extra_gemm,
            shape.dtype_bytes,
        )  # fmt: skip
        if layer == 0 and p == 0 and caches and all(c.static_aggregate for c in caches):
            t = max(hw.gemm_seconds(pr.num_inner, a, b) for pr in profiles)
            stages["forward_s"] += t
            stages["backward_s"] += t
            continue
        k = num_chunks[layer] if mode in ("leo", "leo-no-cache") else 1
        cnt = _Counts(profiles, caches, layer, per_edge=mode == "fine-grained")
        pairs = [_layer_phases(pr, r, cnt, sl, hw, mode, k) for r, pr in enumerate(profiles)]
        for direction, idx in (("forward_s", 0), ("backward_s", 1)):
            total, wait, times = _combine([ph[idx] for ph in pairs], mode, k)
            stages[direction] += total
            stages["comm_wait_s"] += wait
            for r, t in enumerate(times):
                per_rank[r][direction] += t
    params = sum(a * b for a, b in zip(shape.widths, shape.widths[1:], strict=False))
    if len(profiles) > 1:
        stages["allreduce_s"] = hw.transfer_seconds(params * 4, len(profiles) - 1, "gloo")
    total = sum(v for key, v in stages.items() if key != "comm_wait_s")
    return Prediction(total, stages, per_rank)
