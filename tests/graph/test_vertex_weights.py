"""What a node weighs when the parts are unequal: the cost model's seconds per node and per
in-edge (the `cost` rule) as METIS's vertex weights and the blocks of `range`; uniform parts
kept exactly as before (1 + in-degree); partitions rebuilt under another rule; measured shares
and vertex weights in one measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import hardware_dict, random_graph
from test_part_weights import slower

from leo_cli.config import load_config
from leo_cli.config.schema import DataConfig, ModelConfig, PartitionConfig
from leo_cli.graph import partition_cache as stage
from leo_cli.graph.datasets import load_dataset
from leo_cli.graph.partition_cache import Weigher, ensure_partitions, source_key
from leo_cli.graph.partitioners import (
    WEIGHT_TOTAL_LIMIT,
    WorkMeasure,
    assign_parts,
    metis_input,
    metis_parts,
)
from leo_cli.graph.storage import read_part
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.launch.stages import needs_profile, run_partitions
from leo_cli.planner.make import model_shape
from leo_cli.planner.plan import static_layer0
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.weights import halo_less_busy, measured_weights, work_costs

DATA = DataConfig.model_validate({"synthetic": {"num_nodes": 600, "num_features": 8}})


def profile(world_size: int = 2) -> HardwareProfile:
    return HardwareProfile.model_validate(hardware_dict(world_size))


def costs(hidden: int, static: bool) -> tuple[float, float]:
    """Per-node and per-edge seconds of a 2-layer GCN (64 features, 8 classes, no input
    dropout: layer 0 runs on the static aggregate when `static`)."""
    shape = model_shape(ModelConfig(hidden_channels=hidden, input_dropout=0.0), 64, 8, 4)
    return work_costs(profile(), shape, 2000, 40000, static)


def cost_weigher(key: str, per_node: float, per_edge: float) -> Weigher:
    return Weigher(key, work=lambda g: WorkMeasure("cost", per_node, per_edge))


def two_densities(num_nodes: int = 2000, seed: int = 0) -> Graph:
    """A graph whose first half is sparse (about 2 in-edges a node) and second half dense
    (about 40): a node-balanced split and an edge-balanced one differ."""
    rng = np.random.default_rng(seed)
    half = num_nodes // 2
    sparse = rng.integers(0, half, size=(2, half))
    dense = rng.integers(half, num_nodes, size=(2, 20 * half))
    bridges = np.stack([rng.integers(0, half, 50), rng.integers(half, num_nodes, 50)])
    g = random_graph(num_nodes=num_nodes, num_edges=1)
    edges = symmetrize(np.concatenate([sparse, dense, bridges], axis=1), num_nodes)
    return Graph(
        name="two-densities",
        edge_index_2E=edges,
        x_NF=g.x_NF,
        y_N=g.y_N,
        train_mask_N=g.train_mask_N,
        val_mask_N=g.val_mask_N,
        test_mask_N=g.test_mask_N,
        num_classes=g.num_classes,
    )


def test_work_costs_split_the_cost_models_busy_time() -> None:
    """Seconds per node plus seconds per in-edge give the cost model's busy time of a part of
    the priced size at any edge count (the SpMM is linear in the edges)."""
    hw = profile()
    shape = model_shape(ModelConfig(hidden_channels=32), 64, 8, 4)
    per_node, per_edge = work_costs(hw, shape, 2000, 40000, static=False)
    assert per_node > 0 and per_edge > 0
    for edges in (20000, 60000):
        busy = halo_less_busy(hw, shape, False, [(1000, edges)] * 2)
        assert busy == pytest.approx([per_node * 1000 + per_edge * edges] * 2, rel=1e-9)


def test_a_node_weighs_its_dense_work_plus_its_in_edges() -> None:
    """Integer weights proportional to per_node + per_edge x in-degree (rounding aside), each
    at least 1; the degree rule's are exactly 1 + in-degree."""
    per_node, per_edge = costs(hidden=32, static=False)
    degree = np.array([0, 1, 2, 5, 20, 100, 1000], dtype=np.int64)
    weights = WorkMeasure("cost", per_node, per_edge).vertex_weights(degree)
    assert weights.dtype == np.int64 and weights.min() >= 1
    np.testing.assert_allclose(weights / weights[0], 1 + degree * per_edge / per_node, rtol=1e-3)
    extra = (weights[1:] - weights[0]) / degree[1:]  # what each in-edge adds: the same
    np.testing.assert_allclose(extra, extra[-1], rtol=0.02)
    np.testing.assert_array_equal(
        WorkMeasure("degree", 1.0, 1.0).vertex_weights(degree), 1 + degree
    )


