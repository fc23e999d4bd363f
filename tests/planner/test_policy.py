"""Cache policies on hand-built parts where the right levels are known."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import numpy as np
import pytest

from leo_cli.config.schema import ModelConfig
from leo_cli.errors import CacheError
from leo_cli.graph.layout import build_parts
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.planner import policy as policy_module
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape
from leo_cli.planner.make import model_shape
from leo_cli.planner.policy import Budgets, decide
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.reach import Reach

ROW = 16 * 4  # bytes of one replicated row: input width 16, float32


def part(reuse: list[int]) -> PartAccess:
    """Rank 0 with halo rows owned by rank 1, read by `reuse[i]` local edges each."""
    reuse_H = np.asarray(reuse, dtype=np.int64)
    return PartAccess(
        rank=0,
        num_inner=10,
        num_boundary=4,
        inner_edges=20,
        reuse_H=reuse_H,
        owner_H=np.ones(len(reuse), dtype=np.int64),
        send_counts=[0, 4],
        recv_counts=[0, len(reuse)],
        rows_reading_halo=5,
    )


def shape(input_dropout: float) -> ModelShape:
    return ModelShape((16, 8, 4), 0.5, input_dropout, 4, extra_gemm=False)


def run(policy: str, reuse: list[int], replica_rows: int, halo_rows: int, p: float = 0.5):
    budgets = Budgets([replica_rows * ROW], [halo_rows * 8 * 4])
    return decide(policy, [part(reuse)], shape(p), budgets, None, static_aggregate=True)


def test_most_read_rows_are_replicated_first() -> None:
    got = run("degree", [1, 9, 3, 1, 5], replica_rows=2, halo_rows=100).caches[0]
    assert got.replica_rows.tolist() == [1, 4]  # read 9 and 5 times
    assert not got.static_aggregate and got.l3_rows.size == 0


def test_zero_budget_replicates_nothing() -> None:
    got = run("degree", [1, 9, 3], replica_rows=0, halo_rows=100).caches[0]
    assert got.replica_rows.size == 0


def test_budget_beyond_the_halo_replicates_every_row() -> None:
    got = run("degree", [1, 9, 3], replica_rows=1000, halo_rows=100).caches[0]
    assert got.replica_rows.tolist() == [0, 1, 2]


def test_a_halo_budget_below_the_halo_buffer_is_refused() -> None:
    with pytest.raises(CacheError, match="cache.halo_budget_mb is below the halo buffer of rank 0"):
        run("degree", [1, 9, 3, 2], replica_rows=0, halo_rows=3)
    assert run("degree", [1, 9, 3, 2], replica_rows=0, halo_rows=4).caches[0].l3_rows.size == 0


def test_static_aggregate_when_the_input_never_changes() -> None:
    got = run("degree", [1, 9, 3], replica_rows=1000, halo_rows=100, p=0.0).caches[0]
    assert got.static_aggregate and got.replica_rows.size == 0  # replicas would be useless


def test_policy_none_keeps_every_row_exchanged() -> None:
    got = run("none", [1, 9, 3], replica_rows=1000, halo_rows=0, p=0.0).caches[0]  # no budget
    assert not got.static_aggregate
    assert got.replica_rows.size == 0 and got.l3_rows.size == 0


def test_profile_counts_reuse_from_a_part() -> None:
    # Path 0-1-2 with 0 and 1 on rank 0, 2 on rank 1: node 1 reads halo node 2 once.
    edges = symmetrize(np.array([[0, 1], [1, 2]]), 3)
    g = Graph(
        "path", edges, np.zeros((3, 2), np.float32), np.zeros(3, np.int64),
        np.ones(3, bool), np.zeros(3, bool), np.zeros(3, bool), 2,
    )  # fmt: skip
    parts = build_parts(g, np.array([0, 0, 1]), 2)
    p0, p1 = (PartAccess.from_part(p) for p in parts)
    assert p0.reuse_H.tolist() == [1] and p0.owner_H.tolist() == [1]
    assert p0.inner_edges == 2 and p0.num_boundary == 1 and p0.rows_reading_halo == 1
    assert p1.reuse_H.tolist() == [1] and p1.inner_edges == 0


def attention_shape(input_dropout: float) -> ModelShape:
    # gat: 2 heads x 4 channels; a layer's row is heads x (channels + 1): features + score.
    return ModelShape(
        (16, 8, 4), 0.5, input_dropout, 4, extra_gemm=False, attention=True, rows=(10, 10)
    )


@pytest.mark.parametrize("policy", ["degree", "leo"])
@pytest.mark.parametrize("input_dropout", [0.0, 0.5])
def test_attention_gets_no_replicas_and_no_static_aggregate(
    policy: str, input_dropout: float
) -> None:
    """GAT's edge weights depend on transformed rows: L1 and L1s would compute wrong numbers."""
    budgets = Budgets([1000 * ROW], [100 * 10 * 4])
    got = decide(
        policy, [part([1, 9, 3])], attention_shape(input_dropout), budgets, None, True
    ).caches[0]
    assert not got.static_aggregate and got.replica_rows.size == 0 and got.l3_rows.size == 0
    # The same budgets give a linear model replicas (degree) or the static aggregate.
    linear = run("degree", [1, 9, 3], replica_rows=1000, halo_rows=100, p=input_dropout)
    assert linear.caches[0].static_aggregate or linear.caches[0].replica_rows.size > 0


