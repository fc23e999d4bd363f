"""The LEO cost model: predicted seconds of every stage of a training step, per rank and mode.

Per layer and direction, a rank's work splits into phases (`pre`, `window`, `comm`, `post`),
each a sum of named terms (dropout, gemm, pack, spmm, unpack, epilogue, comm, round, loss,
allreduce) priced with that rank's own rates from the hardware profile
(planner/profile/rates.py); each pipeline mode combines the phases into a layer's time.

Specification: docs/design/cost-model.md.
Legend: N inner rows, H halo rows exchanged, B boundary rows, S rows sent, R replicated rows,
E edges, a/b a layer's input/output width, w the width it exchanges, k chunks per peer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, cast

import numpy as np

from leo_cli.comm.aggregate import splits_update
from leo_cli.comm.exchange import FETCH_ROUND_BYTES
from leo_cli.comm.published import NUM_COPIES
from leo_cli.comm.shm import GRAD_COPIES
from leo_cli.errors import CacheError
from leo_cli.planner.access import PartAccess
from leo_cli.planner.plan import RankCache
from leo_cli.planner.profile.hardware import HardwareProfile, Link
from leo_cli.planner.profile.rates import Rates
from leo_cli.planner.reach import Reach
from leo_cli.registry import KEPT_DROPPED_BYTES, Mode, mode_of

SELF_TERM_PASSES = 2  # the self-loop term: a scaling and an addition, forward and backward
# Bias and ReLU with the next layer's dropout mask applied, one pass (leo::bias_relu_dropout;
# the last layer: its bias alone), forward and backward; drawing the mask is `dropout`. GAT
# adds its bias and applies ELU in a pass each (the last layer: the bias).
EPILOGUE_PASSES = 1
BIAS_ELU_PASSES = 2
LOSS_PASSES = 2  # the logits' gradient: zero-filled, then the training rows' written


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
    replicas nor a static aggregate apply (see planner/policy.py)."""
    rows: tuple[int, ...] = ()
    """Width of the row each layer computes (default: its output width; gat adds a score
    per head)."""
    halo_bytes: int = 0
    """Bytes of one element of a row as it travels, where rows are rounded to a narrower
    type (`pipeline.halo_dtype`); 0: not rounded."""
    halo_row_bytes: int = 0
    """Bytes a rounded row carries besides its elements (a power-of-two scale's exponent)."""
    halo_stochastic: bool = False
    """Rounded rows draw random bytes (int8's stochastic rounding)."""
    diagonal: bool = False
    """The self-loops are entries of the CSR's diagonal (GCN): one more inner edge per row in
    every aggregation, and no separate self-loop passes."""
    input_reads: tuple[int, int] = (1, 0)
    """How often a layer's backward reads its input, update-first and aggregate-first
    (registry.py `Conv.input_reads`): layer 0's dropped features are drawn again as often."""
    learnt_self_weight: bool = False
    """Each row adds a learnt multiple of itself to its aggregate (GIN's (1 + eps)·x): a layer
    0 the static aggregate serves makes that sum anew each step."""

    @property
    def admits_replicas(self) -> bool:
        """Replicas apply (planner/policy.py): neither attention nor rounded rows (the static
        aggregate needs no attention only: layer 0 then reads no row per step)."""
        return not self.attention and not self.halo_bytes

    def wire_row(self, width: int, gradient: bool = False) -> int:
        """Bytes of one row of `width` as it travels: rounded rows (and, but for attention,
        the output-gradient rows of the backward pass) in the narrow type; gradients
        otherwise in the training dtype."""
        if not self.halo_bytes or (gradient and self.attention):
            return width * self.dtype_bytes
        return width * self.halo_bytes + self.halo_row_bytes

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    def exchanged_width(self, layer: int) -> int:
        a = self.widths[layer]
        b = self.rows[layer] if self.rows else self.widths[layer + 1]
        return b if b < a else a


@dataclass(frozen=True)
class Phases:
    """Seconds of one rank in one layer and direction (see module docstring)."""

    pre: float
    window: float
    comm: float
    post: float


@dataclass
class Prediction:
    """Predicted step time of a mode and where it goes.

    `stages`: forward_s, backward_s (layers, waits included), comm_wait_s (exposed transfer
    and waiting, mean over ranks), loss_s, allreduce_s, and per term (`<term>_s`, the slowest
    rank's seconds of that term summed over layers and directions).
    `per_rank`: each rank's forward_s and backward_s (when it finishes each layer, summed),
    `step_s` (those, its loss gradient and the all-reduce) and `busy_s` (its own work: every
    term but transfers and waiting, what a faster rank finishes early).
    """

    epoch_time_s: float
    stages: dict[str, float]
    per_rank: list[dict[str, float]]


@dataclass(frozen=True)
class ShapeLayer:
    """One layer of the model: index, widths in/out/exchanged, dropout on its input."""

    layer: int
    a: int
    b: int
    w: int
    p: float
    upd: bool  # update-first: the GEMM runs before the exchange
    extra: bool
    last: bool
    row_bytes: int = 0  # bytes of an exchanged row as it travels forward
    grad_bytes: int = 0  # ... and of a gradient row backward
    rounded: bool = False  # rows rounded (pipeline.halo_dtype): read back wide
    keyed: bool = False  # stochastic rounding: random bytes drawn per element (int8)
    scaled: bool = False  # a power-of-two scale per row (int8, float16)
    diagonal: bool = False  # self-loops on the CSR's diagonal (ModelShape.diagonal)
    attention: bool = False  # gathers `[h | halo]`: halo gradients return as partial sums
    redraws: int = 0  # layer 0: the dropped features drawn again by the backward
    input_row_bytes: int = 0  # layer 0: bytes of a dropped feature row (kept when small)

    @property
    def fused(self) -> bool:
        """Bias, ReLU and the next mask in one pass (not GAT's bias and ELU)."""
        return not self.attention

    @property
    def input_needs_no_gradient(self) -> bool:
        """Aggregate-first layer 0: nothing upstream of its aggregation needs a gradient, so
        no halo gradient returns and no self-loop term runs backward."""
        return self.layer == 0 and not self.upd

    def served_by_static(self, static: bool) -> bool:
        """Layer 0 with no input dropout where every rank holds the static aggregate (`static`):
        no exchange and no SpMM, forward or backward."""
        return self.layer == 0 and self.p == 0 and static

    def gradient_rows(self, mode: Mode, in_place: bool = False) -> bool:
        """The backward reads the output gradient as rows (comm/aggregate.py backward_rows),
        as comm/modes.py's `make_aggregator` decides: rounded rows, rows read in place
        (`in_place`: some rank reads rows so), or a transport that moves gradients so;
        attention layers return partial sums."""
        as_rows = self.rounded or mode.wire.gradients_as_rows or in_place
        return as_rows and not self.attention


