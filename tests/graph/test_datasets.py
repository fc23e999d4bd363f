"""Dataset loaders: synthetic DC-SBM, Planetoid (real Cora + a generated fixture), .npz files,
and the errors users see when files are missing or malformed (OGB: test_ogb.py)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from leo_cli.config.schema import DataConfig, SyntheticConfig
from leo_cli.errors import DataError
from leo_cli.graph.datasets import load_dataset, source_files
from leo_cli.graph.datasets.planetoid import restricted_loads
from leo_cli.graph.types import Graph

SMALL = SyntheticConfig(num_nodes=3000, avg_degree=12.0, num_classes=5, num_features=16)


def edge_keys(g: Graph) -> np.ndarray:
    src, dst = g.edge_index_2E
    return np.sort(dst * g.num_nodes + src)


def assert_clean(g: Graph) -> None:
    """Symmetric, no self-loops, no duplicates, disjoint splits."""
    src, dst = g.edge_index_2E
    keys = edge_keys(g)
    assert np.all(np.diff(keys) > 0), "duplicate edges"
    assert np.array_equal(keys, np.sort(src * g.num_nodes + dst)), "not symmetric"
    assert not np.any(src == dst), "self-loops"
    masks = g.train_mask_N.astype(int) + g.val_mask_N + g.test_mask_N
    assert masks.max() <= 1, "splits overlap"


# --- synthetic -------------------------------------------------------------------------------


def test_synthetic_is_deterministic() -> None:
    cfg = DataConfig(synthetic=SMALL)
    a, b, c = load_dataset(cfg, seed=1), load_dataset(cfg, seed=1), load_dataset(cfg, seed=2)
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != c.fingerprint()


def test_synthetic_structure() -> None:
    g = load_dataset(DataConfig(synthetic=SMALL), seed=0)
    assert_clean(g)
    assert (g.num_nodes, g.num_features, g.num_classes) == (3000, 16, 5)
    assert g.x_NF.dtype == np.float32
    assert 0.9 * 12.0 < g.num_edges / g.num_nodes <= 12.0  # merged duplicates cost a little
    assert (g.train_mask_N.sum(), g.val_mask_N.sum(), g.test_mask_N.sum()) == (300, 300, 2400)
    deg = g.degree()
    assert deg.max() > 8 * deg.mean(), "power-law degrees should produce hubs"
    assert np.median(deg) < deg.mean(), "degree distribution should be right-skewed"
    src, dst = g.edge_index_2E
    assert abs(np.mean(g.y_N[src] == g.y_N[dst]) - SMALL.homophily) < 0.03


@pytest.mark.parametrize("homophily", [0.0, 1.0])
def test_synthetic_homophily_extremes(homophily: float) -> None:
    cfg = SMALL.model_copy(update={"homophily": homophily})
    g = load_dataset(DataConfig(synthetic=cfg), seed=0)
    src, dst = g.edge_index_2E
    assert np.mean(g.y_N[src] == g.y_N[dst]) == homophily


def test_unknown_name_lists_accepted_names() -> None:
    with pytest.raises(DataError, match=r"data\.name = 'corra'.*`cora`.*`ogbn-arxiv`.*\.npz"):
        load_dataset(DataConfig(name="corra"), seed=0)


# --- Planetoid -------------------------------------------------------------------------------


def test_cora_matches_the_published_statistics(planetoid_root: Path) -> None:
    g = load_dataset(DataConfig(name="cora", root=planetoid_root), seed=0)
    assert_clean(g)
    assert (g.num_nodes, g.num_features, g.num_classes) == (2708, 1433, 7)
    assert g.num_edges == 10556
    assert (g.train_mask_N.sum(), g.val_mask_N.sum(), g.test_mask_N.sum()) == (140, 500, 1000)
    assert np.array_equal(np.flatnonzero(g.train_mask_N), np.arange(140))
    assert np.array_equal(np.bincount(g.y_N[g.train_mask_N]), [20] * 7)
    assert np.allclose(g.x_NF.sum(axis=1), 1.0, atol=1e-5)


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes bytes as Python 2 `str` opcodes, as the original Planetoid files have them."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj: Any) -> bytes:
    """`obj` pickled the way Python 2 with numpy 1 and scipy < 1.8 did."""
    out = io.BytesIO()
    _Py2Pickler(out, protocol=2).dump(obj)
    data = out.getvalue()
    for new, old in [
        (b"numpy._core.multiarray\n_reconstruct", b"numpy.core.multiarray\n_reconstruct"),
        (b"scipy.sparse._csr\ncsr_matrix", b"scipy.sparse.csr\ncsr_matrix"),
    ]:
        data = data.replace(new, old)
    return data


def write_planetoid(root: Path, name: str) -> dict[str, Any]:
    """A Planetoid dataset: 4 train nodes, 506 others, test ids 510..513 with a hole at 511.

    Over 500 non-test nodes, so that the standard 500 validation nodes miss the test ids.
    """
    rng = np.random.default_rng(0)
    onehot = np.eye(3, dtype=np.int32)
    ally_classes = np.arange(510) % 3  # nodes 0..509 (train = 0..3)
    test_index = np.array([513, 510, 512])  # file order; id 511 has no node (CiteSeer's holes)
    ty_classes = np.array([2, 1, 0])  # row k of tx/ty is node test_index[k]
    allx = rng.random((510, 6)).astype(np.float32) + 0.1
    tx = rng.random((3, 6)).astype(np.float32) + 0.1
    graph: defaultdict[int, list[int]] = defaultdict(list)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (510, 512), (512, 513), (513, 9), (5, 5)]:
        graph[a].append(b)
    graph[1].append(0)  # listed twice: merged on load
    parts = {
        "x": sp.csr_matrix(allx[:4]),
        "y": onehot[ally_classes[:4]],
        "allx": sp.csr_matrix(allx),
        "ally": onehot[ally_classes],
        "tx": sp.csr_matrix(tx),
        "ty": onehot[ty_classes],
        "graph": graph,
    }
    for part, obj in parts.items():
        (root / f"ind.{name}.{part}").write_bytes(py2_pickle(obj))
    (root / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in test_index))
    return {"allx": allx, "tx": tx, "ally_classes": ally_classes, "ty_classes": ty_classes}


def test_planetoid_fixture_with_test_id_holes(tmp_path: Path) -> None:
    raw = write_planetoid(tmp_path, "citeseer")
    g = load_dataset(DataConfig(name="citeseer", root=tmp_path), seed=0)
    assert_clean(g)
    assert (g.num_nodes, g.num_features, g.num_classes) == (514, 6, 3)
    assert np.array_equal(np.flatnonzero(g.train_mask_N), np.arange(4))
    assert np.array_equal(np.flatnonzero(g.val_mask_N), np.arange(4, 504))
    assert np.array_equal(np.flatnonzero(g.test_mask_N), [510, 512, 513])
    assert np.array_equal(g.y_N[:510], raw["ally_classes"])
    assert np.array_equal(g.y_N[[513, 510, 512]], raw["ty_classes"])
    assert np.allclose(g.x_NF[512], raw["tx"][2] / raw["tx"][2].sum())
    assert np.allclose(g.x_NF[7], raw["allx"][7] / raw["allx"][7].sum())
    assert not g.x_NF[511].any()  # the hole: a zero row
    assert g.num_edges == 2 * 8


def test_restricted_unpickler_refuses_os_system(tmp_path: Path) -> None:
    evil = b"cos\nsystem\n(S'echo pwned'\ntR."
    with pytest.raises(DataError, match=r"refusing to load `os\.system`"):
        restricted_loads(evil, tmp_path / "evil")
    write_planetoid(tmp_path, "cora")
    (tmp_path / "ind.cora.graph").write_bytes(pickle.dumps(os.system, protocol=2))
    with pytest.raises(DataError, match=r"ind\.cora\.graph.*refusing to load `posix\.system`"):
        load_dataset(DataConfig(name="cora", root=tmp_path), seed=0)


def test_planetoid_missing_file_names_it(tmp_path: Path) -> None:
    write_planetoid(tmp_path, "pubmed")
    (tmp_path / "ind.pubmed.ty").unlink()
    with pytest.raises(DataError, match=r"ind\.pubmed\.ty is missing.*datasets/pubmed\.md"):
        load_dataset(DataConfig(name="pubmed", root=tmp_path), seed=0)


def put(part: str, obj: Any) -> Callable[[Path], None]:
    """A change to the Cora fixture: `ind.cora.<part>` holds `obj` (test.index: text)."""

    def change(root: Path) -> None:
        path = root / f"ind.cora.{part}"
        if part == "test.index":
            path.write_text(obj)
        else:
            path.write_bytes(py2_pickle(obj))

    return change


def huge_shape(root: Path) -> None:
    """allx as a CSR matrix whose declared shape would take 4 PB dense."""
    allx = restricted_loads((root / "ind.cora.allx").read_bytes(), root / "ind.cora.allx")
    allx._shape = (510, 10**12)
    (root / "ind.cora.allx").write_bytes(py2_pickle(allx))


def short_indptr(root: Path) -> None:
    tx = restricted_loads((root / "ind.cora.tx").read_bytes(), root / "ind.cora.tx")
    tx.indptr = tx.indptr[:-1]
    (root / "ind.cora.tx").write_bytes(py2_pickle(tx))


def no_classes(root: Path) -> None:
    for part, rows in [("y", 4), ("ty", 3), ("ally", 510)]:
        put(part, np.zeros((rows, 0), dtype=np.int32))(root)


_ADJ = {0: [1], 1: [2]}
CRAFTED_PLANETOID = [
    (put("test.index", "513\n510\n1000000000000\n"), "test.index lists ids outside 510..515"),
    (put("test.index", "513\n510\n-3\n"), "test.index lists ids outside"),
    (put("test.index", "513\n510\n510\n"), "test.index lists a node id twice"),
    (put("graph", {**_ADJ, "2": [0]}), "graph holds '2' where a node id in 0..513 belongs"),
    (put("graph", {**_ADJ, 2: 5}), "graph maps node 2 to a int, expected a list"),
    (put("graph", {**_ADJ, 2: ["0"]}), "graph holds '0' where a node id"),
    (put("graph", {**_ADJ, 2: [10**30]}), "graph holds 1000000000000000000000000000000 where"),
    (put("graph", {**_ADJ, 2: [1.0]}), "graph holds 1.0 where"),
    (put("tx", sp.csr_matrix(np.ones((3, 7)))), "tx has 7 columns but .*allx has 6"),
    (put("ally", np.eye(3, dtype=np.int32)[np.arange(509) % 3]), "ally has 509 rows"),
    (put("ty", np.ones((3, 0))), "ty has 0 columns but .*ally has 3"),
    (put("tx", sp.csr_matrix(np.full((3, 6), np.nan))), "tx holds NaN or infinite values"),
    (put("y", [[1, 0, 0]]), "y holds a list, expected a 2-D matrix"),
    (no_classes, "ally has no columns; it needs one per class"),
    (huge_shape, r"allx declares a 510 x 1000000000000 matrix"),
    (short_indptr, "tx holds a malformed matrix"),
]


@pytest.mark.parametrize(("change", "message"), CRAFTED_PLANETOID)
def test_crafted_planetoid_content_is_one_sentence(
    tmp_path: Path, change: Callable[[Path], None], message: str
) -> None:
    write_planetoid(tmp_path, "cora")
    change(tmp_path)
    with pytest.raises(DataError, match=message) as info:
        load_dataset(DataConfig(name="cora", root=tmp_path), seed=0)
    assert "\n" not in str(info.value)


def test_planetoid_test_ids_may_start_after_allx(tmp_path: Path) -> None:
    """A gap before the first test id is zero rows, like CiteSeer's holes (it crashed before)."""
    write_planetoid(tmp_path, "citeseer")
    (tmp_path / "ind.citeseer.test.index").write_text("515\n512\n514\n")
    g = load_dataset(DataConfig(name="citeseer", root=tmp_path), seed=0)
    assert g.num_nodes == 516 and np.array_equal(np.flatnonzero(g.test_mask_N), [512, 514, 515])
    assert not g.x_NF[[510, 511, 513]].any()


