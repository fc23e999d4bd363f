"""The cost model's arithmetic on a hand-made hardware profile and two hand-built parts.

Every rate of the profile is the same at every width and size, so each term below is a
count divided by one round rate, and the expected seconds are written out term by term.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import rank_rates

from leo_cli.comm.aggregate import splits_update
from leo_cli.planner import cost
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import (
    ModelShape,
    Phases,
    _combine,
    _Counts,
    _replica_step_bytes,
    mode_buffers,
    predict,
)
from leo_cli.planner.plan import RankCache
from leo_cli.planner.profile.hardware import FORMAT_VERSION, HardwareProfile
from leo_cli.planner.reach import Reach
from leo_cli.registry import mode_of

# Rates: SpMM 1000 edges/s forward, 500 backward; GEMM 1e6 FLOP/s (never memory bound);
# gather 1000 rows/s, scatter-add 500; a pass writes 1e4 B/s; masks 100 / 200 rows/s.
# Links: gloo 1 MB/s + 1 ms per message, all-to-all 1 MB/s + 2 ms, shm 2 MB/s, barrier 1 ms.
SPMM, SPMM_T, FLOPS, GATHER, SCATTER, PASS = 1000.0, 500.0, 1e6, 1000.0, 500.0, 1e4


def hardware(overlap: float = 0.5) -> HardwareProfile:
    fit = {"bandwidth_bytes_per_s": 1e6, "latency_s": 1e-3}
    pair = {"ranks": [0, 1], **fit}
    data: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "created_utc": "2026-12-01T00:00:00+00:00",
        "hostname": "test",
        "device": "cpu",
        "torch_version": "2.13.0",
        "kernels_backend": "reference",
        "dtype": "float32",
        "world_size": 2,
        "threads_per_worker": 1,
        "quick": False,
        "probe_s": 1.0,
        "sizes": {},
        "compute": {
            "widths": [4, 16],
            "spmm_bytes": [100, 10000],
            "spmm_edges_per_s": [[SPMM, SPMM], [SPMM, SPMM]],
            "spmm_t_edges_per_s": [[SPMM_T, SPMM_T], [SPMM_T, SPMM_T]],
            "gemm_flop_per_s": [FLOPS, FLOPS],
            "gemm_narrow_bytes_per_s": [1e12, 1e12],
            "mask_rows_per_s": [100.0, 100.0],
            "mask_backward_rows_per_s": [200.0, 200.0],
            "gather_rows_per_s": [GATHER, GATHER],
            "scatter_add_rows_per_s": [SCATTER, SCATTER],
            "pass_bytes": [1, 1 << 30],
            "pass_bytes_per_s": [PASS, PASS],
        },
        "links": {
            "gloo": {"concurrent": fit, "pairs": [pair]},
            "shm": {
                "concurrent": {"bandwidth_bytes_per_s": 2e6, "latency_s": 0.0},
                "pairs": [{"ranks": [0, 1], "bandwidth_bytes_per_s": 2e6, "latency_s": 0.0}],
            },
            "barrier_s": 1e-3,
            "alltoall": {"bandwidth_bytes_per_s": 1e6, "latency_s": 2e-3},
            "overlap": overlap,
        },
    }
    data["ranks"] = rank_rates(data["compute"], 2)
    return HardwareProfile.model_validate(data)


def part(rank: int) -> PartAccess:
    """10 inner rows (4 boundary), 20 inner edges, 4 halo rows of the other rank read by
    5 edges (one row twice) from 3 rows."""
    peer = 1 - rank
    counts = [0, 0]
    counts[peer] = 4
    readers = [0, 0]
    readers[peer] = 3
    return PartAccess(
        rank=rank,
        num_inner=10,
        num_boundary=4,
        inner_edges=20,
        reuse_H=np.array([2, 1, 1, 1]),
        owner_H=np.full(4, peer),
        send_counts=counts,
        recv_counts=counts,
        rows_reading_halo=3,
        rows_reading_peer=readers,
    )


# One layer, 16 -> 4 (update-first: 4 columns cross the wire), no dropout, with a separate
# self-loop term (GIN's kind; GCN's self-loops are CSR entries: `diagonal`).
SHAPE = ModelShape(widths=(16, 4), dropout=0.0, input_dropout=0.0, dtype_bytes=4, extra_gemm=False)
NONE = [RankCache(), RankCache()]


def passes(rows: int, width: int = 4) -> float:
    return rows * width * 4 / PASS


def test_blocking_step_term_by_term() -> None:
    gemm = 2 * 10 * 16 * 4 / FLOPS  # one update; backward: the weight gradient only
    epilogue = passes(10) * 2 + passes(10)  # self-loop term (2) + bias (last layer: no ReLU)
    comm = 2e-3 + 4 * 16 / 1e6  # the busiest rank receives 4 rows of 16 B
    fwd_pre = gemm * 4 / 10 + 4 / GATHER  # boundary share of the update, pack 4 rows
    fwd_window = gemm * 6 / 10
    inner = 20 / SPMM + passes(10)  # the inner block (+ its output)
    halo = 5 / SPMM + passes(3)  # the peer's block: 5 edges into the 3 rows reading it
    fwd_post = inner + halo + 3 / SCATTER + epilogue  # its rows added into the output
    bwd_pre = epilogue + 5 / SPMM_T + passes(4) + 3 / GATHER + passes(4)  # block, its rows, buffer
    bwd_post = 20 / SPMM_T + passes(10) + 4 / SCATTER + gemm  # inner block, unpack, weights
    loss = 2 * passes(10)
    allreduce = 16 * 4 * 4 / 1e6 + 1e-3  # 64 weights, one message
    expected = fwd_pre + fwd_window + comm + fwd_post + bwd_pre + comm + bwd_post
    pred = predict([part(0), part(1)], NONE, SHAPE, hardware(), "blocking", [1])
    assert pred.epoch_time_s == pytest.approx(expected + loss + allreduce, rel=1e-12)
    assert pred.stages["comm_s"] == pytest.approx(2 * comm, rel=1e-12)
    assert pred.stages["comm_wait_s"] == pytest.approx(2 * comm, rel=1e-12)


def test_self_loops_on_the_diagonal_are_priced_as_inner_edges() -> None:
    """GCN (`diagonal`): one more inner edge per row in each direction's SpMM, in place of the
    self-loop term's two passes each way."""
    parts = [part(0), part(1)]
    apart = predict(parts, NONE, SHAPE, hardware(), "blocking", [1]).epoch_time_s
    diagonal = predict(parts, NONE, replace(SHAPE, diagonal=True), hardware(), "blocking", [1])
    change = 10 / SPMM + 10 / SPMM_T - 4 * passes(10)
    assert diagonal.epoch_time_s - apart == pytest.approx(change, rel=1e-9)