@pytest.mark.parametrize("input_dropout", [0.0, 0.5])
def test_rounded_rows_get_no_replicas_but_keep_the_static_aggregate(input_dropout: float) -> None:
    """`pipeline.halo_dtype` (rows of 2 bytes an element): no replica at any budget; the
    static aggregate exactly where the input never changes, with or without a halo (one
    worker has none: it must run layer 0 alike)."""
    narrow = replace(shape(input_dropout), halo_bytes=2)
    budgets = Budgets([1000 * ROW], [100 * 8 * 4])
    for reuse in ([1, 9, 3], []):  # two workers' rank 0, and one worker (no halo)
        for policy in ("degree", "leo"):
            got = decide(policy, [part(reuse)], narrow, budgets, None, True).caches[0]
            assert got.replica_rows.size == 0
            assert got.static_aggregate == (input_dropout == 0)


def test_attention_rows_are_what_a_layer_exchanges() -> None:
    s = attention_shape(0.5)
    assert [s.exchanged_width(i) for i in range(2)] == [10, 8]  # the row, then the input
    assert [shape(0.5).exchanged_width(i) for i in range(2)] == [8, 4]


def test_attention_keeps_one_chunk_without_pricing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GAT row's softmax waits for every chunk: the policy does not price chunking it."""

    def no_pricing(*args: object, **kwargs: object) -> None:
        raise AssertionError("chunk counts of an attention model were priced")

    monkeypatch.setattr(policy_module, "predict", no_pricing)
    hw = cast(HardwareProfile, object())  # never read: nothing is priced
    chunks = policy_module.choose_chunks([part([1, 9, 3])], [], attention_shape(0.5), hw)
    assert chunks == [1, 1]
    with pytest.raises(AssertionError, match="priced"):
        policy_module.choose_chunks([part([1, 9, 3])], [], shape(0.5), hw)


@pytest.mark.parametrize(
    ("name", "extra", "reads"),
    [("gcn", False, (1, 0)), ("sage", True, (2, 1)), ("gin", True, (1, 1)), ("gat", False, (1, 0))],
)
def test_model_shape_counts_a_second_gemm_only_where_there_is_one(
    name: str, extra: bool, reads: tuple[int, int]
) -> None:
    s = model_shape(ModelConfig(name=name), num_features=16, num_classes=4, dtype_bytes=4)
    assert s.extra_gemm is extra and s.attention is (name == "gat")
    assert s.input_reads == reads  # layer 0's redraws, update-first and aggregate-first
    assert s.learnt_self_weight is (name == "gin")  # (1 + eps)·x added to the aggregate


@pytest.mark.parametrize("policy", ["degree", "leo"])
def test_a_single_worker_gets_no_replicas(policy: str, hw_profile: HardwareProfile) -> None:
    """One worker has no halo: nothing to sweep or replicate, yet a plan is priced."""
    alone = PartAccess(
        rank=0,
        num_inner=10,
        num_boundary=0,
        inner_edges=20,
        reuse_H=np.zeros(0, dtype=np.int64),
        owner_H=np.zeros(0, dtype=np.int64),
        send_counts=[0],
        recv_counts=[0],
        rows_reading_halo=0,
    )
    got = decide(policy, [alone], shape(0.5), Budgets([1000 * ROW], [0]), hw_profile, True)
    assert got.caches[0].replica_rows.size == 0 and got.sweep == []
    assert got.prediction is not None


def test_a_halo_budget_below_the_buffer_spills_the_least_read_rows_to_l3() -> None:
    """Rows an owner publishes to this rank are read in place (no buffer): the least-read go
    to L3 until the rest fits; the same budget is refused where nothing is read in place."""
    reuse = [1, 9, 3, 2, 7]
    budgets = Budgets([0], [3 * 8 * 4])  # room for 3 of 5 rows
    reach = Reach(np.array([[False, True]]))  # rank 0 maps rank 1's published rows
    got = decide("degree", [part(reuse)], shape(0.5), budgets, None, True, reach).caches[0]
    assert got.l3_rows.tolist() == [0, 3]  # read once and twice
    with pytest.raises(CacheError, match="rows spill to L3 only where they are read in place"):
        decide("degree", [part(reuse)], shape(0.5), budgets, None, True)


@pytest.mark.parametrize("policy", ["degree", "leo"])
def test_spilled_rows_are_not_replicated(policy: str, hw_profile: HardwareProfile) -> None:
    """A replica serves layer 0 only: a spilled row that were also replicated would travel
    through the L2 buffer at the later layers and overflow the budget it spilled for. Rows
    that spill are never replicated; the replica budget goes to the rest."""
    reuse = [1, 9, 3, 2, 7]
    other = PartAccess(
        rank=1,
        num_inner=10,
        num_boundary=5,
        inner_edges=20,
        reuse_H=np.ones(4, dtype=np.int64),
        owner_H=np.zeros(4, dtype=np.int64),
        send_counts=[5, 0],
        recv_counts=[4, 0],
        rows_reading_halo=4,
    )
    budgets = Budgets([1000 * ROW] * 2, [3 * 8 * 4] * 2)  # all fit L1; L2 holds 3 rows
    reach = Reach(np.array([[False, True], [True, False]]))
    hw = hw_profile if policy == "leo" else None
    caches = decide(policy, [part(reuse), other], shape(0.5), budgets, hw, True, reach).caches
    assert caches[0].l3_rows.tolist() == [0, 3] and caches[1].l3_rows.tolist() == [0]
    for c in caches:
        assert not set(c.replica_rows.tolist()) & set(c.l3_rows.tolist())
    if policy == "degree":
        assert caches[0].replica_rows.tolist() == [1, 2, 4]
