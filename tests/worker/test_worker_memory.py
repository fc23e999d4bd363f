"""What a worker holds stays single: features on the part's file map, one copy of each CSR
and of the pipelined inner block, no whole CSR beside the column blocks unless attention
needs it (structure checks on small graphs, no memory thresholds)."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import random_graph
from helpers.ranks import spawn_ranks, spec_levels

from leo_cli.comm.exchange import CommStats
from leo_cli.comm.levels import (
    InPlaceSetting,
    Levels,
    RankLevels,
    build_levels,
    level_of_rows,
    rows_of,
    view_of_layer,
)
from leo_cli.comm.modes import Wiring, make_layer_aggregators
from leo_cli.config import load_config
from leo_cli.graph.layout import build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.storage import read_part, write_partitions
from leo_cli.graph.types import DatasetInfo
from leo_cli.models.local_graph import part_adjacency
from leo_cli.registry import mode_of
from leo_cli.worker.assemble import assemble, every_row_l3, halo_plan, views_leave_the_part
from leo_cli.worker.step import WorkerData


def layered(first, rest, chunks, **kwargs):  # type: ignore[no-untyped-def]
    """The pipelined (leo) aggregators of two views, as a worker builds them."""
    wiring = Wiring(CommStats(), torch.zeros(0), 4, torch.float32)
    return make_layer_aggregators(mode_of("leo"), first, rest, wiring, chunks, **kwargs)


def mapped_part(tmp_path: Path, rank: int = 0):  # type: ignore[no-untyped-def]
    g = random_graph(num_nodes=80, num_edges=400, seed=3)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    write_partitions(tmp_path / "partitions", parts, {"num_parts": 2})
    return read_part(tmp_path / "partitions", rank, mmap=True)


def test_features_stay_on_the_parts_file_map(tmp_path: Path) -> None:
    part = mapped_part(tmp_path)
    data = WorkerData.from_part(part, 10, torch.float32, torch.device("cpu"))
    assert np.shares_memory(data.x_NF.numpy(), part.x)
    assert torch.equal(data.x_NF, torch.from_numpy(np.array(part.x)))
    # A dtype change still converts (the map is never written through).
    wide = WorkerData.from_part(part, 10, torch.float64, torch.device("cpu"))
    assert not np.shares_memory(wide.x_NF.numpy(), part.x)


def test_views_without_other_levels_are_the_parts_own(tmp_path: Path) -> None:
    part = mapped_part(tmp_path)
    plan = halo_plan(part, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    no_levels = RankLevels(static_aggregate=False, replica_rows=[], l3_rows=[])
    for layer0 in (True, False):
        level_H = level_of_rows(plan.num_halo, rows_of(no_levels, adj.device), layer0)
        view_adj, view_plan = view_of_layer(adj, plan, level_H)
        assert view_adj is adj and view_plan is plan


def test_a_part_read_forward_only_gets_its_transpose_where_a_view_is_it(
    tmp_path: Path,
) -> None:
    """A part's CSR built forward-only (its views were expected to replace it) gets the
    transpose `from_arrays` builds where a view turns out to be the CSR itself, one object
    for both views that were; a view that replaced it is left as it is."""
    part = mapped_part(tmp_path)
    plan = halo_plan(part, torch.device("cpu"))
    full = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"), transpose=False)
    assert adj.t_perm.numel() == 0 and adj.num_edges > 0
    levels = Levels((adj, plan), (adj, plan), None, None)
    levels.transpose_whole(adj)
    got = levels.layer0[0]
    assert got is levels.others[0] and levels.layer0[1] is plan
    for name in ("indptr", "indices", "values", "t_indptr", "t_indices", "t_perm"):
        a, b = getattr(got, name), getattr(full, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert got.t_max_degree == full.t_max_degree
    view = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"), transpose=False)
    apart = Levels((view, plan), (adj, plan), None, None)
    apart.transpose_whole(adj)
    assert apart.layer0[0] is view and apart.others[0] is not adj
    assert apart.others[0].t_perm.shape[0] == adj.num_edges


def test_the_part_is_read_forward_only_only_where_views_replace_it() -> None:
    """`views_leave_the_part`: rows read in place, no replicas here and no attention; a
    worker without in-place reads, without levels, with replicas or with attention keeps
    the part's transpose."""
    leo = load_config(None, ["pipeline.mode=leo"])
    gat = load_config(None, ["pipeline.mode=leo", "model.name=gat"])
    setting = InPlaceSetting(4, 30.0, CommStats())
    rows = RankLevels(False, [], [1, 2])
    assert views_leave_the_part(leo, rows, setting)
    assert not views_leave_the_part(leo, rows, None)
    assert not views_leave_the_part(leo, None, setting)
    assert not views_leave_the_part(leo, RankLevels(False, [3], [1, 2]), setting)
    assert not views_leave_the_part(gat, rows, setting)