@pytest.mark.parametrize(
    ("widths", "reads", "draws"),
    [((16, 4), (1, 0), 2), ((4, 16), (1, 0), 1), ((16, 4), (2, 1), 3), ((4, 16), (2, 1), 2)],
)
@pytest.mark.parametrize("kept", [False, True])
def test_input_dropout_is_drawn_again_where_the_backward_reads_it(
    widths: tuple[int, int],
    reads: tuple[int, int],
    draws: int,
    kept: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Layer 0's dropped features are not kept for the backward: drawn once forward, then
    as often as the layer's backward reads its input (`input_reads`: GCN's update-first layer
    (16 -> 4) once for the weight gradient, aggregating first (4 -> 16) never; a root map as
    SAGE's once more either way). A copy under `KEPT_DROPPED_BYTES` is kept: drawn once."""
    bound = 10 * widths[0] * SHAPE.dtype_bytes  # a rank's copy: 10 rows
    monkeypatch.setattr(cost, "KEPT_DROPPED_BYTES", bound + 1 if kept else bound)
    draws = 1 if kept else draws
    parts = [part(0), part(1)]
    shape = replace(SHAPE, widths=widths, input_reads=reads)
    plain = predict(parts, NONE, shape, hardware(), "blocking", [1]).epoch_time_s
    dropped = replace(shape, input_dropout=0.5)
    pred = predict(parts, NONE, dropped, hardware(), "blocking", [1]).epoch_time_s
    assert pred - plain == pytest.approx(draws * 10 / 100.0, rel=1e-9)  # 10 rows, 100 rows/s


def test_rounded_rows_move_fewer_bytes_both_ways_and_pay_their_rounding() -> None:
    """bfloat16 rows (`pipeline.halo_dtype`): 2 bytes an element forward and backward (the
    gradient read as rows: the same 4 rows each way), every inner row encoded and decoded,
    arrivals decoded; int8 rows also draw their random bytes (a mask's price)."""
    hw, parts = hardware(), [part(0), part(1)]
    narrow = replace(SHAPE, halo_bytes=2)
    pred = predict(parts, NONE, narrow, hw, "blocking", [1])
    comm = 2e-3 + 4 * 8 / 1e6  # 4 rows of 4 elements, 2 bytes each
    assert pred.stages["comm_s"] == pytest.approx(2 * comm, rel=1e-12)
    per_direction = passes(10) + passes(10) + passes(4)  # encode, decode, arrivals
    assert pred.stages["round_s"] == pytest.approx(2 * per_direction, rel=1e-12)
    assert "round_s" not in predict(parts, NONE, SHAPE, hw, "blocking", [1]).stages
    # leo sends its boundary rows first, and reads those very rows back: every row is still
    # encoded once (comm/aggregate.py update_and_send), as in blocking.
    leo = predict(parts, NONE, narrow, hw, "leo", [1])
    assert leo.stages["round_s"] == pytest.approx(pred.stages["round_s"], rel=1e-12)
    # float16: 2 bytes an element and its scale's byte; six passes to scale and pack, two to
    # read back; int8 draws its random bytes too (the mask's rate, 100 rows/s).
    f16 = replace(SHAPE, halo_bytes=2, halo_row_bytes=1)
    int8 = replace(SHAPE, halo_bytes=1, halo_row_bytes=1, halo_stochastic=True)
    for shape, row, draws in ((f16, 9, 0.0), (int8, 5, 10 / 100)):
        got = predict(parts, NONE, shape, hw, "blocking", [1])
        assert got.stages["comm_s"] == pytest.approx(2 * (2e-3 + 4 * row / 1e6), rel=1e-12)
        encode = draws + 6 * passes(10)
        assert got.stages["round_s"] == pytest.approx(
            2 * (encode + 2 * passes(10) + 2 * passes(4)), rel=1e-12
        )


def test_compute_only_is_blocking_without_the_transfers() -> None:
    hw = hardware()
    blocking = predict([part(0), part(1)], NONE, SHAPE, hw, "blocking", [1])
    floor = predict([part(0), part(1)], NONE, SHAPE, hw, "compute-only", [1])
    comm = 2e-3 + 4 * 16 / 1e6
    packing = 4 / GATHER + passes(4)  # rows gathered to send; the gradients' buffer
    zeros = passes(4) + passes(4)  # zeros arrive in place of 4 halo rows and 4 gradients
    assert floor.epoch_time_s == pytest.approx(
        blocking.epoch_time_s - 2 * comm - packing + zeros, rel=1e-12
    )
    assert floor.stages["spmm_s"] == pytest.approx(blocking.stages["spmm_s"], rel=1e-12)


def test_static_aggregate_layer_has_no_exchange() -> None:
    static = [RankCache(static_aggregate=True), RankCache(static_aggregate=True)]
    pred = predict([part(0), part(1)], static, SHAPE, hardware(), "leo", [1])
    gemm = 2 * 10 * 16 * 4 / FLOPS
    fwd = gemm + passes(10, 16) * 2 + passes(10)  # self-loop term at input width, bias
    bwd = gemm + passes(10)  # weight gradient, bias
    loss, allreduce = 2 * passes(10), 16 * 4 * 4 / 1e6 + 1e-3
    assert pred.epoch_time_s == pytest.approx(fwd + bwd + loss + allreduce, rel=1e-12)
    assert pred.stages["comm_wait_s"] == 0.0


def test_fine_grained_moves_a_row_per_edge() -> None:
    hw = hardware()
    blocking = predict([part(0), part(1)], NONE, SHAPE, hw, "blocking", [1])
    fine = predict([part(0), part(1)], NONE, SHAPE, hw, "fine-grained", [1])
    # 5 rows instead of 4 each way: one more row to pack, send, write in the block's
    # backward output, put in the gradients' buffer and unpack.
    more = 1 / GATHER + 2 * (16 / 1e6) + 2 * passes(1) + 1 / SCATTER
    assert fine.epoch_time_s == pytest.approx(blocking.epoch_time_s + more, rel=1e-12)


def test_pipelined_combine_hides_the_overlap_share() -> None:
    # Rank 0 posts after 1 s, rank 1 after 2 s: transfers start at 2 s.
    phases = [Phases(pre=1.0, window=4.0, comm=2.0, post=2.0), Phases(2.0, 1.0, 3.0, 1.0)]
    total, times = _combine(phases, mode_of("leo"), k=2, overlap=0.5)
    # Rank 0: local work ends at 1 + 4 + 1 = 6, its transfer at 2 + 2 = 4; they shared the
    # cores from 2 to 4, half of it lost; then the last chunk's post (1).
    assert times[0] == pytest.approx(6 + 0.5 * 2 + 1)
    # Rank 1: local ends at 2 + 1 + 0.5 = 3.5, transfer at 5; shared 1.5 s.
    assert times[1] == pytest.approx(5 + 0.5 * 1.5 + 0.5)
    assert total == max(times)
    serial, _ = _combine(phases, mode_of("leo"), k=1, overlap=0.0)
    assert serial == pytest.approx(max(1 + 4 + 2 + 2, 2 + 1 + 3 + 1))


def test_blocking_combine_waits_for_every_rank() -> None:
    phases = [Phases(1.0, 4.0, 2.0, 2.0), Phases(2.0, 1.0, 3.0, 1.0)]
    total, times = _combine(phases, mode_of("blocking"), k=1, overlap=1.0)
    assert total == pytest.approx(5 + 3 + 2) and times == [total, total]


def test_pipelined_step_uses_point_to_point_chunks() -> None:
    hw = hardware(overlap=1.0)
    pred = predict([part(0), part(1)], NONE, SHAPE, hw, "leo", [2])  # without a cache
    # Two chunks of 4 rows of 16 B: 64 B at 1 MB/s + 2 messages of 1 ms, per direction.
    assert pred.stages["comm_s"] == pytest.approx(2 * (64 / 1e6 + 2e-3), rel=1e-12)


def test_shared_memory_writes_rows_between_two_barriers() -> None:
    pred = predict([part(0), part(1)], NONE, SHAPE, hardware(), "shared-memory", [1])
    forward = 10 * 16 / 2e6 + 2e-3  # every inner row written, between two barriers
    backward = forward  # the output gradient's rows, the same way (gradients as rows)
    assert pred.stages["comm_s"] == pytest.approx(forward + backward, rel=1e-12)
    gat = predict([part(0), part(1)], NONE, replace(SHAPE, attention=True), hardware(),
                  "shared-memory", [1])  # fmt: skip
    backward = 4 * 16 / 2e6 + 1e-3  # attention: the halo rows' gradients, as partial sums
    assert gat.stages["comm_s"] == pytest.approx(forward + backward, rel=1e-12)


PUBLISHED = Reach(np.array([[False, True], [True, False]]))  # two ranks on one host


def test_rows_read_in_place_travel_nowhere() -> None:
    """Rows a rank reads from its owner's published rows leave the transfer: L3 rows under
    `auto`, every row for a per-edge mode or under `shared-memory`; replicas never."""
    accesses = [part(0), part(1)]
    l3 = [RankCache(l3_rows=np.array([0, 2])), RankCache(l3_rows=np.array([0, 2]))]
    plain = _Counts(accesses, l3, 0, per_edge=False)
    auto = _Counts(accesses, l3, 0, per_edge=False, reach=PUBLISHED)
    assert plain.recv[0, 1] == 4 + 1  # row 0 read twice comes twice
    assert auto.recv[0, 1] == 2 and auto.in_place[0, 1] == 2  # rows 1, 3 travel
    assert auto.per_edge_edges[0] == 0 and bool(auto.publishes[1])
    fine = _Counts(accesses, NONE, 0, per_edge=True, reach=PUBLISHED)
    assert fine.recv[0, 1] == 0 and fine.in_place[0, 1] == 4
    replicas = [RankCache(False, np.array([1])), RankCache(False, np.array([1]))]
    every = Reach(PUBLISHED.published, every_row=True)
    for layer, travels in ((0, 0), (1, 1)):  # the replica is exchanged past layer 0
        shm = _Counts(accesses, replicas, layer, per_edge=False, reach=every)
        assert shm.recv[0, 1] == travels and shm.in_place[0, 1] == 3


def test_no_message_where_every_row_is_read_in_place() -> None:
    """The pipeline posts no message to a peer it receives no rows from (comm/exchange.py):
    with every row read in place, no latency is priced either."""
    every = Reach(PUBLISHED.published, every_row=True)
    pred = predict([part(0), part(1)], NONE, SHAPE, hardware(), "leo", [1], every)
    assert pred.stages["comm_s"] == 0.0
    assert predict([part(0), part(1)], NONE, SHAPE, hardware(), "leo", [1]).stages["comm_s"] > 0


def test_reading_in_place_is_priced_below_the_transfer() -> None:
    hw = hardware()
    exchanged = predict([part(0), part(1)], NONE, SHAPE, hw, "fine-grained", [1])
    in_place = predict([part(0), part(1)], NONE, SHAPE, hw, "fine-grained", [1], PUBLISHED)
    assert in_place.epoch_time_s < exchanged.epoch_time_s
    # blocking reads nothing in place: the reach changes nothing
    a = predict([part(0), part(1)], NONE, SHAPE, hw, "blocking", [1])
    b = predict([part(0), part(1)], NONE, SHAPE, hw, "blocking", [1], PUBLISHED)
    assert a.epoch_time_s == b.epoch_time_s


def with_in_place(local: float, mapped: float) -> HardwareProfile:
    """`hardware()` with reads in place measured at `mapped` edges/s against `local` on rank 0
    (rank 1 reads in place as fast as locally)."""
    data = hardware().model_dump(mode="json")
    data["links"]["in_place"] = {
        "widths": [4, 16],
        "working_bytes": 1 << 20,
        "local_edges_per_s": [[local, local], [SPMM, SPMM]],
        "mapped_edges_per_s": [[mapped, mapped], [SPMM, SPMM]],
    }
    return HardwareProfile.model_validate(data)


def test_reads_in_place_cost_what_the_probe_measured() -> None:
    """Rank 0 reads its peer's published rows 3x slower than local rows: the SpMM share of
    its halo edges that read in place costs 3x, forward and backward (gradients travel as
    rows, aggregated as the forward's); a measured slowdown of 1 prices as a profile without
    the measurement."""
    accesses = [part(0), part(1)]
    l3 = [RankCache(l3_rows=np.array([0, 2])), RankCache(l3_rows=np.array([0, 2]))]
    base = predict(accesses, l3, SHAPE, hardware(), "leo", [1], PUBLISHED)
    same = predict(accesses, l3, SHAPE, with_in_place(2000.0, 2000.0), "leo", [1], PUBLISHED)
    assert same.per_rank == base.per_rank
    slow = predict(accesses, l3, SHAPE, with_in_place(2000.0, 2000.0 / 3), "leo", [1], PUBLISHED)
    cnt = _Counts(accesses, l3, 0, per_edge=False, reach=PUBLISHED)
    assert cnt.in_place_edges.tolist() == [3.0, 3.0]  # rows 0 (read twice) and 2
    halo_spmm = 5 / SPMM + passes(3)  # the peer's block, as in the blocking test
    extra_spmm = halo_spmm * (3 / 5) * 2  # 3 of its 5 edges read in place, at 3x
    extra = slow.per_rank[0]["busy_s"] - base.per_rank[0]["busy_s"]
    assert extra == pytest.approx(2 * extra_spmm, rel=1e-9)  # forward and backward
    assert slow.per_rank[1]["busy_s"] == pytest.approx(base.per_rank[1]["busy_s"], rel=1e-12)
    # Nothing read in place (no reach): the measurement changes nothing.
    plain = predict(accesses, l3, SHAPE, with_in_place(2000.0, 2000.0 / 3), "leo", [1])
    assert plain.per_rank == predict(accesses, l3, SHAPE, hardware(), "leo", [1]).per_rank


@pytest.mark.parametrize("mode", ["blocking", "leo"])
def test_each_rank_is_priced_with_its_own_rates(mode: str) -> None:
    """Rank 1 measured at half rank 0's compute rates: its own work takes twice as long, and
    the step, which waits for the slowest rank, grows with it."""
    data = hardware().model_dump(mode="json")
    slow = data["ranks"][1]["compute"]
    for key in [k for k in slow if k.endswith("_per_s")]:
        slow[key] = (np.asarray(slow[key], dtype=float) / 2).tolist()
    unequal = HardwareProfile.model_validate(data)
    chunks = [2] if mode_of(mode).chunks else [1]
    equal = predict([part(0), part(1)], NONE, SHAPE, hardware(), mode, chunks)
    pred = predict([part(0), part(1)], NONE, SHAPE, unequal, mode, chunks)
    assert [r["busy_s"] for r in equal.per_rank] == pytest.approx([equal.per_rank[0]["busy_s"]] * 2)
    assert pred.per_rank[0]["busy_s"] == pytest.approx(equal.per_rank[0]["busy_s"], rel=1e-12)
    assert pred.per_rank[1]["busy_s"] == pytest.approx(2 * pred.per_rank[0]["busy_s"], rel=1e-12)
    assert pred.epoch_time_s > equal.epoch_time_s


def test_across_hosts_a_node_link_carries_every_row_crossing_it() -> None:
    """Workers on two hosts (ranks 0, 1 and 2, 3): same-host rows at their pair's rate, rows
    crossing the node's link, in or out for every rank of the node, at the cross-host pairs'
    rate; the slower of the two is what rank 0 waits for."""
    from leo_cli.planner.cost import _across_hosts
    from leo_cli.planner.profile.rates import Rates

    data = hardware().model_dump(mode="json")
    data["world_size"] = 4
    data["ranks"] = rank_rates(data["compute"], 4)
    for r, host in enumerate("aabb"):
        data["ranks"][r]["hostname"] = host
    data["links"]["shm"] = None  # no shared segment across hosts
    fast, slow = 1e8, 1e6
    data["links"]["gloo"]["pairs"] = [
        {"ranks": [a, b], "bandwidth_bytes_per_s": fast if "aabb"[a] == "aabb"[b] else slow,
         "latency_s": 0.0}
        for a in range(4) for b in range(a + 1, 4)
    ]  # fmt: skip
    hw = Rates(HardwareProfile.model_validate(data), 0)
    assert hw.hosts() == list("aabb") and hw.cross_host_fit().bandwidth_bytes_per_s == slow
    recv = np.zeros((4, 4))
    recv[0, 1], recv[0, 2], recv[0, 3], recv[1, 2] = 10, 20, 30, 5  # into node a: 55 rows
    recv[2, 0], recv[3, 1] = 40, 30  # out of node a: 70 rows
    row = 100
    assert _across_hosts(hw, 0, recv, row, 1, list("aabb")) == pytest.approx(70 * row / slow)
    recv[2:, :2] = recv[:2, 2:] = 0  # nothing crosses: the same-host pair alone
    assert _across_hosts(hw, 0, recv, row, 1, list("aabb")) == pytest.approx(10 * row / fast)
    one_host = Rates(hardware(), 0)
    assert one_host.hosts() is None  # every rank on one host: priced as before


def buffer_bytes(
    accesses: list[PartAccess],
    caches: list[RankCache],
    shape: cost.ModelShape,
    mode: str,
    reach: Reach | None = None,
) -> list[int]:
    """What `mode_buffers` counts of rows: kept replicas, /dev/shm, the largest phase's
    moving rows (its structures and their weighing against activations: below)."""
    b = mode_buffers(accesses, caches, shape, mode, reach)
    return [k + s + m for k, s, m in zip(b.kept, b.shm, b.moving, strict=True)]


# Buffers that move rows (`mode_buffers`), on the two parts above: 10 inner rows (4 boundary),
# 4 halo rows read by 5 edges, 4 rows sent; rows of 4 float32 cross the wire (16 B).
@pytest.mark.parametrize(
    ("mode", "reach", "each"),
    [
        ("blocking", None, (4 + 4) * 16),  # packed and received; gradients both ways alike
        ("leo", None, (4 + 4) * 16),
        ("fine-grained", None, (5 + 5) * 16),  # a row per reading edge, each way
        ("compute-only", None, 4 * 16),  # a halo of zeros, nothing back
        # the segment's share (its 10 rows) and one peer's rows read out; gradients as rows
        ("shared-memory", None, 10 * 16 + 4 * 16),
        # every row in place: one copy of its 4 boundary rows (gradients travel as rows
        # through it), nothing left to move
        ("leo", Reach(PUBLISHED.published, every_row=True), 4 * 16),
        ("fine-grained", PUBLISHED, 4 * 16),
    ],
)
def test_buffer_bytes_count_what_each_transport_holds(
    mode: str, reach: Reach | None, each: int
) -> None:
    accesses = [part(0), part(1)]
    assert buffer_bytes(accesses, NONE, SHAPE, mode, reach) == [each, each]


def test_buffer_bytes_take_the_widest_layer() -> None:
    # 16 -> 8 -> 4: layer 0 moves 8 columns, layer 1 four; the widest sizes everything
    deep = replace(SHAPE, widths=(16, 8, 4))
    assert buffer_bytes([part(0), part(1)], NONE, deep, "blocking") == [(4 + 4) * 32] * 2
    every = Reach(PUBLISHED.published, every_row=True)
    assert buffer_bytes([part(0), part(1)], NONE, deep, "leo", every) == [4 * 32] * 2


def test_buffer_bytes_of_levels_a_static_layer_0_and_one_reader() -> None:
    accesses = [part(0), part(1)]
    deep = replace(SHAPE, widths=(16, 8, 4))  # layer 0 moves 8 columns, layer 1 four
    # the static aggregate serves layer 0: only layer 1's rows move (16 B a row)
    static = [RankCache(static_aggregate=True), RankCache(static_aggregate=True)]
    assert buffer_bytes(accesses, static, deep, "blocking") == [(4 + 4) * 16] * 2
    # a replica keeps its input row (16 floats) for the run; it is not received at layer 0
    replicas = [RankCache(False, np.array([1])), RankCache(False, np.array([1]))]
    assert buffer_bytes(accesses, replicas, deep, "blocking") == [16 * 4 + (3 + 3) * 32] * 2
    # only rank 0 reads rank 1's rows in place: rank 1 still publishes its boundary rows
    one = Reach(np.array([[False, True], [False, False]]), every_row=True)
    rank0, rank1 = buffer_bytes(accesses, NONE, SHAPE, "leo", one)
    assert rank0 == 4 * 16 + 4 * 16  # its copy; it still packs 4 rows for rank 1
    assert rank1 == 4 * 16 + (4 + 0) * 16  # its copy; it receives 4 rows, sends none


def test_moving_rows_count_one_for_one_on_the_steps_peak() -> None:
    accesses = [part(0), part(1)]
    # One layer: its backward exchange is the step's largest phase of activations, so the
    # rows moving then add to the peak one for one.
    one = mode_buffers(accesses, NONE, SHAPE, "blocking")
    assert one.moving[0] > 0 and one.lift == one.moving
    # 16 -> 64 -> 4: layer 1 exchanges 4 columns while the backward of its 64-wide input
    # holds more activations; the moving rows still count whole (the measured peaks of the
    # steps hold them: the phases' activations are too close to tell apart).
    wide = replace(SHAPE, widths=(16, 64, 4))
    deep = mode_buffers(accesses, NONE, wide, "blocking")
    assert deep.moving[0] > 0 and deep.lift == deep.moving
    for b in (one, deep):
        parts = zip(b.kept, b.shm, b.structures, b.lift, strict=True)
        assert b.total == [k + s + h + m for k, s, h, m in parts]


def test_both_views_and_the_replicas_block_are_held_where_rows_are_replicated() -> None:
    # 16 -> 8 -> 4, blocking (partial sums: every block with its transpose), row 1 (one
    # edge) replicated on both ranks: layer 0's view (3 rows, 4 edges, 3 rows sent) beside
    # the other layers' (4 rows, 5 edges, 4 sent), and the replicas' block.
    accesses = [part(0), part(1)]
    deep = replace(SHAPE, widths=(16, 8, 4))
    replicas = [RankCache(False, np.array([1])), RankCache(False, np.array([1]))]
    # a view: 3 reading rows (their ids and pointers), its edges both ways (column and
    # weight), the transposes' pointers (a row each), the plan's and the chunks' send lists
    layer0 = 2 * 3 * 4 + 2 * 4 * 8 + 3 * 4 + 2 * 3 * 8
    # the replicas' block: 1 reading row (its id, two pointers), the column's two pointers,
    # its edge both ways
    block = (2 * 1 + 1) * 4 + (1 + 1) * 4 + 2 * 1 * 8
    alone = mode_buffers(accesses, NONE, deep, "blocking").structures
    both = mode_buffers(accesses, replicas, deep, "blocking").structures
    assert [b - a for a, b in zip(alone, both, strict=True)] == [layer0 + block] * 2


def test_a_step_holds_the_replicas_rows_it_makes() -> None:
    # 64 -> 8 -> 4, input dropout: row 0 (read by 2 edges from 2 rows) replicated on both
    # ranks; layer 0 drops its input row (64 floats, alive through the forward pass) and
    # saves the block's product (a row of 64 per reader) for the weights' gradient until
    # its backward.
    accesses = [part(0), part(1)]
    shape = replace(SHAPE, widths=(64, 8, 4), input_dropout=0.5)
    cache = RankCache(False, np.array([0]))
    assert _replica_step_bytes(part(0), cache, shape, False) == (64 * 4, 2 * 64 * 4)
    kept = replace(shape, input_dropout=0.0)  # not dropped: the rows kept are read
    assert _replica_step_bytes(part(0), cache, kept, False) == (0, 2 * 64 * 4)
    assert _replica_step_bytes(part(0), cache, kept, True) == (0, 0)  # the static aggregate
    # layer 1's forward: its 4 rows packed and 4 received (4 floats each) beside the dropped
    # row and the saved product (layer 0's backward: 3 + 3 rows of 8 floats and the product)
    b = mode_buffers(accesses, [cache, cache], shape, "blocking")
    assert b.lift == [(4 + 4) * 4 * 4 + 64 * 4 + 2 * 64 * 4] * 2


def test_segments_are_priced_without_a_static_layer_0s_width() -> None:
    # 16 -> 8 -> 4: where the static aggregate serves layer 0, only layer 1's 4 columns
    # move, and the segments are reserved at that width (worker/assemble.py exchange_width)
    accesses = [part(0), part(1)]
    deep = replace(SHAPE, widths=(16, 8, 4))
    static = [RankCache(static_aggregate=True), RankCache(static_aggregate=True)]
    every = Reach(PUBLISHED.published, every_row=True)
    for mode, reach in (("leo", every), ("shared-memory", None)):
        moving = mode_buffers(accesses, NONE, deep, mode, reach).shm
        served = mode_buffers(accesses, static, deep, mode, reach).shm
        assert moving[0] > 0 and served == [s // 2 for s in moving], mode


def test_the_pipeline_splits_its_update_only_where_a_part_has_an_interior() -> None:
    # a quarter of the rows interior, at least one (comm/aggregate.py splits_update)
    assert splits_update(100, 10) and splits_update(100, 75) and splits_update(2, 1)
    assert not splits_update(100, 76) and not splits_update(100, 100) and not splits_update(0, 0)
    assert not splits_update(100, 0)  # nothing to send first: nothing to hide
    # 10 inner rows: 4 boundary rows split (x rows gathered at 16 columns, h rows placed at
    # 4, 10 each, at GATHER rows/s); every row boundary: no split, no such pack
    hw = hardware()
    split = predict([part(0), part(1)], NONE, SHAPE, hw, "leo", [1])
    whole = [replace(part(r), num_boundary=10) for r in (0, 1)]
    unsplit = predict(whole, NONE, SHAPE, hw, "leo", [1])
    assert split.stages["pack_s"] - unsplit.stages["pack_s"] == pytest.approx(
        2 * 10 / GATHER, rel=1e-9
    )


def test_the_static_aggregates_fetch_is_priced_as_it_fills_its_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`[x | halo]` (10 + 4 rows of 16 float32 here) beside the larger of one round of the
    fetch (the rows sent, their int64 positions, the rows received) and the aggregate of the
    10 inner rows: the whole fetch in one round where it fits, else a round's bytes."""
    row = 16 * 4
    one = replace(part(0), send_counts=[0, 1])  # 1 row sent, 4 received
    assert cost._fetch_bytes(one, SHAPE) == (10 + 4) * row + 10 * row  # the aggregate's
    wide = replace(part(0), num_inner=2, send_counts=[0, 6])  # 6 rows sent
    assert cost._fetch_bytes(wide, SHAPE) == (2 + 4) * row + 6 * row + 6 * 8 + 4 * row
    monkeypatch.setattr(cost, "FETCH_ROUND_BYTES", 2 * row)  # rounds of two rows
    assert cost._fetch_bytes(wide, SHAPE) == (2 + 4) * row + 2 * row + 2 * 8 + 2 * row


def test_a_static_layer_0_saves_the_aggregate_the_run_holds_not_another_input() -> None:
    """Layer 0 served by the static aggregate saves that aggregate (held for the run and
    counted once, `_static_bytes`) as its input: the step's activations count its output
    and the later layers'. Counted twice, a mode's steps could outweigh a set-up phase that
    peaks higher, and its buffers were priced from the wrong phase."""
    deep = replace(SHAPE, widths=(16, 8, 4))
    n, f32 = 10, 4
    # layer 1's backward peaks: layer 0's input (16) and output (8), layer 1's (8, 4), two
    # 8-wide gradients; the static aggregate leaves out layer 0's 16-wide input
    moving = cost._activation_peak(deep, n, static=False)
    assert moving == n * (16 + 8 + 8 + 4 + 2 * 8) * f32
    assert cost._activation_peak(deep, n, static=True) == moving - n * 16 * f32
    dropped = replace(deep, input_dropout=0.5)  # no static aggregate then: its input counts
    assert cost._activation_peak(dropped, n, static=True) == moving
    gin = replace(deep, learnt_self_weight=True)  # (1 + eps)·x added to it: a new sum
    assert cost._activation_peak(gin, n, static=True) == moving
