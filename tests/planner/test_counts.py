"""The cost model's counts come from each part's totals and the rows a cache lists: checked
against a pass over every halo row (what they replaced), for random caches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from leo_cli.graph.layout import build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.planner import cost
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import _Counts, counts_memo
from leo_cli.planner.plan import RankCache
from leo_cli.planner.reach import Reach


def reference(accesses: list[PartAccess], caches: list[RankCache], layer: int, per_edge: bool):
    num = len(accesses)
    recv, edges, per = np.zeros((num, num)), np.zeros(num), np.zeros(num)
    for r, (p, c) in enumerate(zip(accesses, caches, strict=True)):
        l1 = np.zeros(p.num_halo, dtype=bool)
        if layer == 0:
            l1[c.replica_rows] = True
        l3 = np.zeros(p.num_halo, dtype=bool)
        l3[c.l3_rows] = True
        if per_edge:  # every row but the replicas (exchanged once past layer 0: L2 rows)
            l3[:] = True
            l3[c.replica_rows] = False
        recv[r] = np.bincount(p.owner_H, np.where(l3, p.reuse_H, 1) * ~l1, minlength=num)
        edges[r] = p.reuse_H[~l1].sum()
        per[r] = p.reuse_H[l3 & ~l1].sum()
    return recv, edges, per


def graph(seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    n = 120
    return Graph(
        name="g",
        edge_index_2E=symmetrize(rng.integers(0, n, (2, 600)), n),
        x_NF=np.zeros((n, 2), dtype=np.float32),
        y_N=np.zeros(n, dtype=np.int64),
        train_mask_N=np.ones(n, dtype=bool),
        val_mask_N=np.zeros(n, dtype=bool),
        test_mask_N=np.zeros(n, dtype=bool),
        num_classes=2,
    )


def random_parts(seed: int, num: int) -> tuple[list[PartAccess], np.random.Generator]:
    """The accesses of `num` random parts of `graph(seed)`, and a generator for the caches."""
    g = graph(seed)
    parts = build_parts(g, assign_parts(g, num, "random", seed=seed), num)
    return [PartAccess.from_part(p) for p in parts], np.random.default_rng(seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_match_a_pass_over_every_halo_row(seed: int) -> None:
    accesses, rng = random_parts(seed, 3)
    caches = []
    for p in accesses:
        rows = rng.permutation(p.num_halo)
        caches.append(RankCache(False, np.sort(rows[: p.num_halo // 3]), np.sort(rows[5:30])))
    for layer in (0, 1):
        for per_edge in (False, True):
            got = _Counts(accesses, caches, layer, per_edge)
            recv, edges, per = reference(accesses, caches, layer, per_edge)
            np.testing.assert_allclose(got.recv, recv)
            np.testing.assert_allclose(got.halo_edges, edges)
            np.testing.assert_allclose(got.per_edge_edges, per)


def test_profile_counts_distinct_rows() -> None:
    g = graph(3)
    for part in build_parts(g, assign_parts(g, 3, "random", seed=3), 3):
        prof = PartAccess.from_part(part)
        indices, n = np.asarray(part.indices), part.num_inner
        rows = np.repeat(np.arange(n), np.diff(np.asarray(part.indptr)))
        remote = indices >= n
        owner = np.asarray(part.halo_owner)[indices[remote] - n]
        assert prof.num_boundary == np.unique(part.send_idx).shape[0]
        assert prof.rows_reading_halo == np.unique(rows[remote]).shape[0]
        for q in range(3):
            assert prof.rows_reading_peer[q] == np.unique(rows[remote][owner == q]).shape[0]


def reference_reach(
    accesses: list[PartAccess],
    caches: list[RankCache],
    layer: int,
    reach: Reach,
    per_edge: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row by row: a replica serves layer 0 and travels once past it (never read in place);
    another row of an owner publishing to its reader is read in place when the pair reads
    every row (always, in a per-edge mode) or the row is L3; the rest travel, L3 rows (every
    row, in a per-edge mode) once per reading edge."""
    num = len(accesses)
    recv, in_place, edges, per = (np.zeros((num, num)), np.zeros((num, num)), np.zeros(num),
                                  np.zeros(num))  # fmt: skip
    every = reach.every()
    for r, (p, c) in enumerate(zip(accesses, caches, strict=True)):
        reps, l3 = set(c.replica_rows.tolist()), set(c.l3_rows.tolist())
        if per_edge:
            l3 = set(range(p.num_halo))
        for h in range(p.num_halo):
            q, reuse = int(p.owner_H[h]), int(p.reuse_H[h])
            if h in reps:
                recv[r, q] += layer > 0
            elif reach.published[r, q] and (every[r, q] or per_edge or h in l3):
                in_place[r, q] += 1
                edges[r] += reuse
            else:
                recv[r, q] += reuse if h in l3 else 1
                per[r] += reuse if h in l3 else 0
    return recv, in_place, edges, per


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_counts_with_rows_read_in_place_match_a_pass_over_every_halo_row(seed: int) -> None:
    """Random caches (replicas apart from L3 rows, as the policies make them), random pairs
    that publish, and random pairs among them reading every row (`pipeline.transport=auto`
    per pair)."""
    accesses, rng = random_parts(seed, 4)
    caches = []
    for p in accesses:
        rows = rng.permutation(p.num_halo)
        caches.append(RankCache(False, np.sort(rows[:6]), np.sort(rows[6 : 6 + p.num_halo // 3])))
    published = rng.random((4, 4)) < 0.7
    np.fill_diagonal(published, False)
    reach = Reach(published, rng.random((4, 4)) < 0.5)
    for layer, per_edge in itertools.product((0, 1), (False, True)):
        got = _Counts(accesses, caches, layer, per_edge=per_edge, reach=reach)
        recv, in_place, edges, per = reference_reach(accesses, caches, layer, reach, per_edge)
        np.testing.assert_allclose(got.recv, recv)
        np.testing.assert_allclose(got.in_place, in_place)
        np.testing.assert_allclose(got.in_place_edges, edges)
        np.testing.assert_allclose(got.per_edge_edges, per)


def test_memoised_counts_equal_fresh_ones() -> None:
    """Inside `counts_memo` a rank's row is reused for the same part, cache, layer kind, mode
    kind and reach row, and recomputed when any of them changes: every field equals a fresh
    computation, for caches that change one rank at a time (as the policy's trials do)."""
    accesses, rng = random_parts(5, 4)
    published = rng.random((4, 4)) < 0.7
    np.fill_diagonal(published, False)
    reaches = [Reach.none(4), Reach(published, rng.random((4, 4)) < 0.5)]

    def cache(p: PartAccess, count: int) -> RankCache:
        rows = np.arange(p.num_halo)  # L3 rows overlap the replicas (as an edited plan may)
        return RankCache(False, rows[:count], rows[max(count - 2, 0) : count + 5])

    fields = ("recv", "in_place", "halo_edges", "replica_edges", "replica_rows",
              "per_edge_edges", "in_place_edges")  # fmt: skip
    caches = [cache(p, 3) for p in accesses]
    with counts_memo(4):
        for trial in range(12):
            r = trial % 4
            caches[r] = cache(accesses[r], int(rng.integers(0, 8)))
            for layer, per_edge, reach in itertools.product((0, 1), (False, True), reaches):
                memo = _Counts(accesses, caches, layer, per_edge, reach)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(cost, "_memo", None)
                    fresh = _Counts(accesses, caches, layer, per_edge, reach)
                for name in fields:
                    np.testing.assert_array_equal(getattr(memo, name), getattr(fresh, name))
        assert cost._memo  # rows were kept for reuse
    assert cost._memo is None