def test_the_weights_total_fits_metis() -> None:
    """On a graph too large for the node unit, weights scale down to a total METIS sums in a
    32-bit index, still at least 1 each."""
    degree = np.full(3_000_000, 50, dtype=np.int64)
    degree[:10] = 0
    weights = WorkMeasure("cost", 1.0, 2.0).vertex_weights(degree)
    assert int(weights.sum()) <= WEIGHT_TOTAL_LIMIT and weights.min() >= 1


def test_wider_models_move_weight_to_the_nodes() -> None:
    """Bigger hidden widths grow the GEMMs (per node), not the SpMM at the exchanged width;
    the static aggregate takes layer 0's SpMM away (less per edge)."""
    small_node, small_edge = costs(hidden=16, static=True)
    big_node, big_edge = costs(hidden=256, static=True)
    assert big_node > small_node
    assert big_node / big_edge > 1.5 * small_node / small_edge
    _, dynamic_edge = costs(hidden=16, static=False)
    assert dynamic_edge > 1.5 * small_edge


def test_uniform_parts_are_the_parts_of_before(tmp_path: Path) -> None:
    """Uniform weights ignore any weigher: the same source key, vertex weights 1 + in-degree,
    the owners METIS gives on them, META saying `degree`."""
    uniform = PartitionConfig(num_parts=2)
    weigher = cost_weigher("hw", 5.0, 1.0)
    assert source_key(DATA, uniform, 0, weigher) == source_key(DATA, uniform, 0, None)
    result = ensure_partitions(DATA, uniform, 0, tmp_path / "run", weigher=weigher)
    assert result.meta["vertex_weights"] == {"rule": "degree", "per_node": 1.0, "per_edge": 1.0}
    graph = load_dataset(DATA, 0)
    inputs = metis_input(graph)
    np.testing.assert_array_equal(inputs.vweights, 1 + graph.degree())
    expected = metis_parts(inputs, 2, 0)
    for rank in range(2):
        inner = read_part(result.path, rank).inner_nodes
        np.testing.assert_array_equal(inner, np.flatnonzero(expected == rank))
    stats = result.meta["stats"]
    work = [n + e for n, e in zip(stats["nodes"], stats["edges"], strict=True)]
    assert result.meta["achieved_shares"] == pytest.approx([w / sum(work) for w in work], abs=1e-6)


def test_parts_are_rebuilt_when_the_rule_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    part = PartitionConfig(num_parts=2, part_weights=[2, 1])

    def ensure(weigher: Weigher | None) -> Any:
        return ensure_partitions(DATA, part, 0, run, weigher=weigher)

    first = ensure(cost_weigher("hw-a", 3.0, 1.0))
    assert not first.reused
    assert first.meta["vertex_weights"] == {"rule": "cost", "per_node": 3.0, "per_edge": 1.0}
    assert ensure(cost_weigher("hw-a", 3.0, 1.0)).reused
    degree = ensure(None)  # no weigher: the degree rule
    assert not degree.reused and degree.meta["vertex_weights"]["rule"] == "degree"
    assert not ensure(cost_weigher("hw-a", 3.0, 1.0)).reused
    assert not ensure(cost_weigher("hw-b", 1.0, 3.0)).reused  # other rates or model
    monkeypatch.setattr(stage, "COST_RULE", "cost, priced another way")
    assert not ensure(cost_weigher("hw-b", 1.0, 3.0)).reused


def test_metis_balances_the_cost_not_the_degree() -> None:
    """Where per-node work dominates, the cost rule gives each part its share of the work and
    of the nodes; the degree rule hands the sparse half's part far more nodes."""
    g = two_densities()
    degree = g.degree()
    measure = WorkMeasure("cost", 40.0, 1.0)
    work = measure.vertex_weights(degree)
    by_cost = assign_parts(g, 2, "metis", 0, weights=[1, 1], work=measure)
    by_degree = assign_parts(g, 2, "metis", 0, weights=[1, 1])
    cost_share = np.bincount(by_cost, weights=work, minlength=2) / work.sum()
    assert cost_share == pytest.approx([0.5, 0.5], abs=0.03)
    nodes_cost = np.bincount(by_cost, minlength=2)
    nodes_degree = np.bincount(by_degree, minlength=2)
    assert nodes_cost.max() / nodes_cost.min() < nodes_degree.max() / nodes_degree.min()
    degree_cost_share = np.bincount(by_degree, weights=work, minlength=2) / work.sum()
    assert abs(degree_cost_share[0] - 0.5) > abs(cost_share[0] - 0.5)


