"""Partition layout: every edge once with its weight, consistent halos, METIS quality; the
partition stage's staleness key."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph, write_csv_gz, write_ogb

from leo_cli.config.schema import DataConfig, PartitionConfig, SyntheticConfig
from leo_cli.errors import PartitionError
from leo_cli.graph.datasets import source_files
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partition_cache import ensure_partitions
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.storage import read_meta, read_part, write_partitions
from leo_cli.graph.types import Graph
from leo_cli.models.local_graph import edge_values


def local_to_global(p: LocalPart) -> np.ndarray:
    return np.concatenate([p.inner_nodes, p.halo_nodes])


def edges_of(parts: list[LocalPart]) -> set[tuple[int, int]]:
    """(src, dst) global ids of every local edge, asserting no edge appears twice."""
    seen: set[tuple[int, int]] = set()
    for p in parts:
        rows = np.repeat(p.inner_nodes, np.diff(p.indptr))
        for r, c in zip(rows, local_to_global(p)[p.indices], strict=True):
            assert (int(c), int(r)) not in seen, f"edge {(c, r)} appears twice"
            seen.add((int(c), int(r)))
    return seen


@pytest.mark.parametrize("num_parts", [1, 2, 4, 8])
@pytest.mark.parametrize("method", ["metis", "random", "range"])
def test_every_edge_once(num_parts: int, method: str) -> None:
    g = random_graph(num_nodes=80, num_edges=300, seed=num_parts)
    parts = build_parts(g, assign_parts(g, num_parts, method, seed=0), num_parts)
    assert edges_of(parts) == {(int(s), int(d)) for s, d in g.edge_index_2E.T}
    assert sorted(np.concatenate([p.inner_nodes for p in parts]).tolist()) == list(range(80))


def dense_aggregation(g: Graph, model: str) -> np.ndarray:
    """What a layer multiplies by, over the whole graph (rows: destinations, self term on the
    diagonal): GCN (A+I) / sqrt((d_i+1)(d_j+1)), SAGE mean A / d_i, GIN sum A."""
    a = np.zeros((g.num_nodes, g.num_nodes))
    a[g.edge_index_2E[1], g.edge_index_2E[0]] = 1.0
    deg = a.sum(axis=1)
    if model == "gcn":
        return (a + np.eye(g.num_nodes)) / np.sqrt(np.outer(deg + 1, deg + 1))
    return a / np.maximum(deg, 1)[:, None] if model == "sage" else a


def assembled_aggregation(parts: list[LocalPart], model: str, num_nodes: int) -> np.ndarray:
    """The same matrix from the weights training computes for each part."""
    out = np.zeros((num_nodes, num_nodes))
    for p in parts:
        values, self_weight = edge_values(p, model, torch.float64)
        rows = np.repeat(p.inner_nodes, np.diff(p.indptr))
        np.add.at(out, (rows, local_to_global(p)[p.indices]), values.numpy())
        if self_weight is not None:
            out[p.inner_nodes, p.inner_nodes] += self_weight.numpy()
    return out


@pytest.mark.parametrize("model", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("num_parts", [1, 3])
def test_training_weights_after_round_trip(model: str, num_parts: int, tmp_path: Path) -> None:
    g = random_graph(num_nodes=40, num_edges=120, seed=4)
    keep = (g.edge_index_2E != 7).all(axis=0)
    g = dataclasses.replace(g, edge_index_2E=g.edge_index_2E[:, keep])  # node 7: in-degree 0
    parts = build_parts(g, assign_parts(g, num_parts, "metis", seed=0), num_parts)
    write_partitions(tmp_path / "partitions", parts, {"num_parts": num_parts})
    back = [read_part(tmp_path / "partitions", r) for r in range(num_parts)]
    np.testing.assert_allclose(
        assembled_aggregation(back, model, g.num_nodes), dense_aggregation(g, model), rtol=1e-12
    )


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
    from leo_cli.graph.partition_cache import ensure_partitions

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
    assert [p.name for p in tmp_path.iterdir()] == ["partitions"]  # no temporary folder
    back = read_part(root, 1)
    for name, arr in parts[1].arrays().items():
        assert np.array_equal(getattr(back, name), arr), name
    assert read_meta(root, stage=False)["files"]
    victim = root / "part_1" / "indices.npy"
    victim.write_bytes(victim.read_bytes()[:-8])
    with pytest.raises(PartitionError, match=r"part_1/indices\.npy.*--force"):
        read_part(root, 1)
    # Unverified (the plan stage leaves checksums to the workers), mapped or read: a sentence,
    # not numpy's ValueError (leo train printed a traceback when its plan was made again).
    for mmap in (True, False):
        with pytest.raises(PartitionError, match=r"part_1/indices\.npy cannot be read.*--force"):
            read_part(root, 1, verify=False, mmap=mmap)
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


def test_full_disk_is_one_sentence_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = random_graph()
    parts = build_parts(g, assign_parts(g, 2, "range", 0), 2)
    import errno

    import leo_cli.graph.storage as storage

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.np, "save", full)
    with pytest.raises(PartitionError, match=r"Cannot write .*part_0.*No space left on device"):
        write_partitions(tmp_path / "partitions", parts, {"num_parts": 2})
    assert list(tmp_path.iterdir()) == []


def test_changed_ogb_file_makes_partitions_stale(tmp_path: Path) -> None:
    """Every file the loader reads is in the source key by its content (an edit that keeps
    its size and modification time included), and its new content is what is used."""
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
    for path in source_files(data):  # an edit that keeps size and mtime (cp -p, touch -r)
        assert path.suffix == ".gz"
        st, raw = path.stat(), bytearray(path.read_bytes())
        raw[4] ^= 0xFF  # the gzip header's time field: other bytes, the same table
        path.write_bytes(bytes(raw))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_size == st.st_size
        assert not ensure_partitions(data, part, 0, tmp_path / "run").reused, path
    for path in source_files(data):  # a touch alone changes nothing that is read
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert ensure_partitions(data, part, 0, tmp_path / "run").reused
    (folder / "processed").mkdir()
    (folder / "processed" / "data_processed").write_bytes(b"not read")
    (folder / "raw" / "node_year.csv.gz").unlink()
    assert ensure_partitions(data, part, 0, tmp_path / "run").reused


@pytest.mark.parametrize("dangling", [False, True])
def test_partitions_built_where_the_run_folder_links_into_the_cache(
    tmp_path: Path, dangling: bool
) -> None:
    """A run folder whose `partitions` links into the cache, partitioned where no cache applies
    (several nodes, emulation, a regroup), gets a folder of its own; the cache entry it linked
    to is left as it was (or stays gone)."""
    data = DataConfig(synthetic=SyntheticConfig(num_nodes=300, num_features=8))
    cache, run = tmp_path / "cache", tmp_path / "run"
    linked = ensure_partitions(data, PartitionConfig(num_parts=2), 0, run, cache_dir=cache)
    entry = linked.path.resolve()
    before = sorted(p.name for p in entry.iterdir())
    if dangling:
        shutil.rmtree(entry)
    built = ensure_partitions(data, PartitionConfig(num_parts=3), 0, run)
    assert not built.reused and built.meta["num_parts"] == 3
    assert built.path.is_dir() and not built.path.is_symlink()
    assert dangling != entry.is_dir()
    if not dangling:
        assert sorted(p.name for p in entry.iterdir()) == before


def test_a_link_to_a_deleted_cache_entry_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "partitions").symlink_to("../cache/partitions/g-p2-0123")
    with pytest.raises(PartitionError, match=r"links to \.\./cache/partitions/g-p2-0123, which"):
        read_meta(tmp_path / "run" / "partitions")


def test_part_files_load_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """np.load parses headers with ast.literal_eval, which CPython 3.11 can fail in two
    threads at once (the planner reads parts in threads): every load holds one lock."""
    from leo_cli.graph import storage

    g = random_graph()
    root = tmp_path / "partitions"
    write_partitions(root, build_parts(g, assign_parts(g, 2, "range", 0), 2), {"num_parts": 2})
    held = []
    real = np.load

    def load(*args: object, **kwargs: object) -> object:
        held.append(storage._LOADING.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr(storage.np, "load", load)
    read_part(root, 0, mmap=True)
    assert held and all(held)
