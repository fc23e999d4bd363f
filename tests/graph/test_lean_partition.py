"""The lean partition path (issue 13) against straightforward references on small graphs:
int32 ids, in-place symmetrisation, chunk-size independence, METIS input, part-by-part
writing, mapped graphs and parts, stage progress and memory report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import random_graph

from leo_cli.config.schema import DataConfig, PartitionConfig, SyntheticConfig
from leo_cli.errors import ConfigError
from leo_cli.graph import layout, partitioners, types
from leo_cli.graph.datasets import synthetic
from leo_cli.graph.layout import LocalPart, build_parts, local_index
from leo_cli.graph.partition_cache import (
    defaulted_options,
    ensure_partitions,
    metis_note,
    source_key,
)
from leo_cli.graph.partitioners import GraphSize, assign_parts, metis_input
from leo_cli.graph.storage import read_part, spill_graph, write_partitions
from leo_cli.graph.types import Graph, IntArray, id_dtype, symmetrize

SMALL = SyntheticConfig(num_nodes=3000, avg_degree=12, num_features=6, num_classes=5)


def reference_symmetrize(edge_index: np.ndarray, num_nodes: int) -> IntArray:
    """Concatenate both directions, drop loops, np.unique: the obvious way, int64."""
    src, dst = edge_index.astype(np.int64)
    keep = src != dst
    both = np.concatenate([dst[keep] * num_nodes + src[keep], src[keep] * num_nodes + dst[keep]])
    key = np.unique(both)
    return np.stack([key % num_nodes, key // num_nodes])


def reference_part(g: Graph, parts_N: IntArray, rank: int) -> dict[str, np.ndarray]:
    """One part built edge by edge from its definition (inner, halo, boundary), int64."""
    src, dst = g.edge_index_2E.astype(np.int64)
    owner_local = local_index(parts_N, int(parts_N.max()) + 1)
    inner = np.flatnonzero(parts_N == rank)
    mine = parts_N[dst] == rank
    s, d = src[mine], dst[mine]
    remote = parts_N[s] != rank
    halo = np.array(sorted(set(s[remote].tolist()), key=lambda v: (parts_N[v], v)), dtype=np.int64)
    col_of = {int(v): len(inner) + i for i, v in enumerate(halo)}
    cols = np.array([col_of[v] if r else owner_local[v] for v, r in zip(s, remote, strict=True)])
    rows = owner_local[d]
    order = np.lexsort((cols, rows))
    degree = g.degree()
    col_degree = np.concatenate([degree[inner], degree[halo]])
    weight = 1.0 / np.sqrt((col_degree[cols[order]] + 1.0) * (degree[inner][rows[order]] + 1.0))
    return {
        "inner_nodes": inner,
        "halo_nodes": halo,
        "indptr": np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(inner)))]),
        "indices": cols[order],
        "edge_weight": weight.astype(np.float32),
        "x": g.x_NF[inner],
    }


def test_ids_are_int32_when_they_fit() -> None:
    assert id_dtype(2**31 - 1) == np.int32
    assert id_dtype(2**31) == np.int64
    g = synthetic.generate(SMALL, seed=0)
    assert g.edge_index_2E.dtype == np.int32
    assert symmetrize(np.array([[0, 1], [1, 2]]), 3).dtype == np.int32


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_symmetrize_matches_reference(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(types, "CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    edges = rng.integers(0, 50, (2, 400))  # many duplicates, both directions, self-loops
    ours = symmetrize(edges, 50)
    assert np.array_equal(ours, reference_symmetrize(edges, 50))


def test_generator_does_not_depend_on_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = synthetic.generate(SMALL, seed=3)
    for module in (types, synthetic):
        monkeypatch.setattr(module, "CHUNK", 1000)
    chunked = synthetic.generate(SMALL, seed=3)
    assert whole.fingerprint() == chunked.fingerprint()


def test_fingerprint_ignores_id_width() -> None:
    g = synthetic.generate(SMALL, seed=1)
    wide = Graph(**{**vars(g), "edge_index_2E": g.edge_index_2E.astype(np.int64)})
    assert g.fingerprint() == wide.fingerprint()
    # The hash is the one of the int64 bytes, as earlier versions computed it.
    h = hashlib.sha256(g.name.encode())
    for a in (wide.edge_index_2E, g.x_NF, g.y_N, g.train_mask_N, g.val_mask_N, g.test_mask_N):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    assert g.fingerprint() == h.hexdigest()


def test_metis_input_is_the_sorted_adjacency() -> None:
    g = random_graph(num_nodes=60, num_edges=400, seed=5)
    inputs = metis_input(g)
    src, dst = g.edge_index_2E
    order = np.lexsort((dst, src))  # neighbours of each node, by source then target
    assert np.array_equal(inputs.adjacent, dst[order])
    assert np.array_equal(np.diff(inputs.starts), np.bincount(src, minlength=60))
    assert np.array_equal(inputs.vweights, 1 + g.degree())
    shuffled = Graph(**{**vars(g), "edge_index_2E": g.edge_index_2E[:, ::-1].copy()})
    assert np.array_equal(metis_input(shuffled).adjacent, inputs.adjacent)


@pytest.mark.parametrize("num_parts", [2, 3])
def test_parts_match_reference(num_parts: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = synthetic.generate(SMALL, seed=2)
    parts_N = assign_parts(g, num_parts, "metis", seed=0)
    monkeypatch.setattr(layout, "CHUNK", 500)
    parts = build_parts(g, parts_N, num_parts)
    for part in parts:
        for name, expected in reference_part(g, parts_N, part.rank).items():
            got = getattr(part, name)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), name
    assert all(p.indices.dtype == np.int64 for p in parts)  # on-disk format unchanged


def test_stage_writes_what_the_in_memory_path_writes(tmp_path: Path) -> None:
    data = DataConfig(synthetic=SMALL)
    part = PartitionConfig(num_parts=3)
    events: list[tuple[str, int, int]] = []
    result = ensure_partitions(
        data, part, 0, tmp_path / "lean", progress=lambda *e: events.append(e)
    )
    g = synthetic.generate(SMALL, seed=0)
    parts = build_parts(g, assign_parts(g, 3, "metis", 0), 3)
    write_partitions(tmp_path / "plain", parts, {"num_parts": 3})
    plain = json.loads((tmp_path / "plain" / "META.json").read_text())["files"]
    assert list(result.meta["files"].items()) == list(plain.items())
    # No scratch copy of the graph survives; every stage reported before it finished.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lean", "plain"]
    assert sorted(p.name for p in (tmp_path / "lean").iterdir()) == ["partitions"]
    for stage in ("load", "partition", "layout"):
        first = next(e for e in events if e[0] == stage)
        assert first[1] == 0, f"{stage} reported only when done"
    peaks = result.meta["peak_rss_gb"]
    assert set(peaks) == {"load", "partition", "layout"} and min(peaks.values()) > 0


def test_spilled_graph_is_mapped_and_equal(tmp_path: Path) -> None:
    g = random_graph(num_nodes=40, num_edges=100, seed=0)
    mapped = spill_graph(g, tmp_path / "g")
    assert isinstance(mapped.edge_index_2E, np.memmap) and isinstance(mapped.x_NF, np.memmap)
    assert mapped.fingerprint() == g.fingerprint()


def test_mapped_part_is_writable_but_leaves_the_file(tmp_path: Path) -> None:
    g = random_graph(num_nodes=40, num_edges=100, seed=0)
    write_partitions(tmp_path, build_parts(g, assign_parts(g, 2, "range", 0), 2), {"num_parts": 2})
    part: LocalPart = read_part(tmp_path, 1, mmap=True)
    assert isinstance(part.x, np.memmap) and part.x.flags.writeable
    before = part.x.copy()
    part.x[:] = -1.0  # copy-on-write: private pages, the file is untouched
    assert np.array_equal(read_part(tmp_path, 1).x, before)


def test_edges_not_sorted_by_target_are_sorted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitioners, "CHUNK", 3)
    g = random_graph(num_nodes=30, num_edges=80, seed=4)
    assert partitioners.edges_by_target(g) is g.edge_index_2E
    reversed_g = Graph(**{**vars(g), "edge_index_2E": g.edge_index_2E[:, ::-1]})
    assert np.array_equal(partitioners.edges_by_target(reversed_g), g.edge_index_2E)


def test_metis_edge_sample_is_symmetric_and_sized(monkeypatch: pytest.MonkeyPatch) -> None:
    g = synthetic.generate(SMALL, seed=0)
    src, dst = g.edge_index_2E
    degree = g.degree()
    whole_keep, whole_weights = partitioners.sampled_edges(src, dst, degree, 0.5, seed=1)
    monkeypatch.setattr(partitioners, "CHUNK", 1000)  # blocks do not change the sample
    keep, weights = partitioners.sampled_edges(src, dst, degree, 0.5, seed=1)
    assert np.array_equal(keep, whole_keep) and np.array_equal(weights, whole_weights)
    assert weights.dtype == np.int64 and weights.shape[0] == keep.sum() and weights.min() >= 1
    pairs = zip(src[keep].tolist(), dst[keep].tolist(), strict=True)
    kept = dict(zip(pairs, weights.tolist(), strict=True))
    assert all(kept.get((d, s)) == w for (s, d), w in kept.items())  # both ways, same weight
    assert 0.45 < keep.mean() < 0.55
    again, _ = partitioners.sampled_edges(src, dst, degree, 0.5, seed=2)
    assert not np.array_equal(keep, again)
    inputs = metis_input(g, 0.5, seed=1)
    assert inputs.adjacent.shape[0] == keep.sum() and inputs.starts[-1] == keep.sum()
    assert np.array_equal(inputs.eweights, weights)  # kept in the adjacency's order
    assert np.array_equal(inputs.vweights, 1 + g.degree())  # balance still counts every edge
    assert metis_input(g).eweights is None  # exact METIS: unweighted, as before


def test_metis_edge_sample_thins_hub_edges_and_weighs_them_up() -> None:
    g = synthetic.generate(SMALL, seed=0)
    src, dst = g.edge_index_2E.astype(np.int64)
    degree = g.degree().astype(np.int64)
    low = np.minimum(degree[src], degree[dst])
    scale = partitioners.keep_scale(src, dst, degree, 0.4)
    assert np.minimum(1.0, scale / low).mean() == pytest.approx(0.4, rel=1e-6)
    keep, weights = partitioners.sampled_edges(src, dst, degree, 0.4, seed=3)
    assert keep[low <= scale].all()  # every edge of a node of low degree stays
    assert 0 < keep[low > 2 * scale].mean() < 0.6  # hub-to-hub edges are thinned
    prob = np.minimum(1.0, scale / low[keep])
    assert np.array_equal(weights, np.rint(partitioners.EDGE_WEIGHT_SCALE / np.sqrt(prob)))
    assert (weights[prob == 1] == partitioners.EDGE_WEIGHT_SCALE).all()
    assert weights.max() > partitioners.EDGE_WEIGHT_SCALE  # thinned edges count for more


def test_sampled_metis_input_still_partitions_every_edge(tmp_path: Path) -> None:
    part = PartitionConfig(num_parts=3, metis_edge_fraction=0.5)
    result = ensure_partitions(DataConfig(synthetic=SMALL), part, 0, tmp_path)
    stats = result.meta["stats"]
    assert sum(stats["edges"]) == result.meta["dataset"]["num_edges"]
    assert stats["balance"] < 1.1
    exact = ensure_partitions(
        DataConfig(synthetic=SMALL), PartitionConfig(num_parts=3), 0, tmp_path
    )
    assert exact.meta["source_key"] != result.meta["source_key"]


def test_metis_memory_model_fits_the_limit_to_two_decimals() -> None:
    size = GraphSize.of(synthetic.generate(SMALL, seed=0))
    exact = partitioners.projected_metis_gb(size, 1.0)
    assert partitioners.metis_edge_fraction(size, 1.0, None) == 1.0
    assert partitioners.metis_edge_fraction(size, 1.0, exact) == 1.0  # fits exactly: no sample
    assert partitioners.metis_edge_fraction(size, 0.7, exact * 2) == 0.7  # never above the ask
    limit = partitioners.projected_metis_gb(size, 0.537)
    fraction = partitioners.metis_edge_fraction(size, 1.0, limit)
    assert fraction == 0.53
    assert partitioners.projected_metis_gb(size, fraction) <= limit
    assert partitioners.projected_metis_gb(size, fraction + 0.01) > limit
    assert partitioners.metis_edge_fraction(size, 0.4, limit) == 0.4


def test_metis_memory_model_grows_with_edges_and_log_nodes() -> None:
    small = GraphSize.of(synthetic.generate(SMALL, seed=0))
    denser = GraphSize.of(synthetic.generate(SMALL.model_copy(update={"avg_degree": 24}), seed=0))
    projected = partitioners.projected_metis_gb
    assert projected(denser, 1.0) > projected(small, 1.0)
    per_edge = partitioners.metis_bytes_per_edge
    assert per_edge(2_400_000) > per_edge(600_000) > per_edge(100_000) == per_edge(1000) == 100


def test_metis_memory_limit_too_small_is_one_sentence() -> None:
    size = GraphSize.of(synthetic.generate(SMALL, seed=0))
    tiny = partitioners.projected_metis_gb(size, 0.05)
    with pytest.raises(ConfigError, match=r"partition\.metis_memory_gb=.* too small .*raise it"):
        partitioners.metis_edge_fraction(size, 1.0, tiny, "small")
    # Asked for less than a tenth: the message speaks of that share.
    with pytest.raises(ConfigError, match="even on 2% of its edges"):
        partitioners.metis_edge_fraction(size, 0.02, partitioners.projected_metis_gb(size, 0.01))
    no_edges = GraphSize(num_nodes=10**6, num_edges=0, feature_bytes=4 * 10**8)
    with pytest.raises(ConfigError, match="too small"):
        partitioners.metis_edge_fraction(no_edges, 1.0, 0.1)


def test_memory_limit_samples_as_the_fraction_would_and_says_so(tmp_path: Path) -> None:
    data = DataConfig(synthetic=SMALL)
    size = GraphSize.of(synthetic.generate(SMALL, seed=0))
    limit = partitioners.projected_metis_gb(size, 0.6)
    limited = ensure_partitions(
        data, PartitionConfig(num_parts=3, metis_memory_gb=limit), 0, tmp_path / "limited"
    )
    plan = limited.meta["metis"]
    assert plan["edge_fraction"] == 0.6 and plan["requested_edge_fraction"] == 1.0
    assert plan["projected_gb"] <= limit < plan["exact_projected_gb"]
    note = metis_note(limited.meta)
    assert note is not None and "60% of the edges" in note and "for exact METIS." in note
    assert note.endswith(".") and ". " not in note  # one sentence
    asked = ensure_partitions(
        data, PartitionConfig(num_parts=3, metis_edge_fraction=0.6), 0, tmp_path / "asked"
    )
    assert metis_note(asked.meta) is None  # the user asked for the sample: nothing to say
    for rel in limited.meta["files"]:
        a = (tmp_path / "limited" / "partitions" / rel).read_bytes()
        assert a == (tmp_path / "asked" / "partitions" / rel).read_bytes(), rel
    lowered = ensure_partitions(
        data,
        PartitionConfig(num_parts=3, metis_edge_fraction=0.8, metis_memory_gb=limit),
        0,
        tmp_path / "lowered",
    )
    assert "for METIS on 80% of the edges as asked." in (metis_note(lowered.meta) or "")


def test_partitions_built_under_another_memory_plan_are_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, part = DataConfig(synthetic=SMALL), PartitionConfig(num_parts=3)
    first = ensure_partitions(data, part, 0, tmp_path)
    assert first.meta["metis"]["edge_fraction"] == 1.0
    assert ensure_partitions(data, part, 0, tmp_path).reused
    # Exact partitions from before the sampling scheme was recorded are still what it builds.
    meta_path = tmp_path / "partitions" / "META.json"
    meta = json.loads(meta_path.read_text())
    del meta["metis"]["sampling"]
    meta_path.write_text(json.dumps(meta))
    assert ensure_partitions(data, part, 0, tmp_path).reused
    # The same config under a model (or version) that no longer fits exact METIS in 8 GB:
    # the key is unchanged, the exact partitions on disk are not what it would build.
    monkeypatch.setattr(partitioners, "metis_bytes_per_edge", lambda n: 1e6)
    again = ensure_partitions(data, part, 0, tmp_path)
    assert not again.reused and again.meta["source_key"] == first.meta["source_key"]
    assert again.meta["metis"]["edge_fraction"] < 1.0
    assert ensure_partitions(data, part, 0, tmp_path).reused
    # Sampled partitions from before the sample was weighted (no scheme in META) are rebuilt.
    meta = json.loads(meta_path.read_text())
    del meta["metis"]["sampling"]
    meta_path.write_text(json.dumps(meta))
    assert not ensure_partitions(data, part, 0, tmp_path).reused


def test_default_memory_limit_keeps_small_graphs_exact_and_their_key(tmp_path: Path) -> None:
    data = DataConfig(synthetic=SMALL)
    part = PartitionConfig(num_parts=3)
    result = ensure_partitions(data, part, 0, tmp_path)
    assert result.meta["metis"]["edge_fraction"] == 1.0 and metis_note(result.meta) is None
    unlimited = part.model_copy(update={"metis_memory_gb": None})
    assert source_key(data, unlimited, 0) != result.meta["source_key"]
    # The key of the defaults is the key partitions had before the METIS options (and the
    # part weights and owners file) existed.
    old_payload = {"num_parts": 3, "method": "metis"}
    assert part.model_dump(mode="json", exclude=defaulted_options(part)) == old_payload