def test_range_sizes_blocks_by_the_work_and_random_needs_no_measure() -> None:
    g = two_densities()
    measure = WorkMeasure("cost", 1.0, 4.0)
    work = measure.vertex_weights(g.degree())
    owners = assign_parts(g, 3, "range", 0, weights=[2, 1, 1], work=measure)
    assert np.all(np.diff(owners) >= 0)  # contiguous blocks
    share = np.bincount(owners, weights=work, minlength=3) / work.sum()
    assert share == pytest.approx([0.5, 0.25, 0.25], abs=work.max() / work.sum())
    nodes = np.bincount(owners, minlength=3) / g.num_nodes
    assert nodes[0] > 0.6  # the sparse half is cheap: its block takes more nodes
    drawn = assign_parts(g, 3, "random", 0, weights=[2, 1, 1], work=measure)
    np.testing.assert_array_equal(drawn, assign_parts(g, 3, "random", 0, weights=[2, 1, 1]))


def test_listed_weights_get_cost_vertex_weights(tmp_path: Path) -> None:
    """Through the stage: a list of weights prices nodes by the run's profile and model, and
    the shares achieved (in that measure) are near the targets."""
    path = tmp_path / "hardware.json"
    profile().write(path)
    args = [
        "data.synthetic.num_nodes=600",
        "data.synthetic.num_features=8",
        "partition.part_weights=[2,1]",
        f"cache.hardware={path}",
    ]
    cfg = load_config(None, args)
    assert needs_profile(load_config(None, [*args, "cache.policy=none"]))  # to price the nodes
    result = run_partitions(cfg, tmp_path / "run")
    meta = result.meta
    ds = meta["dataset"]
    shape = model_shape(cfg.model, ds["num_features"], ds["num_classes"], 4)
    expected = work_costs(profile(), shape, ds["num_nodes"], ds["num_edges"], static_layer0(cfg))
    rule = meta["vertex_weights"]
    assert rule["rule"] == "cost"
    assert (rule["per_node"], rule["per_edge"]) == pytest.approx(expected, rel=1e-12)
    assert meta["achieved_shares"][0] == pytest.approx(2 / 3, abs=0.04)
    assert sum(meta["achieved_node_shares"]) == pytest.approx(1.0, abs=1e-5)


def test_measured_shares_even_out_the_busy_time() -> None:
    """Rank 1 at half rank 0's rates: the measured shares make both ranks' predicted busy time
    on parts of those shares equal, so busy time follows the share."""
    data = hardware_dict(2)
    data["ranks"][1]["compute"] = slower(data["compute"], 2.0)
    hw = HardwareProfile.model_validate(data)
    shape = model_shape(ModelConfig(hidden_channels=32), 64, 8, 4)
    shares = measured_weights(hw, shape, 2000, 40000, static=True)
    sizes = [(round(s * 2000), round(s * 40000)) for s in shares]
    busy = halo_less_busy(hw, shape, True, sizes)
    assert busy[0] == pytest.approx(busy[1], rel=0.01)
    assert shares[0] == pytest.approx(2 / 3, rel=0.01)


def test_one_part_needs_no_weigher(tmp_path: Path) -> None:
    """One part has no shares to size: `measured` there asks for no profile and weighs nodes
    by the degree rule."""
    part = PartitionConfig(num_parts=1, part_weights="measured")
    result = ensure_partitions(DATA, part, 0, tmp_path / "run")
    assert result.meta["vertex_weights"]["rule"] == "degree"
    assert result.meta["part_weights"] is None


def test_only_shares_that_need_the_probe_ask_for_it() -> None:
    """Listed shares weigh nodes by the cost model for METIS and range (the profile prices the
    work); random draws owners by share whatever a node weighs, so only measured shares probe."""

    def part(method: str, weights: str) -> PartitionConfig:
        return load_config(
            None, ["partition.num_parts=3", f"partition.method={method}", weights]
        ).partition

    listed = "partition.part_weights=[2,1,1]"
    assert stage.weighted(part("metis", listed)) and stage.weighted(part("range", listed))
    assert not stage.weighted(part("random", listed))
    assert stage.weighted(part("random", "partition.part_weights=measured"))
    assert not stage.weighted(part("metis", "partition.part_weights=uniform"))
