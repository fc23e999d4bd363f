"""OGB datasets read from their raw files: offline, equal to what the ogb package loads, no
pickle ever loaded, and one sentence naming the file for every malformed input."""

from __future__ import annotations

import gzip
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Payload, write_csv_gz, write_ogb
from test_datasets import assert_clean

from leo_cli.config.schema import DataConfig
from leo_cli.errors import DataError
from leo_cli.graph.datasets import load_dataset, source_files


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the loader tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def files_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ogb_arxiv_loads_offline_and_writes_nothing(tmp_path: Path) -> None:
    labels = np.arange(50) % 40
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", labels)
    before = files_under(tmp_path)
    cfg = DataConfig(name="ogbn-arxiv", root=tmp_path)
    g = load_dataset(cfg, seed=0)
    assert_clean(g)
    assert (g.name, g.num_nodes, g.num_features, g.num_classes) == ("ogbn-arxiv", 50, 4, 40)
    assert np.array_equal(g.y_N, labels)
    assert (g.train_mask_N.sum(), g.val_mask_N.sum(), g.test_mask_N.sum()) == (17, 17, 16)
    assert files_under(tmp_path) == before, "data.root is only read"
    assert not (folder / "RELEASE_v1.txt").exists()
    assert load_dataset(cfg, seed=0).fingerprint() == g.fingerprint()


def test_ogb_unlabelled_nodes_leave_the_splits(tmp_path: Path) -> None:
    labels = (np.arange(30) % 47).astype(np.float64)
    labels[[0, 20]] = np.nan  # node 0 is in train, node 20 in test
    write_ogb(tmp_path, "ogbn-products", "sales_ranking", labels)
    g = load_dataset(DataConfig(name="ogbn-products", root=tmp_path), seed=0)
    assert g.y_N[0] == 0 and g.y_N[20] == 0
    assert not g.train_mask_N[0] and not g.test_mask_N[20]
    assert (g.train_mask_N.sum(), g.val_mask_N.sum(), g.test_mask_N.sum()) == (9, 10, 9)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "split"), [("ogbn-arxiv", "time"), ("ogbn-products", "sales_ranking")]
)
def test_ogb_equals_what_the_ogb_package_loads(tmp_path: Path, name: str, split: str) -> None:
    """The graph the ogb package parses from the same raw files, post-processed as before."""
    ogb_dataset = pytest.importorskip("ogb.nodeproppred").NodePropPredDataset
    from leo_cli.graph.types import symmetrize

    labels = (np.arange(60) % 40).astype(np.float64)
    labels[[3, 40]] = np.nan
    folder = write_ogb(tmp_path / "mine", name, split, labels)
    write_csv_gz(folder / "raw" / "node-feat.csv.gz", np.random.default_rng(1).normal(size=(60, 3)))
    ours = load_dataset(DataConfig(name=name, root=tmp_path / "mine"), seed=0)
    theirs_dir = tmp_path / "theirs" / folder.name
    shutil.copytree(folder, theirs_dir, ignore=shutil.ignore_patterns("processed"))
    (theirs_dir / "RELEASE_v1.txt").touch()  # first load: parses the CSV files, loads no cache
    (theirs_dir / "processed").mkdir()
    dataset = ogb_dataset(name=name, root=str(tmp_path / "theirs"))
    graph, y = dataset[0]
    split_idx = dataset.get_idx_split()
    assert np.array_equal(ours.edge_index_2E, symmetrize(graph["edge_index"], 60))
    assert np.array_equal(ours.x_NF, np.asarray(graph["node_feat"], dtype=np.float32))
    assert np.array_equal(ours.y_N, np.nan_to_num(y.reshape(-1)).astype(np.int64))
    for mask, part in [(ours.train_mask_N, "train"), (ours.test_mask_N, "test")]:
        ids = split_idx[part]
        assert np.array_equal(np.flatnonzero(mask), np.sort(ids[~np.isnan(labels[ids])]))


def test_ogb_cache_files_are_never_unpickled(tmp_path: Path) -> None:
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", np.arange(30) % 40)
    (folder / "RELEASE_v1.txt").touch()
    (folder / "processed").mkdir()
    torch.save({"graph": Payload(tmp_path / "ran-1")}, folder / "processed" / "data_processed")
    torch.save(Payload(tmp_path / "ran-2"), folder / "split" / "time" / "split_dict.pt")
    g = load_dataset(DataConfig(name="ogbn-arxiv", root=tmp_path), seed=0)
    assert g.num_nodes == 30
    assert not list(tmp_path.glob("ran-*")), "a cache file was unpickled"


def write_papers(root: Path, num_nodes: int = 40) -> Path:
    """A tiny ogbn-papers100M folder: `.npz` archives and CSV splits, NaN for unlabelled."""
    rng = np.random.default_rng(2)
    raw = root / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    np.savez(
        raw / "data.npz",
        edge_index=rng.integers(0, num_nodes, (2, 90)),
        num_nodes_list=np.array([num_nodes]),
        num_edges_list=np.array([90]),
        node_feat=rng.normal(size=(num_nodes, 5)).astype(np.float16),
        node_year=np.arange(num_nodes),
    )
    labels = (np.arange(num_nodes) % 172).astype(np.float64).reshape(-1, 1)
    labels[::3] = np.nan
    np.savez(raw / "node-label.npz", node_label=labels)
    thirds = np.array_split(np.arange(num_nodes), 3)
    for part, ids in zip(["train", "valid", "test"], thirds, strict=True):
        write_csv_gz(root / "ogbn_papers100M" / "split" / "time" / f"{part}.csv.gz", ids)
    return raw


