"""`pipeline.transport=auto` chooses per pair of workers whether a reader takes every row of
an owner in place or only its L3 rows (the rest through the process group): the plan records
the pairs, and a pair's choice follows what reading in place costs that reader."""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
from test_cost import hardware

from leo_cli.config import load_config
from leo_cli.config.schema import CacheConfig
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape, predict
from leo_cli.planner.make import make_plan, per_pair, transports
from leo_cli.planner.plan import PlanInputs, RankCache, dtype_key, graph_inputs
from leo_cli.planner.policy import Decision
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.reach import ORDERED_STORES, Reach

KEYS = ("k", "i", "g")
# Two layers, 16 -> 8 -> 4, input dropout on (no static aggregate: every layer exchanges).
SHAPE = ModelShape((16, 8, 4), 0.5, 0.5, 4, extra_gemm=False)
ONE_HOST = Reach(~np.eye(3, dtype=bool))  # three workers, each publishing to the others
NO_REPLICAS = CacheConfig(replica_budget_mb=0)


def part3(rank: int) -> PartAccess:
    """10 inner rows (4 boundary), 20 inner edges; 2 halo rows from each peer, the first
    read twice."""
    peers = [q for q in range(3) if q != rank]
    counts = [0 if q == rank else 2 for q in range(3)]
    return PartAccess(
        rank=rank,
        num_inner=10,
        num_boundary=4,
        inner_edges=20,
        reuse_H=np.array([2, 1, 2, 1]),
        owner_H=np.array([peers[0], peers[0], peers[1], peers[1]]),
        send_counts=counts,
        recv_counts=counts,
        rows_reading_halo=3,
        rows_reading_peer=[0 if q == rank else 2 for q in range(3)],
    )


def three_workers(slow_reader_mapped: float) -> HardwareProfile:
    """`hardware()` for three workers with fast passes and a 50 ms gloo message (so reading
    in place pays), rank 0 reading in place at `slow_reader_mapped` edges/s against 2000 for
    local rows (the others as fast as locally)."""
    data: dict[str, Any] = hardware().model_dump(mode="json")
    data["world_size"] = 3
    for compute in [data["compute"]] + [r["compute"] for r in data["ranks"]]:
        compute["pass_bytes_per_s"] = [1e9, 1e9]
    data["ranks"] = [{**data["ranks"][0], "rank": r} for r in range(3)]
    for name in ("gloo", "shm"):
        link = data["links"][name]
        link["concurrent"]["latency_s"] = 0.05 if name == "gloo" else 0.0
        fit = {k: v for k, v in link["pairs"][0].items() if k != "ranks"}
        link["pairs"] = [{"ranks": [a, b], **fit} for a, b in ((0, 1), (0, 2), (1, 2))]
        link["pairs"] = [{**p, "latency_s": link["concurrent"]["latency_s"]} for p in link["pairs"]]
    data["links"]["in_place"] = {
        "widths": [4, 16],
        "working_bytes": 1 << 20,
        "local_edges_per_s": [[2000.0, 2000.0]] * 3,
        "mapped_edges_per_s": [[slow_reader_mapped] * 2, [2000.0] * 2, [2000.0] * 2],
    }
    return HardwareProfile.model_validate(data)


def test_equal_readers_read_every_row_in_place() -> None:
    accesses = [part3(r) for r in range(3)]
    made = make_plan(NO_REPLICAS, accesses, SHAPE, three_workers(2000.0), KEYS, reach=ONE_HOST)
    assert made.every_row == [[1, 2], [0, 2], [0, 1]]
    assert made.transport == [[None, "published-rows", "published-rows"],
                              ["published-rows", None, "published-rows"],
                              ["published-rows", "published-rows", None]]  # fmt: skip


def test_pairs_switch_one_by_one_where_the_step_gets_faster() -> None:
    """From every pair reading every row in place, with rank 0 reading in place 50x slower
    than local rows (its probe said so): its own pairs switch to the process group (it set
    the pace); its peers keep reading its rows in place, as each reads the gradients of the
    rows it read in the forward (gradients travel as rows), never rank 0 theirs."""
    accesses = [part3(r) for r in range(3)]
    hw = three_workers(40.0)
    decision = Decision([RankCache() for _ in range(3)], [1, 1], None)
    start = Reach(ONE_HOST.published, every_row=True)
    reach, pred = per_pair(accesses, decision, SHAPE, hw, start)
    assert reach.every().tolist() == [[False, False, False], [True, False, True],
                                      [True, True, False]]  # fmt: skip
    before = predict(accesses, decision.caches, SHAPE, hw, "leo", [1, 1], start)
    assert pred.epoch_time_s < before.epoch_time_s / 2
    assert pred == predict(accesses, decision.caches, SHAPE, hw, "leo", [1, 1], reach)