def test_pipelined_layers_share_one_inner_block(tmp_path: Path) -> None:
    part = mapped_part(tmp_path)
    plan = halo_plan(part, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    layer0 = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))  # another view
    chunks = [2]
    agg = layered((layer0, plan), (adj, plan), chunks)
    assert agg.first.inner is agg.rest.inner  # type: ignore[attr-defined]
    # The same CSR and plan for both: one aggregator.
    single = layered((adj, plan), (adj, plan), chunks)
    assert not hasattr(single, "first")
    # The same CSR with another plan (peers send each view's rows by its own plan): two.
    other_plan = dataclasses.replace(plan)
    two = layered((adj, plan), (adj, other_plan), chunks)
    assert two.first.inner is two.rest.inner  # type: ignore[attr-defined]


def test_pipelined_aggregators_build_the_schedules_of_their_layers_only(tmp_path: Path) -> None:
    part = mapped_part(tmp_path)
    plan = halo_plan(part, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    layer0 = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    chunks = [2, 3, 4]
    agg = layered((layer0, plan), (adj, plan), chunks)
    assert set(agg.first._schedules) == {2} and set(agg.rest._schedules) == {3, 4}  # type: ignore[attr-defined]
    one = layered((adj, plan), (adj, plan), chunks)
    assert set(one._schedules) == {2, 3, 4}  # type: ignore[attr-defined]
    static = layered((adj, plan), (adj, plan), chunks, static_layer0=True)
    assert set(static._schedules) == {3, 4}  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="layer 0 is not one"):
        static.schedule(0)  # type: ignore[attr-defined]
    # One chunk count for every layer: the deeper layers' aggregator builds it.
    chunks = [2]
    agg = layered((layer0, plan), (adj, plan), chunks)
    assert set(agg.first._schedules) == set(agg.rest._schedules) == {2}  # type: ignore[attr-defined]


def test_pipelined_aggregator_keeps_the_csr_only_for_attention(tmp_path: Path) -> None:
    part = mapped_part(tmp_path)
    plan = halo_plan(part, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    chunks = [2, 3]
    agg = layered((adj, plan), (adj, plan), chunks)
    assert agg.adj is None  # type: ignore[attr-defined]
    assert [agg.schedule(layer).num_chunks for layer in range(3)] == [2, 3, 3]  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="attention"):
        agg.columns(0)
    gat = layered((adj, plan), (adj, plan), chunks, attention=True)
    assert gat.columns(1)[0] is adj


def test_single_worker_keeps_one_copy_of_the_csr() -> None:
    g = random_graph(num_nodes=60, num_edges=300, seed=4)
    part = build_parts(g, assign_parts(g, 1, "range", 0), 1)[0]
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    chunks = [1]
    agg = layered((adj, None), (adj, None), chunks)
    gat = layered((adj, None), (adj, None), chunks, attention=True)
    for name in ("indptr", "indices", "values"):
        assert getattr(gat.columns(0)[0], name) is getattr(adj, name)
        assert getattr(agg.inner.fwd, name) is getattr(adj, name)  # type: ignore[attr-defined]


def test_job_keeps_no_map_of_the_parts_edges(tmp_path: Path) -> None:
    """The worker drops its part after set-up; only the features' map may outlive it."""
    g = random_graph(num_nodes=80, num_edges=400, seed=5)
    parts = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)
    write_partitions(tmp_path / "partitions", parts, {"num_parts": 1})
    part = read_part(tmp_path / "partitions", 0, mmap=True)
    info = DatasetInfo.of(g)
    edges = [weakref.ref(getattr(part, name)) for name in ("indptr", "indices", "degree")]
    features = weakref.ref(part.x)
    job = assemble(load_config(None, ["pipeline.mode=leo"]), part, info, 1, torch.device("cpu"))
    del part
    gc.collect()
    assert all(ref() is None for ref in edges)
    assert features() is not None and np.shares_memory(job.data.x_NF.numpy(), features())