def test_ogb_papers100m_npz_layout(tmp_path: Path) -> None:
    write_papers(tmp_path)
    g = load_dataset(DataConfig(name="ogbn-papers100M", root=tmp_path), seed=0)
    assert_clean(g)
    assert (g.num_nodes, g.num_features, g.num_classes) == (40, 5, 172)
    assert not g.train_mask_N[::3].any() and g.train_mask_N.sum() == 9


def test_ogb_npz_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    raw = write_papers(tmp_path)
    payload = np.array([Payload(tmp_path / "ran")], dtype=object)
    np.savez(raw / "node-label.npz", node_label=payload)
    with pytest.raises(DataError, match=r"node-label\.npz is not a readable \.npz archive"):
        load_dataset(DataConfig(name="ogbn-papers100M", root=tmp_path), seed=0)
    assert not (tmp_path / "ran").exists()


def test_ogb_missing_file_says_how_to_get_it(tmp_path: Path) -> None:
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", np.arange(20) % 40)
    (folder / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(DataError, match=r"raw/node-feat\.csv\.gz is missing.*datasets/ogbn\.md"):
        load_dataset(DataConfig(name="ogbn-arxiv", root=tmp_path), seed=0)
    folder = write_ogb(tmp_path / "b", "ogbn-arxiv", "time", np.arange(20) % 40)
    (folder / "split" / "time" / "train.csv.gz").unlink()
    with pytest.raises(DataError, match=r"split/time/train\.csv\.gz is missing"):
        load_dataset(DataConfig(name="ogbn-arxiv", root=tmp_path / "b"), seed=0)


def write_text_gz(path: Path, text: str) -> None:
    with gzip.open(path, "wt") as f:
        f.write(text)


def replace(file: str, text: str) -> Callable[[Path], Path]:
    """A change to the fixture: `file` (under the dataset folder) gets gzip content `text`."""

    def change(folder: Path) -> Path:
        write_text_gz(folder / file, text)
        return folder / file

    return change


def plain_text(folder: Path) -> Path:
    path = folder / "split" / "time" / "valid.csv.gz"
    path.write_text("1\n2\n")
    return path


E = "raw/edge.csv.gz"
BAD_FILES = [
    (replace(E, "0,1,2\n1,2,3\n"), "has 3 columns, expected 2"),
    (replace(E, "0,1\n1,x\n"), "entries that are not numbers"),
    (replace(E, "0,1\n1,2,3\n"), "not a readable gzip CSV file"),
    (replace(E, "0,1\n1\n"), "whole numbers only"),
    (replace(E, "0,1\n1,20\n"), "node id 20, outside 0..19"),
    (replace(E, "0,1\n-1,2\n"), "negative number -1"),
    (replace(E, "0,1\n1,2\n"), "has 2 edges but num-edge-list.csv.gz says 120"),
    (replace("raw/num-node-list.csv.gz", "20\n5\n"), "must hold one count"),
    (
        replace("raw/num-node-list.csv.gz", "1000000000000\n"),
        "20 feature rows, but num-node-list.csv.gz counts 1000000000000",
    ),
    (replace("raw/node-feat.csv.gz", "0.5\n" * 19 + "nan\n"), "missing, infinite or non-numeric"),
    (replace("raw/node-label.csv.gz", "1\n" * 19 + "40\n"), "holds label 40; classes are 0..39"),
    (replace("raw/node-label.csv.gz", "1\n" * 19 + "1.5\n"), "not class numbers 0..39"),
    (replace("raw/node-label.csv.gz", "1\n" * 19), "one number per node \\(20 nodes\\)"),
    (replace("raw/node-label.csv.gz", "1,1\n" * 20), "has 2 columns, expected 1"),
    (replace("split/time/test.csv.gz", "3\n20\n"), "node id 20, outside 0..19"),
    (replace("split/time/train.csv.gz", "3\n4.0\n"), "whole numbers only"),
    (plain_text, "not a readable gzip CSV file"),
]


@pytest.mark.parametrize(("change", "message"), BAD_FILES)
def test_ogb_malformed_file_is_named(
    tmp_path: Path, change: Callable[[Path], Path], message: str
) -> None:
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", np.arange(20) % 40)
    bad = change(folder)
    with pytest.raises(DataError, match=message) as info:
        load_dataset(DataConfig(name="ogbn-arxiv", root=tmp_path), seed=0)
    assert bad.name in str(info.value), info.value
    assert "\n" not in str(info.value)


def test_ogb_source_files_are_exactly_the_files_read(tmp_path: Path) -> None:
    folder = write_ogb(tmp_path, "ogbn-arxiv", "time", np.arange(20) % 40)
    (folder / "RELEASE_v1.txt").touch()
    (folder / "processed").mkdir()
    (folder / "processed" / "data_processed").write_bytes(b"cache")
    (folder / "split" / "time" / "split_dict.pt").write_bytes(b"cache")
    raw = ["edge", "num-node-list", "num-edge-list", "node-feat", "node-label"]
    expected = [folder / "raw" / f"{f}.csv.gz" for f in raw] + [
        folder / "split" / "time" / f"{p}.csv.gz" for p in ("train", "valid", "test")
    ]
    assert source_files(DataConfig(name="OGBN-arxiv", root=tmp_path)) == expected


@pytest.mark.parametrize(("name", "message"), [("ogbn-mag", "heterogeneous"), ("ogbn-x", "use")])
def test_ogb_unsupported_names(name: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_dataset(DataConfig(name=name), seed=0)
