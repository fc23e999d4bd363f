"""`leo convert`: edge lists, networkx files, PyG dicts and DGL files become LEO's .npz with
the same graph, features, labels and split; bad input is one sentence and leaves no file
behind; features are row-normalised by `data.normalize_features`."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from helpers.cli import leo, leo_here

from leo_cli.config.schema import DataConfig
from leo_cli.errors import DataError
from leo_cli.graph.convert import convert, parse_split, read_edge_list, read_source, split_masks
from leo_cli.graph.datasets import load_dataset
from leo_cli.graph.datasets.npz import MASK_KEYS, load_npz

EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 0], [5, 4]])  # 6 nodes
N = 6


def labels() -> np.ndarray:
    return np.array([0, 1, 0, 1, 2, 2])


def masks_file(tmp_path: Path) -> Path:
    path = tmp_path / "masks.npz"
    train = np.array([1, 1, 0, 0, 0, 0], dtype=bool)
    val = np.array([0, 0, 1, 0, 0, 0], dtype=bool)
    np.savez(path, train_mask=train, val_mask=val, test_mask=~(train | val))
    return path


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("src,dst\n" + "\n".join(f"{a},{b}" for a, b in EDGES), "e.csv"),
        ("# comment\n" + "\n".join(f"{a}\t{b}\t0.5" for a, b in EDGES), "e.tsv"),
        ("\n".join(f"{a}  {b}" for a, b in EDGES) + "\n\n", "e.txt"),
    ],
)
def test_edge_lists_in_every_layout_give_the_same_edges(
    tmp_path: Path, text: str, name: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    found = read_edge_list(path)
    assert found.num_nodes == N
    assert np.array_equal(found.edge_index_2E, EDGES.T)


def test_convert_writes_what_the_loader_reads(tmp_path: Path) -> None:
    edges = tmp_path / "e.csv"
    edges.write_text("\n".join(f"{a},{b}" for a, b in EDGES))
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    np.save(tmp_path / "x.npy", x)
    np.savetxt(tmp_path / "y.csv", labels(), fmt="%d", header="label", comments="")
    out = tmp_path / "g.npz"
    graph, _ = convert(
        read_source(edges, None), out, tmp_path / "x.npy", tmp_path / "y.csv",
        masks_file(tmp_path),
    )  # fmt: skip
    loaded = load_npz(out)
    assert np.array_equal(loaded.x_NF, x) and np.array_equal(loaded.y_N, labels())
    assert loaded.edge_index_2E.shape[1] == 2 * len(EDGES)  # symmetric
    assert loaded.train_mask_N.tolist() == [True, True, False, False, False, False]
    assert graph.num_classes == 3


def test_labels_as_node_label_pairs_leave_unlabelled_nodes_out_of_the_split(
    tmp_path: Path,
) -> None:
    edges = tmp_path / "e.txt"
    edges.write_text("\n".join(f"{a} {b}" for a, b in EDGES))
    (tmp_path / "y.csv").write_text("node,label\n0,1\n2,0\n5,1\n")
    graph, notes = convert(
        read_source(edges, None), tmp_path / "g.npz", labels=tmp_path / "y.csv",
        split=(0.34, 0.33, 0.33), seed=3,
    )  # fmt: skip
    covered = graph.train_mask_N | graph.val_mask_N | graph.test_mask_N
    assert covered.tolist() == [True, False, True, False, False, True]
    assert graph.x_NF.shape == (N, 1)
    assert any("constant feature" in n for n in notes) and any("split" in n for n in notes)


def test_a_networkx_file_gives_labels_and_features_from_node_attributes(
    tmp_path: Path,
) -> None:
    g = nx.Graph()
    for i in range(N):
        g.add_node(f"n{i}", label=["cat", "dog", "eel"][labels()[i]], a=float(i), b=2.0 * i)
    g.add_edges_from((f"n{a}", f"n{b}") for a, b in EDGES)
    path = tmp_path / "g.graphml"
    nx.write_graphml(g, path)
    graph, notes = convert(read_source(path, None), tmp_path / "g.npz", seed=1)
    assert np.array_equal(graph.y_N, labels())
    assert np.array_equal(graph.x_NF, np.array([[i, 2.0 * i] for i in range(N)], np.float32))
    assert any("cat, dog, eel" in n for n in notes)


def test_a_pyg_dict_of_tensors(tmp_path: Path) -> None:
    path = tmp_path / "data.pt"
    x = torch.randn(N, 4)
    train = torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool)
    torch.save(
        {"edge_index": torch.from_numpy(EDGES.T.copy()), "x": x, "y": torch.from_numpy(labels()),
         "train_mask": train, "val_mask": ~train, "test_mask": ~train},
        path,
    )  # fmt: skip
    graph, _ = convert(read_source(None, path), tmp_path / "g.npz")
    assert np.array_equal(graph.x_NF, x.numpy()) and graph.train_mask_N.sum() == 2


def test_a_dgl_graph_file(tmp_path: Path) -> None:
    """A file `dgl.save_graphs` wrote (masks come back from it as uint8) gives the graph the
    same tensors give through --from-pyg. Runs where DGL imports."""
    dgl = pytest.importorskip("dgl")
    src, dst = torch.from_numpy(EDGES[:, 0].copy()), torch.from_numpy(EDGES[:, 1].copy())
    g = dgl.graph((src, dst), num_nodes=N + 1)  # one more node than the edges name
    x, train = torch.randn(N + 1, 4), torch.tensor([1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    g.ndata.update({"feat": x, "label": torch.tensor([0, 1, 0, 1, 2, 2, 1]),
                    "train_mask": train, "val_mask": ~train, "test_mask": ~train})  # fmt: skip
    dgl.save_graphs(str(tmp_path / "g.bin"), [g, g])
    found = read_source(None, None, tmp_path / "g.bin")
    assert found.notes == [f"{tmp_path / 'g.bin'} holds 2 graphs; the first was converted."]
    graph, _ = convert(found, tmp_path / "g.npz")
    assert graph.num_nodes == N + 1 and np.array_equal(graph.x_NF, x.numpy())
    assert graph.train_mask_N.tolist() == train.tolist() and graph.num_classes == 3


class _FakeDGLGraph:
    """What `read_dgl` reads of a DGL graph, as DGL 2.1 returns it (masks as uint8)."""

    ntypes = ["_N"]
    canonical_etypes = [("_N", "_E", "_N")]

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        masks = {k: torch.tensor([1, 1, 0, 0, 0, 0, 0], dtype=torch.uint8) for k in MASK_KEYS}
        self.ndata = {"features": x, "labels": torch.tensor([0, 1, 0, 1, 2, 2, -1]), **masks}

    def edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(EDGES[:, 0].copy()), torch.from_numpy(EDGES[:, 1].copy())

    def num_nodes(self) -> int:
        return N + 1


def test_dgl_node_data_names_and_uint8_masks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without DGL installed, a stand-in for `dgl.load_graphs`: `features`/`labels` are read
    as `feat`/`label` are, uint8 masks as bool, a negative label as unlabelled."""
    x = torch.randn(N + 1, 3)
    fake = types.SimpleNamespace(load_graphs=lambda path: ([_FakeDGLGraph(x)], {}))
    monkeypatch.setitem(sys.modules, "dgl", fake)
    (tmp_path / "g.bin").write_bytes(b"\x00")
    found = read_source(None, None, tmp_path / "g.bin")
    assert found.num_nodes == N + 1 and np.array_equal(found.x_NF, x.numpy())
    assert found.labelled_N is not None and found.labelled_N.tolist() == [True] * N + [False]
    assert found.masks is not None and found.masks["train_mask"].dtype == np.bool_
    graph, _ = convert(found, tmp_path / "g.npz")
    assert graph.train_mask_N.tolist() == [True, True] + [False] * 5