class _Counts:
    """Rows and edges a rank moves and aggregates at one layer, given every rank's cache.

    Computed from each part's totals and the rows its cache lists (replicas, rows fetched per
    edge), never from a pass over every halo row: the policy prices dozens of caches.
    `in_place[r, q]`: rows r reads in place from q's published rows (no transfer: their edges
    read the owner's memory; their gradients go back through it).
    """

    def __init__(
        self,
        accesses: list[PartAccess],
        caches: list[RankCache],
        layer: int,
        per_edge: bool,
        reach: Reach | None = None,
    ) -> None:
        num = len(accesses)
        reach = reach or Reach.none(num)
        every_rq = reach.every()
        rows = [
            _rank_counts(p, c, layer == 0, per_edge, reach.published[r], every_rq[r])
            for r, (p, c) in enumerate(zip(accesses, caches, strict=True))
        ]
        self.recv = np.array([x.recv for x in rows])  # recv[r, q]: rows r receives from q
        self.in_place = np.array([x.in_place for x in rows])
        self.halo_edges = np.array([x.halo_edges for x in rows])
        self.replica_edges = np.array([x.replica_edges for x in rows])
        self.replica_rows = np.array([x.replica_rows for x in rows])
        # edges reading a row fetched for them alone; edges reading a row in place
        self.per_edge_edges = np.array([x.per_edge_edges for x in rows])
        self.in_place_edges = np.array([x.in_place_edges for x in rows])
        self.send = self.recv.T.sum(axis=1)  # rows each rank sends (what its readers receive)
        self.read_in_place = self.in_place.sum(axis=1)  # rows each rank reads in place
        # Their gradients travel as rows unless some rank replicates rows (comm/levels.py).
        replicas = any(c.replica_rows.shape[0] for c in caches)
        self.in_place_rows_grads = bool(self.read_in_place.any()) and not replicas
        self.read_from = self.in_place.T.sum(axis=1)  # rows of each rank read in place
        self.publishes: np.ndarray = np.asarray((self.in_place > 0).any(axis=0))
        self.halo = self.recv.sum(axis=1)  # rows of each rank's exchanged halo buffer


class _RankCounts(NamedTuple):
    """One rank's row of `_Counts`."""

    recv: np.ndarray
    in_place: np.ndarray
    halo_edges: float
    replica_edges: float
    replica_rows: float
    per_edge_edges: float
    in_place_edges: float


T = TypeVar("T")
_memo: OrderedDict[tuple[object, ...], tuple[object, object, object]] | None = None
_memo_entries = 0  # rows and sums kept (each holds its cache alive); set by `counts_memo`


@contextlib.contextmanager
def counts_memo(num_ranks: int) -> Iterator[None]:
    """While the policy prices many caches that differ in one rank at a time, each rank's
    row is computed once per (part, cache, layer kind, mode kind, reach row), from sums
    made once per (part, cache); room for a few predictions' rows and sums of `num_ranks`
    ranks. Nested: the outer memo serves."""
    global _memo, _memo_entries
    if _memo is not None:
        yield
        return
    _memo, _memo_entries = OrderedDict(), 2 * (8 * num_ranks + 16)  # rows and sums
    try:
        yield
    finally:
        _memo = None


def _rank_counts(
    p: PartAccess, c: RankCache, first: bool, per_edge: bool, mine: np.ndarray, every: np.ndarray
) -> _RankCounts:
    """A rank's row of `_Counts` (memoised inside `counts_memo`)."""
    key = (id(p), id(c), first, per_edge, mine.tobytes(), every.tobytes())
    return _memoised(key, p, c, lambda: _count_rank(p, c, first, per_edge, mine, every))


def _memoised(key: tuple[object, ...], p: PartAccess, c: RankCache, make: Callable[[], T]) -> T:
    """`make()`, kept inside `counts_memo` under `key` (which names `p` and `c` by id: the
    entry holds them, so their ids name them while it lives)."""
    memo = _memo
    if memo is None:
        return make()
    if key in memo:
        memo.move_to_end(key)
        return cast(T, memo[key][2])
    found = make()
    memo[key] = (p, c, found)
    if len(memo) > _memo_entries:
        memo.popitem(last=False)
    return found


@dataclass(frozen=True)
class _CacheSums:
    """Per owner, a rank's replicated rows and L3 rows (all, and those not replicated) and
    the local edges reading them: what every layer and mode reads of one cache."""

    replica_rows: np.ndarray
    replica_edges: np.ndarray
    l3_rows: np.ndarray
    l3_edges: np.ndarray
    l3_kept_rows: np.ndarray  # L3 rows that are not replicas
    l3_kept_edges: np.ndarray


def _cache_sums(p: PartAccess, c: RankCache) -> _CacheSums:
    """The sums of `_CacheSums` (memoised inside `counts_memo`: a cache is priced for several
    layers, modes and reaches)."""
    return _memoised(("sums", id(p), id(c)), p, c, lambda: _sum_cache(p, c))


