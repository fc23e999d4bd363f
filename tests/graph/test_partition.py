"""Partition layout: every edge once with its weight, consistent halos, METIS quality; the
partition stage's staleness key."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import random_graph, write_csv_gz, write_ogb

from leo_cli.config.schema import DataConfig, PartitionConfig
from leo_cli.errors import PartitionError
from leo_cli.graph.datasets import source_files
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.stage import ensure_partitions
from leo_cli.graph.storage import read_meta, read_part, write_partitions


def local_to_global(p: LocalPart) -> np.ndarray:
    return np.concatenate([p.inner_nodes, p.halo_nodes])


def edges_of(parts: list[LocalPart]) -> dict[tuple[int, int], float]:
    """(src, dst) global -> weight, asserting no edge appears twice."""
    seen: dict[tuple[int, int], float] = {}
    for p in parts:
        cols = local_to_global(p)
        rows = np.repeat(np.arange(p.num_inner), np.diff(p.indptr))
        for r, c, w in zip(p.inner_nodes[rows], cols[p.indices], p.edge_weight, strict=True):
            key = (int(c), int(r))
            assert key not in seen, f"edge {key} appears twice"
            seen[key] = float(w)
    return seen


@pytest.mark.parametrize("num_parts", [1, 2, 4, 8])
@pytest.mark.parametrize("method", ["metis", "random", "range"])
def test_every_edge_once_with_global_weight(num_parts: int, method: str) -> None:
    g = random_graph(num_nodes=80, num_edges=300, seed=num_parts)
    owner = assign_parts(g, num_parts, method, seed=0)
    parts = build_parts(g, owner, num_parts)
    got = edges_of(parts)
    deg = g.degree()
    expected = {
        (int(s), int(d)): 1.0 / np.sqrt((deg[s] + 1.0) * (deg[d] + 1.0))
        for s, d in g.edge_index_2E.T
    }
    assert got.keys() == expected.keys()
    for key, w in expected.items():
        assert got[key] == pytest.approx(w, rel=1e-6)
    assert sorted(np.concatenate([p.inner_nodes for p in parts]).tolist()) == list(range(80))


@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_halo_send_recv_consistent(num_parts: int) -> None:
    g = random_graph(num_nodes=100, num_edges=400, seed=7)
    owner = assign_parts(g, num_parts, "metis", seed=1)
    parts = build_parts(g, owner, num_parts)
    for r, pr in enumerate(parts):
        assert np.all(owner[pr.halo_nodes] == pr.halo_owner)
        assert np.all(owner[pr.halo_nodes] != r)
        assert np.all(pr.indices < pr.num_inner + pr.num_halo)
        recv_blocks = np.split(pr.recv_idx, np.cumsum(pr.recv_counts)[:-1])
        for q, pq in enumerate(parts):
            send_blocks = np.split(pq.send_idx, np.cumsum(pq.send_counts)[:-1])
            sent = pq.inner_nodes[send_blocks[r]]
            landed = local_to_global(pr)[recv_blocks[q]]
            assert np.array_equal(sent, landed)
        # every halo node is read by some local edge, and every in-edge of an inner node is local
        assert set(pr.indices[pr.indices >= pr.num_inner].tolist()) == set(
            range(pr.num_inner, pr.num_inner + pr.num_halo)
        )


def test_metis_cuts_at_most_half_of_random(tmp_path: Path) -> None:
    """On the built-in synthetic graph with 4 parts, as recorded in META.json."""
    from leo_cli.config.schema import DataConfig, PartitionConfig
    from leo_cli.graph.stage import ensure_partitions

    cut = {}
    for method in ("metis", "random"):
        part = PartitionConfig(num_parts=4, method=method)
        result = ensure_partitions(DataConfig(), part, seed=0, out_dir=tmp_path / method)
        cut[method] = read_meta(result.path)["stats"]["edge_cut"]
    assert cut["metis"] <= 0.5 * cut["random"]


def test_storage_round_trip_and_checksum(tmp_path: Path) -> None:
    g = random_graph()
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    root = tmp_path / "partitions"
    write_partitions(root, parts, {"num_parts": 2})
    assert not list(tmp_path.glob(".partitions.tmp-*"))
    back = read_part(root, 1)
    for name, arr in parts[1].arrays().items():
        assert np.array_equal(getattr(back, name), arr), name
    assert read_meta(root)["files"]
    victim = root / "part_1" / "indices.npy"
    victim.write_bytes(victim.read_bytes()[:-8])
    with pytest.raises(PartitionError, match=r"part_1/indices\.npy.*--force"):
        read_part(root, 1)
    read_part(root, 0)  # the other part is intact


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = random_graph()
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    import leo_cli.graph.storage as storage

    def boom(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(storage, "swap_into_place", boom)
    with pytest.raises(KeyboardInterrupt):
        write_partitions(tmp_path / "partitions", parts, {"num_parts": 2})
    assert list(tmp_path.iterdir()) == []


def test_changed_ogb_file_makes_partitions_stale(tmp_path: Path) -> None:
    """Every file the loader reads is in the source key, and its new content is what is used."""
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", np.arange(40) % 40)
    data, part = DataConfig(name="ogbn-arxiv", root=tmp_path), PartitionConfig(num_parts=2)
    first = ensure_partitions(data, part, 0, tmp_path / "run")
    assert not first.reused
    assert ensure_partitions(data, part, 0, tmp_path / "run").reused
    labels = folder / "raw" / "node-label.csv.gz"
    write_csv_gz(labels, np.arange(40)[::-1] % 40)
    again = ensure_partitions(data, part, 0, tmp_path / "run")
    assert not again.reused
    new_fingerprint = again.meta["dataset"]["fingerprint"]
    assert new_fingerprint != first.meta["dataset"]["fingerprint"], "stale content was used"
    for path in source_files(data):
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
        assert not ensure_partitions(data, part, 0, tmp_path / "run").reused, path
    (folder / "processed").mkdir()
    (folder / "processed" / "data_processed").write_bytes(b"not read")
    (folder / "raw" / "node_year.csv.gz").unlink()
    assert ensure_partitions(data, part, 0, tmp_path / "run").reused