def test_a_slow_reader_keeps_the_process_group() -> None:
    """Rank 0 reads in place 50x slower than local rows (its probe said so): the plan keeps
    rank 0 from reading in place, and the two fast readers read every row of each other and
    of rank 0 in place (the backward reads the gradients of the same rows); the plan's
    `transport` and `levels` describe the same pairs."""
    accesses = [part3(r) for r in range(3)]
    made = make_plan(NO_REPLICAS, accesses, SHAPE, three_workers(40.0), KEYS, reach=ONE_HOST)
    assert made.every_row == [[], [0, 2], [0, 1]]
    every = np.zeros((3, 3), dtype=bool)
    for r, owners in enumerate(made.every_row):
        every[r, owners] = True
    assert made.transport == transports(accesses, made.caches, Reach(ONE_HOST.published, every))
    assert made.transport == [[None, "process-group", "process-group"],
                              ["published-rows", None, "published-rows"],
                              ["published-rows", "published-rows", None]]  # fmt: skip
    assert made.levels is not None and [lv["in_place"] for lv in made.levels] == [0, 4, 4]
    # Every pair alike (all L3 rows only, or all every row) is predicted slower.
    for uniform in (False, True):
        alike = predict(accesses, made.caches, SHAPE, three_workers(40.0), "leo", made.num_chunks,
                        Reach(ONE_HOST.published, uniform))  # fmt: skip
        assert made.predicted["leo"] is not None
        assert alike.epoch_time_s > made.predicted["leo"] or sum(
            r["busy_s"] for r in alike.per_rank
        ) > sum(r["busy_s"] for r in made.ranks_s["leo"])


def test_a_plan_for_a_mode_reading_nothing_in_place_prices_the_others_as_they_run() -> None:
    """A plan made for a mode that reads nothing in place (`blocking`: no reach of its own)
    prices the modes that read in place with the rows they would read so (`priced`): with
    the same levels (none here), `fine-grained`'s buffers and steps are those of the plan it
    runs with (made for `leo`, whose reach it shares), not those of a row per reading edge
    travelling; `blocking` and `shared-memory` are priced alike either way."""
    accesses = [part3(r) for r in range(3)]
    hw = three_workers(2000.0)
    none = Reach.none(3)
    own = make_plan(NO_REPLICAS, accesses, SHAPE, hw, KEYS, reach=ONE_HOST)
    other = make_plan(NO_REPLICAS, accesses, SHAPE, hw, KEYS, reach=none, priced=ONE_HOST)
    alone = make_plan(NO_REPLICAS, accesses, SHAPE, hw, KEYS, reach=none)
    assert [c.l3_rows.size + c.replica_rows.size for c in own.caches + other.caches] == [0] * 6
    fg = "fine-grained"
    assert other.buffer_bytes[fg] == own.buffer_bytes[fg] < alone.buffer_bytes[fg]
    assert other.predicted_run[fg] == own.predicted_run[fg]
    assert other.predicted[fg] == own.predicted[fg]
    for mode in ("blocking", "shared-memory"):
        assert other.buffer_bytes[mode] == alone.buffer_bytes[mode]
        assert other.predicted_run[mode] == alone.predicted_run[mode]
        assert other.predicted[mode] == alone.predicted[mode]


def test_a_plans_inputs_name_the_rows_modes_that_read_in_place_are_priced_with() -> None:
    """`blocking` reads nothing in place, yet its plan prices `fine-grained` with the rows
    `fine-grained` reads in place under the same settings; with none readable
    (`pipeline.transport=process-group`) the plan prices other figures, under another key.
    A plan whose own mode reads in place keeps the key it had."""
    meta = {"num_parts": 3, "files": {"part0": "x"}}

    def inputs(*overrides: str) -> PlanInputs:
        return PlanInputs.of(load_config(None, ["partition.num_parts=3", *overrides]), meta)

    blocking, fine = inputs("pipeline.mode=blocking"), inputs("pipeline.mode=fine-grained")
    assert fine.priced is not None and blocking.priced is not None
    assert not blocking.reach.published.any()
    assert blocking.priced.published.tolist() == fine.reach.published.tolist()
    assert blocking.priced.published.any() == (platform.machine().lower() in ORDERED_STORES)
    group = inputs("pipeline.mode=blocking", "pipeline.transport=process-group")
    assert group.priced is not None and not group.priced.published.any()
    assert (group.graph != blocking.graph) == bool(blocking.priced.published.any())
    for mode in ("fine-grained", "leo", "auto"):  # the key they had, without `priced`
        cfg = load_config(None, ["partition.num_parts=3", f"pipeline.mode={mode}"])
        own = inputs(f"pipeline.mode={mode}")
        chunks = cfg.pipeline.num_chunks
        assert own.graph == graph_inputs(meta, cfg.model, dtype_key(cfg), chunks, own.reach)