def test_dgl_input_without_dgl_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dgl", None)  # `import dgl` raises ImportError
    (tmp_path / "g.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(DataError, match=r"g\.bin needs DGL, which cannot be imported.*--from-pyg"):
        read_source(None, None, tmp_path / "g.bin")
    with pytest.raises(DataError, match="give one source"):
        read_source(tmp_path / "e.csv", None, tmp_path / "g.bin")


def test_split_is_seeded_and_disjoint() -> None:
    labelled = np.ones(100, dtype=bool)
    a, b = split_masks(labelled, (0.6, 0.2, 0.2), 7), split_masks(labelled, (0.6, 0.2, 0.2), 7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [int(m.sum()) for m in a.values()] == [60, 20, 20]
    assert not (a["train_mask"] & a["val_mask"]).any()
    with pytest.raises(DataError, match="--split"):
        parse_split("0.7,0.3,0.2")


@pytest.mark.parametrize(
    ("files", "args", "needle"),
    [
        ({"e.csv": "0,1\n1,x\n"}, ["e.csv", "--labels", "y.csv"], "e.csv holds something other"),
        ({"e.csv": "0,1\n1,2\n"}, ["e.csv"], "no labels"),
        ({"e.csv": "0,1\n1,2\n", "y.csv": "0\n1\n"}, ["e.csv", "--labels", "y.csv"], "cover 2"),
        ({"e.csv": "0,-1\n"}, ["e.csv", "--labels", "y.csv"], "negative node ids"),
        ({"e.csv": "0,1\n", "y.csv": "0\n1\n"}, ["e.csv", "--labels", "y.csv", "--out", "g.txt"],
         "must end in .npz"),
        ({"y.csv": "0\n"}, ["missing.csv", "--labels", "y.csv"], "does not exist"),
        ({"e.csv": "0,1\n2,3\n", "y.csv": "0\n1\n", "x.npy": None}, ["e.csv", "--labels",
         "y.csv", "--features", "x.npy"], "features have 3 rows"),
        ({"e.csv": "0\n1\n"}, ["e.csv", "--labels", "e.csv"], "fewer than 2 columns"),
        ({"e.txt": "0 1000000000000\n"}, ["e.txt"], "edges name node 1,000,000,000,000"),
    ],
)  # fmt: skip
def test_bad_input_is_one_sentence_and_leaves_nothing(
    tmp_path: Path,
    files: dict[str, str | None],
    args: list[str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, text in files.items():
        if text is None:
            np.save(tmp_path / name, np.zeros((3, 2), dtype=np.float32))
        else:
            (tmp_path / name).write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = [] if "--out" in args else ["--out", "g.npz"]
    monkeypatch.chdir(tmp_path)
    res = leo_here("convert", *args, *out)  # refused before any work: in this process
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in " ".join(res.stderr.split()) and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_normalize_features_divides_rows_by_their_sum(tmp_path: Path) -> None:
    x = np.array([[1, 3], [0, 0], [2, 2]], dtype=np.float32)
    y, train = np.array([0, 1, 0]), np.array([True, False, False])
    path = tmp_path / "g.npz"
    np.savez(path, edge_index=np.array([[0, 1], [1, 2]]), x=x, y=y, train_mask=train,
             val_mask=~train, test_mask=train)  # fmt: skip
    raw = load_dataset(DataConfig(name=str(path)), 0).x_NF
    assert np.array_equal(raw, x)  # auto: off outside Planetoid
    normed = load_dataset(DataConfig(name=str(path), normalize_features=True), 0).x_NF
    assert np.allclose(normed, [[0.25, 0.75], [0, 0], [0.5, 0.5]])


@pytest.mark.integration
def test_cora_through_convert_is_the_planetoid_graph(tmp_path: Path, planetoid_root: Path) -> None:
    """Cora written as an edge list, a feature array, a label CSV and masks converts back to
    what the Planetoid loader gives (its raw features, normalised on load as there)."""
    raw = load_dataset(DataConfig(name="cora", root=planetoid_root, normalize_features=False), 0)
    src, dst = raw.edge_index_2E
    keep = src < dst
    (tmp_path / "e.csv").write_text(
        "source,target\n" + "\n".join(f"{a},{b}" for a, b in zip(src[keep], dst[keep], strict=True))
    )
    np.save(tmp_path / "x.npy", raw.x_NF)
    np.savetxt(tmp_path / "y.csv", raw.y_N, fmt="%d")
    np.savez(tmp_path / "m.npz", train_mask=raw.train_mask_N, val_mask=raw.val_mask_N,
             test_mask=raw.test_mask_N)  # fmt: skip
    res = leo("convert", "e.csv", "--features", "x.npy", "--labels", "y.csv", "--masks",
              "m.npz", "--out", "cora.npz", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "leo train --set data.name=cora.npz" in res.stdout
    ours = load_dataset(DataConfig(name=str(tmp_path / "cora.npz"), normalize_features=True), 0)
    theirs = load_dataset(DataConfig(name="cora", root=planetoid_root), 0)
    for key in ("edge_index_2E", "x_NF", "y_N", "train_mask_N", "val_mask_N", "test_mask_N"):
        assert np.array_equal(getattr(ours, key), getattr(theirs, key)), key


def test_gml_classes_and_unlabelled_nodes_leave_the_masks(tmp_path: Path) -> None:
    g = nx.Graph()
    for i in range(N):
        g.add_node(i, y=int(labels()[i]) if i != 5 else -1, w=float(i))
    g.add_edges_from((int(a), int(b)) for a, b in EDGES)
    path = tmp_path / "g.gml"
    nx.write_gml(g, path)
    graph, notes = convert(read_source(path, None), tmp_path / "g.npz", masks=masks_file(tmp_path))
    assert graph.y_N[:5].tolist() == labels()[:5].tolist()
    assert not graph.test_mask_N[5]  # node 5 has no label: out of every mask
    assert any("without a label" in n for n in notes)


def test_string_node_names_are_renumbered_and_said_so(tmp_path: Path) -> None:
    path = tmp_path / "g.adjlist"
    path.write_text("b a\nc b\n")
    found = read_source(path, None)
    assert found.num_nodes == 3 and any("order the file lists" in n for n in found.notes or [])


def _pyg(tmp_path: Path, **tensors: object) -> Path:
    path = tmp_path / "data.pt"
    base: dict[str, object] = {"edge_index": torch.tensor([[0, 1], [1, 2]]), "y": torch.zeros(3)}
    torch.save(base | tensors, path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _pyg(p, edge_index=[[0, 1], [1, 0]]), r"`edge_index` is a list, not a tensor"),
        (lambda p: _pyg(p, edge_index=torch.tensor([[0, 1], [1, 2]]).to_sparse()),
         r"`edge_index` is a sparse tensor; save edge_index\.to_dense\(\)"),
        (lambda p: _pyg(p, x=torch.ones(3, 2).to_sparse()), r"`x` is a sparse tensor"),
        (lambda p: _pyg(p, x=torch.ones(3, 2, 2)), r"features \(x\) have shape \[3, 2, 2\]"),
        (lambda p: _pyg(p, y=torch.tensor([0.5, 1.0, 0.0])), r"labels \(y\) hold values that"),
        (lambda p: _pyg(p, y=torch.tensor([0, 10**12, 1])), r"labels reach 1000000000000; cl"),
        (lambda p: _pyg(p, edge_index=torch.tensor([[0], [10**12]])),
         r"edges name node 1,000,000,000,000; LEO numbers nodes 0\.\.N-1 with N at most"),
    ],
)  # fmt: skip
def test_bad_pyg_tensors_are_one_sentence(
    tmp_path: Path, make: Callable[[Path], Path], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        convert(read_source(None, make(tmp_path)), tmp_path / "g.npz")
    assert not (tmp_path / "g.npz").exists()


def test_pyg_tensors_that_need_grad_or_are_bfloat16_convert(tmp_path: Path) -> None:
    x = torch.randn(3, 2, requires_grad=True)
    path = _pyg(tmp_path, x=x.to(torch.bfloat16), y=torch.tensor([0, 1, 0]))
    graph, _ = convert(read_source(None, path), tmp_path / "g.npz")
    assert np.array_equal(graph.x_NF, x.detach().to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0 1000000000000\n", r"edges name node 1,000,000,000,000; LEO numbers nodes 0\.\.N-1"),
        ("0 9223372036854775807\n", r"edges name node 9,223,372,036,854,775,807"),
        ("0 3037000500\n", r"N at most 3,037,000,499"),
    ],
)
def test_an_edge_list_with_a_huge_node_id_is_refused_before_allocating(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "e.txt").write_text(text)
    with pytest.raises(DataError, match=message):
        convert(read_source(tmp_path / "e.txt", None), tmp_path / "g.npz")


def test_a_node_count_past_the_free_memory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leo_cli.graph import convert as module

    monkeypatch.setattr(module, "available_memory_bytes", lambda: 1 << 30)
    (tmp_path / "e.txt").write_text("0 100000000\n")
    with pytest.raises(DataError, match=r"100,000,001 nodes need 2\.1 GiB, more than the 1\.0"):
        convert(read_source(tmp_path / "e.txt", None), tmp_path / "g.npz")


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ('node [ id 0 y 1 w 3 ] node [ id 1 y 0 w "abc" ]',
         r"attribute 'w' is a number on some nodes and 'abc' on others"),
        ("node [ id 0 y 99999999999999999999999 ] node [ id 1 y 0 ]",
         r"attribute 'y' holds label 99999999999999999999999; classes are numbered"),
    ],
)  # fmt: skip
def test_bad_gml_attributes_are_one_sentence(tmp_path: Path, nodes: str, message: str) -> None:
    path = tmp_path / "g.gml"
    path.write_text(f"graph [ {nodes} edge [ source 0 target 1 ] ]")
    with pytest.raises(DataError, match=message):
        convert(read_source(path, None), tmp_path / "g.npz")


def test_a_feature_list_of_strings_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "g.gml"
    path.write_text(
        'graph [ node [ id 0 y 0 x "a" x "b" ] node [ id 1 y 1 x "c" x "d" ] '
        "edge [ source 0 target 1 ] ]"
    )
    with pytest.raises(DataError, match=r"attribute `x` holds values that are not numbers"):
        read_source(path, None)