def _levels_built(rank: int, world: int, root: Path, spec: str) -> Levels:
    """`build_levels` of a GCN worker on part `rank` of `root`, in a gloo group of `world`;
    levels by `spec` (`spec_levels`), or `replicas`: every other halo row replicated, no more."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    part = read_part(root, rank, mmap=True)
    plan = halo_plan(part, torch.device("cpu"))
    adj = part_adjacency(part, "gcn", torch.float32, torch.device("cpu"))
    x = torch.from_numpy(np.array(part.x))
    if spec == "replicas":
        levels = RankLevels(False, list(range(part.num_halo))[::2], [])
    else:
        levels = spec_levels(spec, part)
        assert levels is not None
    ids = torch.from_numpy(np.array(part.halo_nodes))
    return build_levels(adj, plan, x, ids, levels, distributed=True)


def _replicas_of(rank: int, world: int, root: Path) -> tuple[np.ndarray, np.ndarray, int]:
    replicas = _levels_built(rank, world, root, "replicas").replicas
    assert replicas is not None
    x_RF = replicas.x_RF
    held = x_RF.untyped_storage().nbytes() // x_RF.element_size()
    return x_RF.numpy().copy(), replicas.ids_R.numpy(), held


@pytest.mark.dist
def test_replica_rows_hold_no_copy_of_the_inner_rows(tmp_path: Path) -> None:
    g = random_graph(num_nodes=80, num_edges=400, seed=6)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    write_partitions(tmp_path / "partitions", parts, {"num_parts": 2})
    for x_RF, ids_R, held in spawn_ranks(_replicas_of, 2, tmp_path / "partitions"):
        assert len(ids_R) > 0 and held == x_RF.size  # its own buffer, not a slice of [x | x_R]
        np.testing.assert_array_equal(x_RF, g.x_NF[ids_R])


def _views_of(rank: int, world: int, root: Path) -> tuple[bool, bool]:
    # Part 0 replicates rows at layer 0; both fetch every fourth row per edge.
    built = _levels_built(rank, world, root, "uneven")
    return built.layer0[0] is built.others[0], built.layer0[1] is built.others[1]


@pytest.mark.dist
def test_layers_share_the_view_csr_without_replicas(tmp_path: Path) -> None:
    g = random_graph(num_nodes=80, num_edges=400, seed=6)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    write_partitions(tmp_path / "partitions", parts, {"num_parts": 2})
    with_replicas, without = spawn_ranks(_views_of, 2, tmp_path / "partitions")
    assert with_replicas == (False, False)  # two views
    assert without == (True, False)  # one CSR, a plan per view (peers' views differ)


def _segment_widths(rank: int, world: int, parts: list[Any], info: Any) -> list[int]:
    """The row width each mode's segments are reserved at: `leo`'s published rows (every
    same-host row read in place) and `shared-memory`'s rows, with and without input
    dropout on a plan holding the static aggregate."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    widths = []
    for dropout in ("0.0", "0.5"):
        common = [f"model.input_dropout={dropout}", "model.hidden_channels=16"]
        leo = load_config(None, ["pipeline.mode=leo", "pipeline.transport=shared-memory", *common])
        cache = spec_levels("static", parts[rank])
        job = assemble(leo, parts[rank], info, world, torch.device("cpu"), cache)
        in_place = job.graph.aggregator.in_place  # type: ignore[attr-defined]
        widths.append(in_place.rows.layouts[rank].width)
        shm = load_config(None, ["pipeline.mode=shared-memory", *common])
        job = assemble(shm, parts[rank], info, world, torch.device("cpu"), cache)
        widths.append(job.graph.aggregator.transport.width)  # type: ignore[attr-defined]
    return widths


@pytest.mark.dist
def test_segments_leave_out_the_width_of_a_static_layer_0() -> None:
    """24 features -> 16 -> 3 classes: layer 0 moves 16 columns, layer 1 three. Where the
    static aggregate serves layer 0 (no input dropout) its rows never move, and the
    segments are reserved at layer 1's width, as the buffer estimate prices them."""
    g = random_graph(num_nodes=80, num_edges=400, num_features=24, num_classes=3, seed=6)
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    for widths in spawn_ranks(_segment_widths, 2, parts, DatasetInfo.of(g)):
        assert widths == [3, 3, 16, 16]


def test_a_per_edge_mode_lists_every_halo_row_as_a_tensor() -> None:
    """Every halo row L3 but the replicas, as one int64 tensor (no Python int per row),
    which the levels read as they read a plan's list."""
    levels = every_row_l3(RankLevels(True, [1, 3], []), 6)
    assert levels.static_aggregate and levels.replica_rows == [1, 3]
    assert isinstance(levels.l3_rows, torch.Tensor) and levels.l3_rows.dtype == torch.int64
    assert levels.l3_rows.tolist() == [0, 2, 4, 5]
    l3_H, replica_H = rows_of(levels, torch.device("cpu"))
    assert l3_H.tolist() == [0, 2, 4, 5] and replica_H.tolist() == [1, 3]
    bare = every_row_l3(None, 4)
    assert not bare.static_aggregate and bare.l3_rows.tolist() == [0, 1, 2, 3]  # type: ignore[union-attr]