def _sum_cache(p: PartAccess, c: RankCache) -> _CacheSums:
    num = len(p.recv_counts)

    def per_owner(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        owner = p.owner_H[rows]
        counts = np.bincount(owner, minlength=num).astype(np.float64)
        return counts, np.bincount(owner, weights=p.reuse_H[rows], minlength=num)

    reps, l3 = c.replica_rows, c.l3_rows
    kept = l3[np.isin(l3, reps, invert=True, kind="table")] if l3.size and reps.size else l3
    return _CacheSums(*per_owner(reps), *per_owner(l3), *per_owner(kept))


def _count_rank(
    p: PartAccess, c: RankCache, first: bool, per_edge: bool, mine: np.ndarray, every_r: np.ndarray
) -> _RankCounts:
    """See `_Counts`: `first` is layer 0; `mine`/`every_r` the rank's row of the reach.
    Every count is a whole number held exactly in float64."""
    num = len(p.recv_counts)
    sums = _cache_sums(p, c)
    in_place, in_place_edges = np.zeros(num), 0.0
    l1_rows = sums.replica_rows if first else np.zeros(num)
    l1_edges = float(sums.replica_edges.sum()) if first else 0.0
    rows_q = np.asarray(p.recv_counts, dtype=np.float64)
    recv = rows_q - l1_rows
    per_edge_edges = 0.0
    if per_edge:  # every row not replicated comes once per reading edge; a replica
        # serves layer 0 and is exchanged once past it (an L2 row: assemble.every_row_l3)
        recv += p.reuse_per_owner - rows_q
        recv -= sums.replica_edges - sums.replica_rows
        per_edge_edges = p.halo_edges - float(sums.replica_edges.sum())
    elif c.l3_rows.size:  # listed rows once per reading edge, unless replicated
        rows, edges = (
            (sums.l3_kept_rows, sums.l3_kept_edges) if first else (sums.l3_rows, sums.l3_edges)
        )
        recv += edges - rows
        per_edge_edges = float(edges.sum())
    if mine.any():
        # Rows of a publishing owner read in place: every row (per-edge modes, or the
        # pairs of `every_row`) or the L3 rows, replicas excepted (policy.with_l3, unless
        # edited in); the rest travel.
        every = mine if per_edge else every_r
        replicas, rep_edges = sums.replica_rows, sums.replica_edges
        l3_edges = sums.l3_kept_edges
        read = np.where(every, rows_q - replicas, sums.l3_kept_rows)
        edges_q = np.where(every, p.reuse_per_owner - rep_edges, l3_edges)
        stay = replicas * (not first)  # exchanged past layer 0
        travel_q = np.where(every, stay, recv - l3_edges)
        in_place = np.where(mine, read, 0.0)
        in_place_edges = float(np.where(mine, edges_q, 0.0).sum())
        recv = np.where(mine, travel_q, recv)
        if per_edge:
            others = p.reuse_per_owner - rep_edges  # replicas travel once (L2)
            per_edge_edges = float(np.where(mine, 0.0, others).sum())
        else:  # L3 rows of a publishing owner are read in place, either way
            per_edge_edges -= float(l3_edges[mine].sum())
    l1_count = float(c.replica_rows.shape[0]) if first else 0.0
    return _RankCounts(
        recv, in_place, p.halo_edges - l1_edges, l1_edges, l1_count, per_edge_edges,
        in_place_edges,
    )  # fmt: skip


Terms = dict[str, float]


def _spmm(hw: Rates, edges: float, w: int, rows_read: float, out_rows: float,
          backward: bool = False) -> float:  # fmt: skip
    """An SpMM over `edges` reading rows of a (rows_read x w) matrix, writing (out_rows x w)."""
    if edges <= 0:
        return 0.0
    read_bytes = rows_read * w * hw.dtype_bytes
    return hw.spmm_seconds(edges, w, backward, read_bytes) + hw.pass_seconds(out_rows, w)


def _dense(hw: Rates, n: int, sl: ShapeLayer, backward: bool, self_width: int) -> Terms:
    """Dropout, GEMMs and the epilogue of one rank's layer (no aggregation, no exchange);
    `self_width`: width of the self-loop term (0: none)."""
    a, b = sl.a, sl.b
    gemms = 2 if sl.extra else 1
    passes = EPILOGUE_PASSES if sl.fused else BIAS_ELU_PASSES - sl.last
    epilogue = hw.pass_seconds(n, b) * passes
    epilogue += hw.pass_seconds(n, self_width) * SELF_TERM_PASSES if self_width else 0.0
    if not backward:
        drop = hw.mask_seconds(n, a) if sl.p > 0 else 0.0
        return {"dropout": drop, "gemm": gemms * hw.gemm_seconds(n, a, b), "epilogue": epilogue}
    drop = hw.mask_seconds(n, a, backward=True) if sl.p > 0 and sl.layer > 0 else 0.0
    # Layer 0: its dropped features are drawn again wherever the backward reads them, unless
    # the copy is small enough to be kept (registry.py `KEPT_DROPPED_BYTES`).
    redraws = sl.redraws if n * sl.input_row_bytes >= KEPT_DROPPED_BYTES else 0
    drop += redraws * hw.mask_seconds(n, a) if sl.p > 0 and sl.layer == 0 else 0.0
    grads = 2 if sl.layer > 0 else 1  # weight gradient; input gradient past layer 0
    return {"dropout": drop, "gemm": gemms * grads * hw.gemm_seconds(n, a, b), "epilogue": epilogue}


def _self_width(sl: ShapeLayer, backward: bool) -> int:
    """Width of the self-loop term's passes; none backward where no gradient needs it, and
    none where the self-loops are CSR entries (priced with the inner SpMM)."""
    if sl.diagonal or (backward and sl.input_needs_no_gradient):
        return 0
    return sl.w


def _blocks(hw: Rates, count: float, edges: float, w: int, rows_read: float,
            out_rows: float, backward: bool = False) -> float:  # fmt: skip
    """`count` SpMMs over column blocks sharing `edges`, `rows_read` and `out_rows` evenly."""
    if count <= 0 or edges <= 0:
        return 0.0
    return count * _spmm(hw, edges / count, w, rows_read / count, out_rows / count, backward)


def _in_place_factor(hw: Rates, cnt: _Counts, r: int) -> float:
    """What reading rows in place multiplies the halo blocks' SpMM by: the share of their
    edges that read in place, at the measured slowdown of such reads."""
    if cnt.in_place_edges[r] <= 0 or cnt.halo_edges[r] <= 0:
        return 1.0
    share = min(1.0, float(cnt.in_place_edges[r] / cnt.halo_edges[r]))
    return 1.0 + share * (hw.in_place_slowdown() - 1.0)


def _replica_terms(
    hw: Rates, r: int, cnt: _Counts, sl: ShapeLayer, n: int, backward: bool
) -> Terms:
    """Layer 0's replicated columns: forward, their masks, aggregation at input width, GEMM
    and the out-of-place add into the layer's rows; backward, the weight gradient of that
    GEMM and its rows' gradients gathered."""
    rows = min(cnt.replica_edges[r], n)  # rows reading a replica (at most every row)
    if cnt.replica_rows[r] == 0:
        return {}
    if backward:
        return {"gemm": hw.gemm_seconds(rows, sl.a, sl.b), "pack": hw.gather_seconds(rows, sl.b)}
    return {
        "dropout": hw.mask_seconds(cnt.replica_rows[r], sl.a) if sl.p > 0 else 0.0,
        "spmm": _spmm(hw, cnt.replica_edges[r], sl.a, cnt.replica_rows[r], rows),
        "gemm": hw.gemm_seconds(rows, sl.a, sl.b),
        "unpack": hw.scatter_add_seconds(rows, sl.b) + hw.pass_seconds(n, sl.b),
    }


def _add(*parts: Terms) -> Terms:
    out: Terms = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


@dataclass(frozen=True)
class _Split:
    """Named terms of each phase of one rank's layer and direction."""

    pre: Terms
    window: Terms
    comm: float
    post: Terms

    def phases(self) -> Phases:
        return Phases(
            sum(self.pre.values()), sum(self.window.values()), self.comm, sum(self.post.values())
        )

    def terms(self) -> Terms:
        return _add(self.pre, self.window, self.post, {"comm": self.comm})


def _comm(
    hw: Rates,
    r: int,
    cnt: _Counts,
    row: int,
    mode: Mode,
    k: int,
    written: float,
    backward: bool = False,
) -> float:
    """Transfer seconds of rank r at one layer and direction, by the mode's transport (see
    the module docstring); `written`: rows a shared segment receives."""
    num = cnt.recv.shape[0]
    wire = mode.wire
    if not wire.moves_rows or num == 1:
        return 0.0
    incoming = cnt.recv[:, r] if backward else cnt.recv[r]  # rows arriving from each peer
    if wire.transfer == "per-peer":  # no message where no row moves (comm/exchange.py)
        hosts = hw.hosts()
        if hosts is not None and len(hosts) != num:
            raise CacheError(
                f"The hardware profile was measured with {len(hosts)} workers on several hosts "
                f"but the run has {num}; probe again with the run's workers."
            )
        if hosts is not None:
            return _across_hosts(hw, r, cnt.recv.T if backward else cnt.recv, row, k, hosts)
        link: Link = "gloo"
        return max(hw.transfer_seconds(rows * row, k, link) if rows > 0 else 0.0
                   for rows in incoming)  # fmt: skip
    if wire.transfer == "segment":
        # the rows' one copy: a barrier before writing and one after (comm/shm.py); the
        # partial sums' two copies (attention layers' backward): one
        barriers = 1 if backward else 2
        return hw.transfer_seconds(written * row, 1, "shm") + barriers * hw.barrier_seconds()
    busiest = max(max(cnt.halo), max(cnt.send))  # everyone waits for it
    return hw.alltoall_seconds(busiest * row)


def _across_hosts(hw: Rates, r: int, recv: np.ndarray, row: int, k: int, hosts: list[str]) -> float:
    """Per-peer transfers of rank r when the workers span several hosts (`recv[a, b]`: rows a
    receives from b in this direction): its same-host peers' rows at their pair's rate; the rows
    crossing its node's link, in and out for every rank of the node at once, at the link's
    rate (a pair measured alone): the node's last byte is what its ranks wait for."""
    mine = [q for q in range(len(hosts)) if hosts[q] == hosts[r]]
    local = max([hw.transfer_seconds(recv[r, q] * row, k, pair=(r, q)) for q in mine
                 if q != r and recv[r, q] > 0], default=0.0)  # fmt: skip
    others = [q for q in range(len(hosts)) if hosts[q] != hosts[r]]
    into = sum(float(recv[a, q]) for a in mine for q in others) * row
    out_of = sum(float(recv[q, a]) for a in mine for q in others) * row
    if into + out_of == 0:
        return local
    link = hw.cross_host_fit()
    remote = max(into, out_of) / link.bandwidth_bytes_per_s + k * link.latency_s
    return max(local, remote)


def _halo_buffer_terms(hw: Rates, mode: Mode, rows: float, w: int) -> float:
    """What a mode pays to turn `rows` arriving rows into a buffer the blocks read: a shared
    segment is read out, no transport writes zeros; the others receive them in place (their
    fresh buffer is priced with the transfer)."""
    if mode.wire.reads_out:
        return hw.gather_seconds(rows, w)
    if mode.wire.fills_zeros:
        return hw.pass_seconds(rows, w)
    return 0.0


def _forward(
    hw: Rates, p: PartAccess, r: int, cnt: _Counts, sl: ShapeLayer, mode: Mode, k: int
) -> _Split:
    """Forward terms of rank r at one layer: every mode aggregates the inner block and one
    block per peer and chunk; modes differ in packing, transfer and overlap."""
    n, w, halo = p.num_inner, sl.w, cnt.halo[r]
    bnd = min(p.num_boundary, n)
    dense = _dense(hw, n, sl, backward=False, self_width=_self_width(sl, backward=False))
    gemm = dense.pop("gemm")
    # boundary-first (comm/aggregate.py splits_update); a pipeline that does not split
    # updates every row before any leaves
    split = mode.overlap and sl.upd and splits_update(n, bnd)
    whole = mode.overlap and not split
    update_pre = (gemm if whole else gemm * bnd / max(n, 1)) if sl.upd else 0.0
    update_window = gemm - update_pre if sl.upd else 0.0
    pack = 0.0
    if mode.wire.packs:
        pack = hw.gather_seconds(cnt.send[r], w) + hw.fresh_seconds(cnt.send[r], w)
    if split:  # x rows gathered, h rows placed
        pack += hw.gather_seconds(n, sl.a) + hw.gather_seconds(n, w)
    if cnt.publishes[r]:  # its boundary rows copied where same-host readers map them
        pack += hw.pass_seconds(bnd, w)
    rows = p.rows_reading_blocks(k)
    inner_spmm = _spmm(hw, p.inner_edges + n * sl.diagonal, w, n, n)
    read = halo + cnt.read_in_place[r]  # rows the halo edges read, here or in place
    halo_spmm = _blocks(hw, p.num_blocks(k), cnt.halo_edges[r], w, read, rows)
    halo_spmm *= _in_place_factor(hw, cnt, r)
    unpack = hw.scatter_add_seconds(rows, w) + _halo_buffer_terms(hw, mode, halo, w)
    pre = {"dropout": dense.pop("dropout"), "gemm": update_pre, "pack": pack}
    replicas = _replica_terms(hw, r, cnt, sl, n, backward=False)
    overlap = mode.overlap
    window = _add({"gemm": update_window, "spmm": inner_spmm * overlap}, replicas)
    post = {"spmm": halo_spmm + inner_spmm * (not overlap), "unpack": unpack}
    post["gemm"] = gemm * (not sl.upd)
    if sl.rounded:  # rows sent rounded, read back wide (inner ones and arrivals)
        pre["round"] = _encode_seconds(hw, sl, bnd if split else n)
        window["round"] = (  # split: the interior rows, the boundary ones were sent
            _encode_seconds(hw, sl, n - bnd) * split + _decode_seconds(hw, sl, n)
        ) * overlap
        post["round"] = _decode_seconds(hw, sl, n) * (not overlap) + _decode_seconds(hw, sl, halo)
    comm = _comm(hw, r, cnt, sl.row_bytes, mode, k, written=n)
    if comm > 0 and mode.wire.receives_fresh:  # the rows land in a fresh buffer
        comm += hw.fresh_seconds(halo, w)
    return _Split(pre, window, comm, _add(post, dense))


def _backward(
    hw: Rates, p: PartAccess, r: int, cnt: _Counts, sl: ShapeLayer, mode: Mode, k: int
) -> _Split:
    """Backward terms of rank r at one layer (the forward's mirror)."""
    n, w, halo = p.num_inner, sl.w, cnt.halo[r]
    dense = _dense(hw, n, sl, backward=True, self_width=_self_width(sl, backward=True))
    if sl.input_needs_no_gradient:
        return _Split({"epilogue": dense.pop("epilogue")}, {}, 0.0, dense)
    if sl.gradient_rows(mode, cnt.in_place_rows_grads):
        return _backward_rows(hw, p, r, cnt, sl, mode, k, dense)
    rows = p.rows_reading_blocks(k)
    pre: Terms = {"epilogue": dense.pop("epilogue")}
    read = halo + cnt.read_in_place[r]
    pre["spmm"] = _blocks(hw, p.num_blocks(k), cnt.halo_edges[r], w, rows, read, backward=True)
    pre["pack"] = hw.gather_seconds(rows, w)  # each block's rows of the gradient
    pre["pack"] += hw.pass_seconds(cnt.read_in_place[r], w)  # published for their owners
    if mode.wire.gradient_buffer:  # one buffer for the collective
        pre["pack"] += hw.pass_seconds(halo, w)
    inner_spmm = _spmm(hw, p.inner_edges + n * sl.diagonal, w, n, n, backward=True)
    overlap = mode.overlap
    window: Terms = {"spmm": inner_spmm} if overlap else {}
    unpack = hw.scatter_add_seconds(cnt.send[r], w)  # added into their owners' rows
    unpack += (  # what in-place readers published, read from their segments
        hw.scatter_add_seconds(cnt.read_from[r], w) * hw.in_place_slowdown()
    )
    unpack += _halo_buffer_terms(hw, mode, cnt.send[r], w)
    comm = _comm(hw, r, cnt, sl.grad_bytes, mode, k, written=halo, backward=True)
    if comm > 0 and mode.wire.receives_fresh:  # the gradients land in a fresh buffer
        comm += hw.fresh_seconds(cnt.send[r], w)
    replicas = _replica_terms(hw, r, cnt, sl, n, backward=True)
    post = {"unpack": unpack, "spmm": inner_spmm * (not overlap)}
    return _Split(pre, window, comm, _add(post, dense, replicas))


SCALED_PASSES = 6  # |x|, its row maximum, the scaling, adding the draws or rounding, packing


def _encode_seconds(hw: Rates, sl: ShapeLayer, rows: float) -> float:
    """Seconds to round `rows` rows for the wire (`pipeline.halo_dtype`): one conversion; a
    scale per row takes a few passes more, and int8 draws a random byte per element (priced
    as a dropout mask)."""
    seconds = hw.pass_seconds(rows, sl.w) * (SCALED_PASSES if sl.scaled else 1)
    return seconds + (hw.mask_seconds(rows, sl.w) if sl.keyed else 0.0)


def _decode_seconds(hw: Rates, sl: ShapeLayer, rows: float) -> float:
    """Seconds to read `rows` rounded rows back in the training dtype (and times a scale)."""
    return hw.pass_seconds(rows, sl.w) * (2 if sl.scaled else 1)


def _backward_rows(
    hw: Rates,
    p: PartAccess,
    r: int,
    cnt: _Counts,
    sl: ShapeLayer,
    mode: Mode,
    k: int,
    dense: Terms,
) -> _Split:
    """Backward terms where the gradient is read as rows (rounded rows, rows read in place;
    a transport that moves gradients as rows: comm/aggregate.py backward_rows): the
    forward's exchange and aggregation, over the output gradient (rounded where rows are)."""
    n, w, halo = p.num_inner, sl.w, cnt.halo[r]
    rows = p.rows_reading_blocks(k)
    pre: Terms = {"epilogue": dense.pop("epilogue")}
    pre["pack"] = 0.0
    if mode.wire.packs:
        pre["pack"] = hw.gather_seconds(cnt.send[r], w) + hw.fresh_seconds(cnt.send[r], w)
    if cnt.publishes[r]:  # its boundary rows of the gradient, published as the forward's
        pre["pack"] += hw.pass_seconds(min(p.num_boundary, n), w)
    inner_spmm = _spmm(hw, p.inner_edges + n * sl.diagonal, w, n, n)
    read = halo + cnt.read_in_place[r]  # rows the halo edges read, here or in place
    halo_spmm = _blocks(hw, p.num_blocks(k), cnt.halo_edges[r], w, read, rows)
    halo_spmm *= _in_place_factor(hw, cnt, r)
    unpack = hw.scatter_add_seconds(rows, w) + _halo_buffer_terms(hw, mode, halo, w)
    overlap = mode.overlap
    window: Terms = {"spmm": inner_spmm * overlap}
    post = {"spmm": halo_spmm + inner_spmm * (not overlap), "unpack": unpack}
    if sl.rounded:  # the gradient rows rounded, read back wide (inner ones and arrivals)
        inner_round = _decode_seconds(hw, sl, n)
        pre["round"] = _encode_seconds(hw, sl, n)
        window["round"] = inner_round * overlap
        post["round"] = inner_round * (not overlap) + _decode_seconds(hw, sl, halo)
    comm = _comm(hw, r, cnt, sl.grad_bytes, mode, k, written=n)
    if comm > 0 and mode.wire.receives_fresh:  # the rows land in a fresh buffer
        comm += hw.fresh_seconds(halo, w)
    return _Split(pre, window, comm, _add(post, dense))


def _static_layer(hw: Rates, p: PartAccess, sl: ShapeLayer) -> tuple[Terms, Terms]:
    """Layer 0 over the precomputed `Â·X` (L1s): no exchange, no SpMM, no dropout; the
    self-loop term is added at input width (but where the aggregate holds it: `diagonal`),
    and no gradient flows back through it."""
    n = p.num_inner
    return (
        _dense(hw, n, sl, backward=False, self_width=0 if sl.diagonal else sl.a),
        _dense(hw, n, sl, backward=True, self_width=0),
    )


def _combine(phases: list[Phases], mode: Mode, k: int, overlap: float) -> tuple[float, list[float]]:
    """Seconds of one layer and direction over all ranks, and each rank's finish time."""
    if mode.overlap:
        start = max(ph.pre for ph in phases)
        times = []
        for ph in phases:
            local_end = ph.pre + ph.window + ph.post * (k - 1) / k
            comm_end = start + ph.comm
            shared = max(0.0, min(local_end, comm_end) - start)
            times.append(max(local_end, comm_end) + (1 - overlap) * shared + ph.post / k)
        return max(times), times
    compute = max(ph.pre + ph.window for ph in phases)
    total = compute + max(ph.comm for ph in phases) + max(ph.post for ph in phases)
    return total, [total] * len(phases)


def _shape_layer(shape: ModelShape, layer: int) -> ShapeLayer:
    a, b = shape.widths[layer], shape.widths[layer + 1]
    p = shape.input_dropout if layer == 0 else shape.dropout
    last = layer == shape.num_layers - 1
    w = shape.exchanged_width(layer)
    rounded = shape.halo_bytes > 0
    return ShapeLayer(
        layer, a, b, w, p, w < a, shape.extra_gemm, last,
        shape.wire_row(w), shape.wire_row(w, gradient=True), rounded,
        shape.halo_stochastic, shape.halo_row_bytes > 0, shape.diagonal, shape.attention,
        shape.input_reads[0 if w < a else 1] if layer == 0 else 0, a * shape.dtype_bytes,
    )  # fmt: skip


def _every_static(caches: list[RankCache]) -> bool:
    """Every rank holds the static aggregate (layer 0 then needs no exchange)."""
    return bool(caches) and all(c.static_aggregate for c in caches)


def predict(
    accesses: list[PartAccess],
    caches: list[RankCache],
    shape: ModelShape,
    profile: HardwareProfile,
    mode_name: str,
    num_chunks: list[int],
    reach: Reach | None = None,
) -> Prediction:
    """Predicted training-step time of a mode (evaluation excluded, as epoch_time_s is);
    `reach`: the rows read in place (default: none, every row through the mode's transport)."""
    mode = mode_of(mode_name)
    hw = Rates(profile)  # the machine as a whole: overlap, the weight all-reduce
    own = [Rates(profile, r) for r in range(len(accesses))]  # each rank's own rates
    num = len(accesses)
    per_rank = [{"forward_s": 0.0, "backward_s": 0.0} for _ in accesses]
    stages = {"forward_s": 0.0, "backward_s": 0.0, "comm_wait_s": 0.0}
    rank_terms: list[Terms] = [{} for _ in accesses]
    static = _every_static(caches)
    for layer in range(shape.num_layers):
        sl = _shape_layer(shape, layer)
        if sl.served_by_static(static):
            pairs = [_static_layer(own[r], pr, sl) for r, pr in enumerate(accesses)]
            for direction, idx in (("forward_s", 0), ("backward_s", 1)):
                times = [sum(terms[idx].values()) for terms in pairs]
                stages[direction] += max(times)
                for r, t in enumerate(times):
                    per_rank[r][direction] += t
                    rank_terms[r] = _add(rank_terms[r], pairs[r][idx])
            continue
        k = num_chunks[min(layer, len(num_chunks) - 1)] if mode.chunks else 1
        cnt = _Counts(
            accesses, caches, layer, mode.per_edge_rows, reach if mode.reads_in_place else None
        )
        for direction, build in (("forward_s", _forward), ("backward_s", _backward)):
            splits = [build(own[r], pr, r, cnt, sl, mode, k) for r, pr in enumerate(accesses)]
            phases = [s.phases() for s in splits]
            total, times = _combine(phases, mode, k, hw.overlap_share())
            stages[direction] += total
            for r, (t, s, ph) in enumerate(zip(times, splits, phases, strict=True)):
                per_rank[r][direction] += t
                rank_terms[r] = _add(rank_terms[r], s.terms())
                stages["comm_wait_s"] += (t - ph.pre - ph.window - ph.post) / num
    classes = shape.widths[-1]
    losses = [
        own[r].pass_seconds(pr.num_inner, classes) * LOSS_PASSES for r, pr in enumerate(accesses)
    ]
    stages["loss_s"] = max(losses)
    if num > 1:
        params = sum(a * b for a, b in zip(shape.widths, shape.widths[1:], strict=False))
        stages["allreduce_s"] = hw.transfer_seconds(params * hw.dtype_bytes, num - 1, "gloo")
    for r, mine in enumerate(per_rank):
        mine["busy_s"] = sum(v for k, v in rank_terms[r].items() if k != "comm") + losses[r]
        mine["step_s"] = mine["forward_s"] + mine["backward_s"] + losses[r]
        mine["step_s"] += stages.get("allreduce_s", 0.0)
    total = sum(v for key, v in stages.items() if key != "comm_wait_s")
    for name in sorted({t for terms in rank_terms for t in terms}):
        stages[f"{name}_s"] = max(terms.get(name, 0.0) for terms in rank_terms)
    stages = {key: float(v) for key, v in stages.items()}
    per_rank = [{key: float(v) for key, v in times.items()} for times in per_rank]
    return Prediction(float(total), stages, per_rank)


INDEX_BYTES = 4  # an index of a block's CSR: int32 where it fits (kernels/csr.py)
POSITION_BYTES = 8  # an int64 row list (chunks' send positions, rows read out, interior rows)


@dataclass(frozen=True)
class Buffers:
    """Bytes each rank of a mode holds beyond what every mode holds, at its peak (`total`:
    `shm` and the larger of two phases, set-up making the static aggregate with `setup`
    beside it, or the steps with `kept` + `structures` + `lift`), and of what:

    - `kept`: the replicas' input rows;
    - `shm`: mapped from /dev/shm (a shared-memory segment's rows, published rows);
    - `structures`: the column blocks and row lists its aggregator keeps for the run;
    - `moving`: the rows moving in its largest phase (a layer's exchange, one direction);
    - `lift`: what the largest phase adds to the step's peak, above the activations every
      mode holds: its moving rows, and the replicas' rows a step makes;
    - `setup`: what set-up holds beside the static aggregate's inputs: the part's CSR's
      transpose, a per-edge mode's list of every halo row.
    """

    total: list[int]
    shm: list[int]
    kept: list[int] = dataclasses.field(default_factory=list)
    structures: list[int] = dataclasses.field(default_factory=list)
    moving: list[int] = dataclasses.field(default_factory=list)
    lift: list[int] = dataclasses.field(default_factory=list)
    setup: list[int] = dataclasses.field(default_factory=list)


def buffer_bytes(
    accesses: list[PartAccess],
    caches: list[RankCache],
    shape: ModelShape,
    mode_name: str,
    reach: Reach | None = None,
) -> list[int]:
    """`mode_buffers(...).total`: bytes each rank of a mode holds in its buffers."""
    return mode_buffers(accesses, caches, shape, mode_name, reach).total


def mode_buffers(
    accesses: list[PartAccess],
    caches: list[RankCache],
    shape: ModelShape,
    mode_name: str,
    reach: Reach | None = None,
) -> Buffers:
    """Bytes each rank of a mode holds at its peak beyond what every mode holds there, as
    comm/ allocates them, and which of them are mapped from /dev/shm (see `Buffers`).

    The larger of two phases, each against the same phase of a mode holding nothing of its
    own: set-up making the static aggregate (its inputs beside the part's CSR, with the
    CSR's transpose unless the views of rows read in place replace it, and a per-edge mode's
    list of every halo row), or the steps: the activations' peak, the replicas' input rows
    (L1), the aggregator's column blocks and row lists (`_structure_bytes`: their CSRs,
    transposed where halo gradients return as partial sums; both views' where replicas give
    layer 0 a view of its own, and the replicas' block), and the largest phase's own rows on
    top of that peak: the rows moving in one phase (a layer's exchange, forward or backward;
    none at a layer 0 the static aggregate serves, no gradients back from an aggregate-first
    layer 0: rows packed to send and received, per reading edge for per-edge rows, the halo
    gradients and those returned unless gradients move as rows, or one peer's rows read out
    of a segment at a time) and what a step makes of the replicas (`_replica_step_bytes`).
    The phases' activations are too close to tell which one peaks, so those rows count whole,
    not only where they lift `_activations`' largest phase. On top, whatever the phase, the
    segments reserved in /dev/shm at the widest exchanged width: a shared-memory segment's
    rows (its share: the rank's inner rows; attention adds the halo gradients' copy), and
    where any rank reads rows in place, every rank's published rows (`NUM_COPIES` of its
    boundary rows; their gradients travel as rows through them, or, where some rank
    replicates rows, as partial sums beside them).

    `reach`: the rows read in place (default: none). An estimate for ranking modes by memory
    (`pipeline.auto_margin`), not a worker's memory: what every mode holds alike (the graph,
    features, activations, weights) is left out, and so are allocator slack and set-up's
    other phases."""
    mode = mode_of(mode_name)
    num = len(accesses)
    static = _every_static(caches)
    widest = _widest_exchanged(shape, static)
    kept = [c.replica_rows.shape[0] * shape.widths[0] * shape.dtype_bytes for c in caches]
    shm = [0] * num
    if mode.wire.transfer == "segment":
        for r, p in enumerate(accesses):
            shm[r] += p.num_inner * shape.wire_row(widest)
            if shape.attention:  # halo gradients return as partial sums through a segment
                shm[r] += GRAD_COPIES * p.num_halo * widest * shape.dtype_bytes
    lift_phase = [0] * num
    moving = [0] * num
    structures = [0] * num
    read_in_place = np.zeros(num)
    two_views = _two_views(mode, caches, shape, static)
    views = [[0, 0] for _ in accesses]  # per rank, the halo part of layer 0's view and the rest's
    for layer in range(shape.num_layers):
        sl = _shape_layer(shape, layer)
        if sl.served_by_static(static):
            continue
        cnt = _Counts(
            accesses, caches, layer, mode.per_edge_rows, reach if mode.reads_in_place else None
        )
        read_in_place = np.maximum(read_in_place, cnt.read_in_place)
        as_rows = sl.gradient_rows(mode, cnt.in_place_rows_grads)
        for r, p in enumerate(accesses):
            forward = _layer_buffers(mode, cnt, r, sl.row_bytes)
            if sl.input_needs_no_gradient:
                backward = 0
            elif as_rows:
                backward = _layer_buffers(mode, cnt, r, sl.grad_bytes)
            elif mode.wire.gradient_buffer:  # comm/transport.py halo_grads: the buffer
                # and one chunk's gradient (one chunk a peer), then those of its own rows
                chunk = max(float(cnt.send[r]), float(cnt.recv[r].max(initial=0.0)))
                backward = int(cnt.halo[r] + chunk) * sl.grad_bytes
            elif mode.wire.moves_rows:  # the halo gradients, and those of its own rows
                backward = int(cnt.halo[r] + cnt.send[r]) * sl.grad_bytes
            else:
                backward = 0
            dropped, saved = _replica_step_bytes(p, caches[r], shape, static)
            ahead = dropped + (saved if layer else 0)  # the forward: the dropped rows too
            lift_phase[r] = max(lift_phase[r], forward + ahead, backward + saved, saved)
            moving[r] = max(moving[r], forward, backward)
            held = _structure_bytes(p, cnt, r, mode, shape, transpose=not as_rows)
            if two_views:  # one aggregator per view: the halo parts of both are held
                own = _view_bytes(p, cnt, r, mode, not as_rows, shape.dtype_bytes)
                views[r][min(layer, 1)] = own
                held = held - own + sum(views[r]) + _replica_block_bytes(p, caches[r], shape)
            structures[r] = max(structures[r], held)
    if read_in_place.any():  # comm/inplace.py build_in_place: every rank's segment
        row = widest * shape.dtype_bytes
        replicas = any(c.replica_rows.shape[0] for c in caches)
        for r, p in enumerate(accesses):  # its published rows, and the gradients of the
            # rows it reads unless they travel as rows (no replicas: comm/levels.py)
            read = int(read_in_place[r]) if replicas else 0
            shm[r] += NUM_COPIES * (p.num_boundary + read) * row
    total, setup, lift = [], [], []
    for r, p in enumerate(accesses):
        steps = _activation_peak(shape, p.num_inner, static) + static * _static_bytes(p, shape)
        lift.append(lift_phase[r])
        fetch = static * _fetch_bytes(p, shape)  # the static aggregate's inputs, made first
        csr = _part_csr_bytes(p, shape)
        reads = mode.reads_in_place and bool(read_in_place[r])
        alone = reads and not caches[r].replica_rows.shape[0] and not shape.attention
        listed = _listed_bytes(p, mode, caches[r].replica_rows.shape[0])
        setup.append((0 if alone else _transpose_bytes(p, shape)) + listed)
        training = steps + kept[r] + structures[r] + lift[r]
        common = max(fetch + csr, steps)  # the peak of a mode holding nothing of its own
        total.append(shm[r] + max(fetch + csr + setup[r], training) - common)
    return Buffers(total, shm, kept, structures, moving, lift, setup)


def _widest_exchanged(shape: ModelShape, static: bool) -> int:
    """The width segments are reserved at (worker/assemble.py `exchange_width`): the widest
    row a layer exchanges, leaving out a layer 0 the static aggregate serves (`static`)
    unless it is the only layer."""
    layers = [
        layer
        for layer in range(shape.num_layers)
        if not _shape_layer(shape, layer).served_by_static(static)
    ]
    return max(shape.exchanged_width(layer) for layer in layers or [0])


def _static_bytes(p: PartAccess, shape: ModelShape) -> int:
    """Bytes of the static aggregate `Â·X` (comm/levels.py), kept for the run."""
    return p.num_inner * shape.widths[0] * shape.dtype_bytes


def _fetch_bytes(p: PartAccess, shape: ModelShape) -> int:
    """Bytes alive while set-up makes the static aggregate (comm/levels.py
    `static_aggregate`): `[x | halo]`, the halo's input rows fetched into it, beside the
    larger of one round of the fetch (comm/exchange.py `fetch_halo`: the rows sent, their
    positions, the rows received, each about `FETCH_ROUND_BYTES` at most) and the aggregate
    it then makes."""
    row = shape.widths[0] * shape.dtype_bytes
    sent = min(sum(p.send_counts) * row, FETCH_ROUND_BYTES)
    fetched = sent + sent // row * POSITION_BYTES + min(p.num_halo * row, FETCH_ROUND_BYTES)
    return (p.num_inner + p.num_halo) * row + max(fetched, p.num_inner * row)


def _part_csr_bytes(p: PartAccess, shape: ModelShape) -> int:
    """Bytes of the part's CSR built forward-only (models/local_graph.py): pointers, and
    every edge's column and weight (the self-loops too where they are entries)."""
    edges = p.inner_edges + p.num_inner * shape.diagonal + p.halo_edges
    return (p.num_inner + 1) * INDEX_BYTES + edges * (INDEX_BYTES + shape.dtype_bytes)


def _transpose_bytes(p: PartAccess, shape: ModelShape) -> int:
    """Bytes the part's CSR adds with its transpose (pointers, rows and positions), which
    it is built with unless the views of rows read in place replace it (worker/assemble.py
    `views_leave_the_part`)."""
    edges = p.inner_edges + p.num_inner * shape.diagonal + p.halo_edges
    return (p.num_inner + p.num_halo + 1) * INDEX_BYTES + 2 * edges * INDEX_BYTES


LISTED_ROW_BYTES = POSITION_BYTES  # a halo row listed as L3: its int64 position


def _listed_bytes(p: PartAccess, mode: Mode, replicas: int = 0) -> int:
    """Bytes of the halo rows a per-edge mode lists as L3 rows, every one but its `replicas`
    (worker/assemble.py `every_row_l3`), held while set-up makes the static aggregate: the
    tensor of their positions (the mark it is made from is freed before)."""
    return (p.num_halo - replicas) * LISTED_ROW_BYTES if mode.per_edge_rows else 0


def _layer_buffers(mode: Mode, cnt: _Counts, r: int, row: int) -> int:
    """Bytes of rank r's buffers in one direction of one layer (`buffer_bytes`)."""
    wire = mode.wire
    rows = cnt.send[r] if wire.packs else 0.0
    if wire.receives_fresh or wire.fills_zeros:
        rows += cnt.halo[r]
    if wire.reads_out:  # read out one peer's rows at a time (comm/shm.py ReadOut)
        rows += float(cnt.recv[r].max(initial=0.0))
    return int(rows) * row


def _structure_bytes(
    p: PartAccess, cnt: _Counts, r: int, mode: Mode, shape: ModelShape, transpose: bool
) -> int:
    """Bytes of what rank r's aggregator keeps for the run at one layer's counts, as
    comm/blocks.py and comm/inplace.py build it: the inner column block, a block per peer
    of the rows that travel (compact: the rows reading them), a forward-only CSR per owner
    of the rows read in place, each CSR's transpose where halo gradients return as partial
    sums (`transpose`; each in arrays of its own), and the row lists: rows sent (the plan's
    and the chunks' positions), a segment's rows read out (`halo_rows_H`), rows read in
    place (their positions), rows published (theirs, their positions, each reader's) and
    the pipeline's interior rows."""
    n, value = p.num_inner, shape.dtype_bytes
    edge = INDEX_BYTES + value  # an edge's column (or row) and its weight
    inner_edges = p.inner_edges + n * shape.diagonal
    per_csr = 2 if transpose else 1
    held = per_csr * ((n + 1) * INDEX_BYTES + inner_edges * edge)  # the inner block
    held += _view_bytes(p, cnt, r, mode, transpose, value)
    owners = int((cnt.in_place[r] > 0).sum())
    if owners:  # one forward-only CSR over every inner row per owner, and the rows' positions
        held += owners * (n + 1) * INDEX_BYTES + int(cnt.in_place_edges[r] * edge)
        held += int(cnt.read_in_place[r]) * POSITION_BYTES
    if cnt.publishes[r]:  # its published rows, where they sit among its boundary rows, and
        # the rows each reader reads of them
        held += (2 * p.num_boundary + int(cnt.read_from[r])) * POSITION_BYTES
    return held


def _view_bytes(
    p: PartAccess, cnt: _Counts, r: int, mode: Mode, transpose: bool, value: int = 4
) -> int:
    """Bytes of what one aggregator of rank r keeps of its own view (`_structure_bytes`
    but the inner block it shares and the rows read in place): the halo blocks of the rows
    that travel, its send lists, a segment's rows read out, the pipeline's interior rows.
    `value`: bytes of an edge's weight."""
    edge = INDEX_BYTES + value
    held = 0
    travel_edges = float(cnt.halo_edges[r] - cnt.in_place_edges[r])
    if travel_edges > 0:  # halo blocks: their rows, pointers (both ways) and edges
        rows = min(p.rows_reading_blocks(1), travel_edges)
        held += int(2 * rows * INDEX_BYTES + (2 if transpose else 1) * travel_edges * edge)
        if transpose:
            held += int(cnt.halo[r]) * INDEX_BYTES  # the transposes' pointers
        held += 2 * int(cnt.send[r]) * POSITION_BYTES  # the plan's send list, the chunks'
        if mode.wire.reads_out:  # where each halo row sits in the segment
            held += int(cnt.halo[r]) * POSITION_BYTES
    if mode.overlap and splits_update(p.num_inner, p.num_boundary):
        held += max(0, p.num_inner - p.num_boundary) * POSITION_BYTES
    return held


def _replica_step_bytes(
    p: PartAccess, c: RankCache, shape: ModelShape, static: bool
) -> tuple[int, int]:
    """Bytes a step makes of a rank's replicas where layer 0 aggregates them
    (models/gnn.py, comm/levels.py `Replicas.add_into`): their input rows dropped, alive
    through the forward pass, and the block's product (a row per reader, at input width),
    saved for the weights' gradient of an update-first layer 0 until its backward."""
    num = int(c.replica_rows.shape[0])
    sl = _shape_layer(shape, 0)
    if not num or sl.served_by_static(static):
        return 0, 0
    row = shape.widths[0] * shape.dtype_bytes
    dropped = num * row if sl.p > 0 else 0
    readers = min(float(p.rows_reading_halo), float(_cache_sums(p, c).replica_edges.sum()))
    return dropped, int(readers) * row if sl.upd else 0


def _two_views(mode: Mode, caches: list[RankCache], shape: ModelShape, static: bool) -> bool:
    """Whether every rank holds two aggregators (comm/modes.py `make_layer_aggregators`):
    some rank replicates rows, so layer 0's view leaves them out and the other layers' view
    is made with a plan of its own, in a mode with cache levels whose layer 0 aggregates."""
    replicas = any(c.replica_rows.shape[0] for c in caches)
    layer0 = not _shape_layer(shape, 0).served_by_static(static)
    return mode.cache_levels and replicas and layer0


def _replica_block_bytes(p: PartAccess, c: RankCache, shape: ModelShape) -> int:
    """Bytes of the replicas' column block (comm/levels.py `fetch_replicas`: compact, built
    with its transpose from the part's CSR): the rows reading replicas (at most one per
    edge), their pointers and the transpose's, and every edge both ways."""
    num = int(c.replica_rows.shape[0])
    if not num:
        return 0
    edges = float(_cache_sums(p, c).replica_edges.sum())
    rows = min(float(p.rows_reading_halo), edges)
    edge = INDEX_BYTES + shape.dtype_bytes
    return int((2 * rows + 1) * INDEX_BYTES + (num + 1) * INDEX_BYTES + 2 * edges * edge)


def _activations(shape: ModelShape, n: int, layer: int, static: bool) -> tuple[int, int]:
    """Bytes of activations alive while `layer` exchanges rows, forward and backward, on
    `n` inner rows (the same in every mode): the layers before it saved what their
    backward reads (`_saved`: each its input and its output; `static`: whether the static
    aggregate serves layer 0), and the layer itself its input and the rows it sends
    (forward) or also its output's gradient (backward)."""
    a = shape.widths[layer]
    b = shape.rows[layer] if shape.rows else shape.widths[layer + 1]
    w = shape.exchanged_width(layer)
    earlier = sum(_saved(shape, n, j, static) for j in range(layer))
    forward = earlier + n * (a + (w if w < a else 0)) * shape.dtype_bytes
    backward = earlier + _saved(shape, n, layer, static) + n * b * shape.dtype_bytes
    return forward, backward


def _saved(shape: ModelShape, n: int, layer: int, static: bool) -> int:
    """Bytes a layer keeps for its backward: its input and its output, `n` rows each. A
    layer 0 the static aggregate serves (`static`) saves that aggregate as its input, which
    the run holds anyway (`_static_bytes`): only its output counts, unless the layer adds
    each row's own multiple to it (`learnt_self_weight`), a new sum."""
    b = shape.rows[layer] if shape.rows else shape.widths[layer + 1]
    held = _shape_layer(shape, layer).served_by_static(static) and not shape.learnt_self_weight
    a = 0 if held else shape.widths[layer]
    return n * (a + b) * shape.dtype_bytes


def _activation_peak(shape: ModelShape, n: int, static: bool) -> int:
    """The step's largest phase of activations alone (`_activations`), or the backward of
    a layer past the first that makes its input's gradient: what it saved up to it, the
    gradient through the weights and again through the activation and dropout."""
    peak = 0
    for layer in range(shape.num_layers):
        if not _shape_layer(shape, layer).served_by_static(static):
            peak = max(peak, *_activations(shape, n, layer, static))
        if layer > 0:
            saved = sum(_saved(shape, n, j, static) for j in range(layer + 1))
            peak = max(peak, saved + 2 * n * shape.widths[layer] * shape.dtype_bytes)
    return peak