def test_planetoid_source_files_are_the_files_read(tmp_path: Path) -> None:
    write_planetoid(tmp_path, "cora")
    (tmp_path / "ind.cora.graph.bak").write_bytes(b"")
    files = source_files(DataConfig(name="cora", root=tmp_path))
    assert sorted(f.name for f in files) == sorted(
        f"ind.cora.{p}" for p in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
    )


# --- .npz ------------------------------------------------------------------------------------


def graph_arrays(g: Graph) -> dict[str, np.ndarray]:
    return {
        "edge_index": g.edge_index_2E,
        "x": g.x_NF,
        "y": g.y_N,
        "train_mask": g.train_mask_N,
        "val_mask": g.val_mask_N,
        "test_mask": g.test_mask_N,
        "num_classes": np.array(g.num_classes),
    }


def test_npz_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = load_dataset(DataConfig(synthetic=SMALL.model_copy(update={"num_nodes": 200})), seed=0)
    np.savez(tmp_path / "mine.npz", **graph_arrays(g))
    monkeypatch.chdir(tmp_path)
    back = load_dataset(DataConfig(name="mine.npz"), seed=0)
    assert back.name == "mine"
    for key, arr in graph_arrays(g).items():
        assert np.array_equal(graph_arrays(back)[key], arr), key
    one_way = graph_arrays(g) | {
        "edge_index": g.edge_index_2E[:, g.edge_index_2E[0] < g.edge_index_2E[1]]
    }
    np.savez(tmp_path / "one_way.npz", **one_way)
    assert np.array_equal(
        load_dataset(DataConfig(name="one_way.npz"), 0).edge_index_2E, g.edge_index_2E
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"y": None}, r"key `y` is missing"),
        ({"train_mask": np.zeros(7, dtype=bool)}, r"key `train_mask` has 7 entries"),
        ({"val_mask": np.zeros(20, dtype=np.int8)}, r"key `val_mask` must be a bool array"),
        ({"edge_index": np.array([[0, 1], [2, 20]])}, r"key `edge_index` holds node ids outside"),
        ({"edge_index": np.zeros((3, 2), dtype=int)}, r"key `edge_index` has shape \(3, 2\)"),
        ({"x": np.full((20, 3), np.nan)}, r"key `x` holds NaN"),
        ({"num_classes": np.array(2)}, r"key `num_classes` must be an integer scalar >= max\(y\)"),
        ({"x": np.array([object()] * 20, dtype=object)}, r"not a readable \.npz file"),
        ({"num_classes": np.array(10**12)}, r"key `num_classes` gives 1,000,000,000,000 classes"),
        ({"y": np.arange(20) * 10**10}, r"key `y` gives 190,000,000,001 classes; LEO trains at"),
    ],
)
def test_npz_errors_name_file_and_key(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    arrays: dict[str, Any] = {
        "edge_index": np.array([[0, 1], [1, 2]]),
        "x": np.ones((20, 3), dtype=np.float32),
        "y": np.arange(20) % 4,
        "train_mask": np.arange(20) < 10,
        "val_mask": np.zeros(20, dtype=bool),
        "test_mask": np.arange(20) >= 10,
    }
    arrays.update(change)
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(DataError, match=rf"bad\.npz.*{message}"):
        load_dataset(DataConfig(name=str(path)), seed=0)


def test_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nothing\.npz does not exist.*datasets/npz\.md"):
        load_dataset(DataConfig(name=str(tmp_path / "nothing.npz")), seed=0)


def test_planetoid_files_that_do_not_belong_together(tmp_path: Path, planetoid_root: Path) -> None:
    import shutil

    from leo_cli.graph.datasets.planetoid import load_planetoid

    for f in planetoid_root.glob("ind.cora.*"):
        shutil.copy(f, tmp_path / f.name)
    index = tmp_path / "ind.cora.test.index"
    index.write_text("\n".join(index.read_text().split()[:-3]) + "\n")
    with pytest.raises(DataError, match=r"ind\.cora\.tx.*do not belong together"):
        load_planetoid("cora", tmp_path)


def test_npz_that_is_not_an_archive(tmp_path: Path) -> None:
    from leo_cli.graph.datasets.npz import load_npz

    path = tmp_path / "g.npz"
    path.write_text("edge_index,x\n")
    with pytest.raises(DataError, match="not an .npz archive"):
        load_npz(path)


def test_npz_member_that_inflates_like_a_zip_bomb_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member's declared size is checked before it is read: one inflating more than
    MAX_INFLATION times (past INFLATION_FLOOR) is refused, as is an archive larger than the
    free memory."""
    from leo_cli.graph.datasets import npz

    g = load_dataset(DataConfig(synthetic=SMALL.model_copy(update={"num_nodes": 200})), seed=0)
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, **graph_arrays(g) | {"pad": np.zeros(1 << 22, dtype=np.uint8)})
    monkeypatch.setattr(npz, "INFLATION_FLOOR", 1 << 20)
    with pytest.raises(DataError, match=r"bomb\.npz: member pad\.npy inflates [\d,]+ times"):
        npz.load_npz(path)
    monkeypatch.setattr(npz, "INFLATION_FLOOR", 1 << 30)
    monkeypatch.setattr(npz, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(DataError, match=r"bomb\.npz inflates to 0\.0 GiB, more than the 0\.0"):
        npz.load_npz(path)


def test_npz_member_whose_header_declares_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    """numpy allocates the shape an .npy header declares before reading it: a member of a few
    bytes declaring 10^12 elements is refused in one sentence, not allocated."""
    from leo_cli.graph.datasets import npz

    header = io.BytesIO()
    fields = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    np.lib.format.write_array_header_1_0(header, fields)
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(16))
    with pytest.raises(DataError, match=r"liar\.npz: member x\.npy declares 8,000,000,000,000 "):
        npz.load_npz(path)
