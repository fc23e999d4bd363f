"""Bring your own graph: an edge list, a file networkx reads, a PyG dict of tensors or a DGL
graph file, with features, labels and a split, written in LEO's `.npz` format
(datasets/npz.md).

Every problem is one `DataError` naming the file and what to do; the output is written to a
temporary file, loaded back with LEO's own loader, and only then renamed into place.
Legend: N nodes, E edges, F features.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from leo_cli.errors import DataError
from leo_cli.graph.datasets.npz import MASK_KEYS, load_npz
from leo_cli.graph.types import MAX_CLASSES, MAX_NODES, Graph
from leo_cli.util.rss import available_memory_bytes

NETWORKX_READERS = {  # suffix -> networkx reader name
    ".graphml": "read_graphml",
    ".gml": "read_gml",
    ".gexf": "read_gexf",
    ".net": "read_pajek",
    ".pajek": "read_pajek",
    ".adjlist": "read_adjlist",
}
LABEL_ATTRIBUTES = ("y", "label", "class")  # node attributes read as labels (the first present)
FEATURE_ATTRIBUTE = "x"  # a node attribute holding the whole feature vector


@dataclass
class Arrays:
    """What a source gives before the split: edges, and features, labels, masks where known
    (`labelled_N`: which nodes have a label)."""

    edge_index_2E: npt.NDArray[np.int64]
    num_nodes: int
    x_NF: npt.NDArray[np.float32] | None = None
    y_N: npt.NDArray[np.int64] | None = None
    labelled_N: npt.NDArray[np.bool_] | None = None
    masks: dict[str, npt.NDArray[np.bool_]] | None = None
    notes: list[str] | None = None


def _missing(path: Path, what: str) -> DataError:
    return DataError(f"{what} file {path} does not exist; pass an existing file.")


def _delimiter(line: str) -> str | None:
    """`,` or tab where the line holds one, else None (any whitespace)."""
    return "," if "," in line else ("\t" if "\t" in line else None)


def _first_line(path: Path) -> str:
    """The first line that is neither blank nor a `#` comment ('' for none)."""
    with path.open(errors="replace") as f:
        for line in f:
            if line.strip() and not line.lstrip().startswith("#"):
                return line.rstrip("\n")
    return ""


def _is_number(text: str, kind: type) -> bool:
    try:
        kind(text.strip())
    except ValueError:
        return False
    return True


def read_table(
    path: Path, what: str, kind: type = float, columns: int | None = None
) -> npt.NDArray[Any]:
    """A CSV / TSV / whitespace table of numbers (`#` comments, an optional header row), 2-D;
    `columns`: read only the first ones (the others may hold anything)."""
    if not path.is_file():
        raise _missing(path, what)
    first = _first_line(path)
    if not first:
        raise DataError(f"{what} file {path} is empty; it needs one row per line.")
    sep = _delimiter(first)
    cells = [c for c in first.split(sep) if c.strip()][:columns]
    header = not all(_is_number(c, kind) for c in cells)
    if columns is not None and len(cells) < columns:
        raise DataError(f"{what} file {path} has fewer than {columns} columns; give {columns}.")
    try:
        table = np.loadtxt(
            path, delimiter=sep, comments="#", skiprows=int(header), ndmin=2,
            dtype=np.int64 if kind is int else np.float64,
            usecols=None if columns is None else range(columns),
        )  # fmt: skip
    except ValueError as err:
        raise DataError(
            f"{what} file {path} holds something other than {kind.__name__} values "
            f"({str(err).splitlines()[0]}); give one row of numbers per line."
        ) from None
    return table


def read_edge_list(path: Path) -> Arrays:
    """Two columns of integer node ids (more columns, e.g. weights, are ignored)."""
    table = read_table(path, "edge list", int, columns=2)
    edges = np.ascontiguousarray(table.T)
    if edges.size and edges.min() < 0:
        raise DataError(f"edge list {path} holds negative node ids; ids must be 0..N-1.")
    return Arrays(edges, int(edges.max()) + 1 if edges.size else 0)


def read_networkx(path: Path) -> Arrays:
    """A graph file networkx reads: nodes numbered by their integer names, else in file order;
    labels from the `y`, `label` or `class` attribute (GML and GEXF: `y` or `class`, their
    `label` is the node's name); features from an `x` list or the numeric attributes (by
    name)."""
    import networkx as nx

    if not path.is_file():
        raise _missing(path, "graph")
    suffix = path.suffix.lower()
    reader = getattr(nx, NETWORKX_READERS[suffix])
    try:  # GML: nodes named by their `id` (its `label` may be a class)
        graph = reader(path, label="id") if suffix == ".gml" else reader(path)
    except Exception as err:  # networkx raises many kinds for a malformed file
        raise DataError(f"networkx cannot read {path} ({err}); check the file's format.") from None
    nodes = list(graph.nodes)
    numbered = all(_int_like(n) for n in nodes)
    if numbered:  # integer names keep their order (0..N-1 stay themselves)
        nodes.sort(key=lambda n: int(n))
    ids = {node: i for i, node in enumerate(nodes)}
    pairs = [(ids[u], ids[v]) for u, v in graph.edges()]
    edges = np.array(pairs, dtype=np.int64).reshape(-1, 2).T.copy()
    found = Arrays(edges, len(nodes), notes=[])
    attrs = [graph.nodes[n] for n in nodes]
    # GML and GEXF files keep the node's name in `label` (networkx writes them so)
    names = LABEL_ATTRIBUTES if suffix not in (".gml", ".gexf") else ("y", "class")
    label = next((a for a in names if any(a in d for d in attrs)), None)
    if label is not None:
        found.y_N, found.labelled_N, named = _labels_of(path, label, [d.get(label) for d in attrs])
        if named:
            found.notes = [f"labels {named} numbered 0..{len(named.split(', ')) - 1}"]
    found.x_NF = _features_of(path, attrs, label)
    if not numbered:
        found.notes = [*(found.notes or []), "nodes numbered 0..N-1 in the order the file lists"]
    elif [int(n) for n in nodes] != list(range(len(nodes))):
        found.notes = [*(found.notes or []), "nodes numbered 0..N-1 in the order of their ids"]
    return found


def _int_like(name: Any) -> bool:
    """An integer node name, or a string of one."""
    if isinstance(name, bool):
        return False
    return isinstance(name, int) or (isinstance(name, str) and name.lstrip("-").isdigit())


def _labels_of(
    path: Path, name: str, values: list[Any]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], str | None]:
    """Labels as ints (names numbered in sorted order), which nodes have one, and the names."""
    present = [v for v in values if v is not None]
    if all(_int_like(v) for v in present):  # negative numbers: no label, as in a CSV
        top = max((int(v) for v in present), default=0)
        if top >= MAX_CLASSES:
            raise DataError(
                f"{path}: node attribute {name!r} holds label {top}; classes are numbered "
                f"0..C-1 with C at most {MAX_CLASSES:,}."
            )
        y = np.array([max(int(v), -1) if v is not None else -1 for v in values], dtype=np.int64)
        return np.maximum(y, 0), y >= 0, None
    has = np.array([v is not None for v in values], dtype=bool)
    names = sorted({str(v) for v in present})
    index = {n: i for i, n in enumerate(names)}
    y = np.array([index[str(v)] if v is not None else 0 for v in values], dtype=np.int64)
    return y, has, ", ".join(names)


def _features_of(
    path: Path, attrs: list[dict[str, Any]], label: str | None
) -> npt.NDArray[np.float32] | None:
    """The `x` attribute, else every numeric attribute (not the label), else None."""
    if attrs and all(isinstance(d.get(FEATURE_ATTRIBUTE), list | tuple) for d in attrs):
        rows = [d[FEATURE_ATTRIBUTE] for d in attrs]
        if len({len(r) for r in rows}) != 1:
            raise DataError(f"{path}: node attribute `x` has rows of different lengths.")
        if not all(_numeric(v) for r in rows for v in r):
            raise DataError(f"{path}: node attribute `x` holds values that are not numbers.")
        return np.array(rows, dtype=np.float32)
    names = sorted({k for d in attrs for k, v in d.items() if k != label and _numeric(v)})
    if not names:
        return None
    for name in names:
        if any(name not in d for d in attrs):
            raise DataError(
                f"{path}: node attribute {name!r} is missing on some nodes; give every node "
                "every feature attribute."
            )
        odd = next((d[name] for d in attrs if not _numeric(d[name])), None)
        if odd is not None:
            raise DataError(
                f"{path}: node attribute {name!r} is a number on some nodes and {odd!r} on "
                "others; give it a number on every node, or drop it."
            )
    return np.array([[float(d[k]) for k in names] for d in attrs], dtype=np.float32)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_pyg(path: Path) -> Arrays:
    """A dict of tensors saved with `torch.save` (`edge_index`, `x`, `y`, masks), loaded with
    `weights_only=True`."""
    import torch

    if not path.is_file():
        raise _missing(path, "PyG")
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # pickle and torch raise many kinds for a foreign file
        raise DataError(
            f"{path} is not a dict of tensors torch.load reads with weights_only=True ({err}); "
            "save one with torch.save({'edge_index': ..., 'x': ..., 'y': ...}, path)."
        ) from None
    if not isinstance(data, dict) or "edge_index" not in data:
        raise DataError(
            f"{path} holds no dict with an `edge_index` tensor; save "
            "{'edge_index': ..., 'x': ..., 'y': ..., 'train_mask': ...} with torch.save."
        )
    if not isinstance(data["edge_index"], torch.Tensor):
        raise DataError(
            f"{path}: `edge_index` is a {type(data['edge_index']).__name__}, not a tensor; save "
            "torch.tensor(edge_index) of shape [2, E]."
        )
    arrays = {k: _tensor_array(path, k, v) for k, v in data.items() if isinstance(v, torch.Tensor)}
    edges = arrays["edge_index"]
    if edges.ndim != 2 or edges.shape[0] != 2 or edges.dtype.kind not in "iu":
        raise DataError(f"{path}: `edge_index` must be an integer tensor of shape [2, E].")
    n = max(int(edges.max()) + 1 if edges.size else 0, len(arrays.get("x", [])))
    return _with_node_data(Arrays(edges.astype(np.int64), n), arrays, ("x",), ("y",))


def _tensor_array(path: Path, key: str, tensor: Any) -> npt.NDArray[Any]:
    """A saved tensor as a numpy array: detached, floats numpy lacks (bfloat16, float8) as
    float32; a sparse or otherwise unreadable tensor is a DataError naming the key."""
    import torch

    if tensor.layout != torch.strided:
        raise DataError(f"{path}: `{key}` is a sparse tensor; save {key}.to_dense() instead.")
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32):
        tensor = tensor.to(torch.float64 if tensor.dtype == torch.float64 else torch.float32)
    try:
        array: npt.NDArray[Any] = tensor.numpy()
    except (TypeError, RuntimeError) as err:
        raise DataError(f"{path}: `{key}` cannot be read as an array ({err}).") from None
    return array


DGL_FEATURES = ("feat", "features", "x")  # node data read as features (the first present)
DGL_LABELS = ("label", "labels", "y")


def read_dgl(path: Path) -> Arrays:
    """The first graph of a file `dgl.save_graphs` wrote (one node and edge type): its
    edges, and the node data `feat` (or `features`, `x`), `label` (or `labels`, `y`) and
    the three masks where present. Needs DGL, the only reader of its format."""
    if not path.is_file():
        raise _missing(path, "DGL")
    try:
        import dgl  # type: ignore[import-not-found, unused-ignore]
    except Exception as err:  # a build for another torch fails in many ways
        raise DataError(
            f"reading {path} needs DGL, which cannot be imported here ({type(err).__name__}: "
            f"{err}); install a DGL build for this torch, or save the graph's tensors as a "
            "dict with torch.save and use --from-pyg."
        ) from None
    try:
        graphs, _ = dgl.load_graphs(str(path))
    except Exception as err:  # DGL raises its own errors for a foreign file
        raise DataError(
            f"{path} is not a file dgl.save_graphs wrote ({err}); save the graph with "
            "dgl.save_graphs(path, [g])."
        ) from None
    if not graphs:
        raise DataError(f"{path} holds no graph; save one with dgl.save_graphs(path, [g]).")
    g = graphs[0]
    if len(g.ntypes) != 1 or len(g.canonical_etypes) != 1:
        raise DataError(
            f"{path}: the graph has {len(g.ntypes)} node and {len(g.canonical_etypes)} edge "
            "types; save dgl.to_homogeneous(g) (with ndata=[...] for its features) instead."
        )
    src, dst = g.edges()
    edges = np.stack([src.numpy(), dst.numpy()]).astype(np.int64)
    arrays = {k: v.numpy() for k, v in g.ndata.items() if hasattr(v, "numpy")}
    found = _with_node_data(Arrays(edges, int(g.num_nodes())), arrays, DGL_FEATURES, DGL_LABELS)
    if len(graphs) > 1:
        found.notes = [f"{path} holds {len(graphs)} graphs; the first was converted."]
    return found


def _with_node_data(
    found: Arrays,
    arrays: dict[str, npt.NDArray[Any]],
    feature_keys: tuple[str, ...],
    label_keys: tuple[str, ...],
) -> Arrays:
    """`found` with the features, labels (negative: unlabelled) and masks among `arrays`
    (the first of each key list present)."""
    x = next((arrays[k] for k in feature_keys if k in arrays), None)
    y = next((arrays[k] for k in label_keys if k in arrays), None)
    if x is not None:
        if x.ndim != 2 or x.dtype.kind not in "fiub":
            raise DataError(
                f"the features ({'/'.join(feature_keys)}) have shape {list(x.shape)} and dtype "
                f"{x.dtype}; give numbers of shape [N, F]."
            )
        found.x_NF = x.astype(np.float32)
    if y is not None:
        if y.dtype.kind not in "iub" and not (np.isfinite(y).all() and (y == np.round(y)).all()):
            raise DataError(
                f"the labels ({'/'.join(label_keys)}) hold values that are not whole numbers; "
                "give integer class numbers."
            )
        found.y_N = y.reshape(-1).astype(np.int64)
        found.labelled_N = found.y_N >= 0
    if all(k in arrays for k in MASK_KEYS):
        found.masks = {k: arrays[k].astype(bool) for k in MASK_KEYS}
    return found


def read_features(path: Path) -> npt.NDArray[np.float32]:
    """N x F features from an `.npy` array or a CSV table."""
    if path.suffix.lower() == ".npy":
        array = _load_npy(path, "features")
        if array.ndim != 2 or array.dtype.kind not in "fiub":
            raise DataError(f"features file {path} must hold a numeric array of shape [N, F].")
        return array.astype(np.float32)
    return read_table(path, "features").astype(np.float32)


def read_labels(path: Path, num_nodes: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Labels from an `.npy` array or a CSV: one label per node in order, or two columns
    `node,label` (nodes not listed get no label and stay out of every mask)."""
    if path.suffix.lower() == ".npy":
        y = _load_npy(path, "labels")
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise DataError(f"labels file {path} must hold an integer array of shape [N].")
        return y.astype(np.int64), y >= 0
    table = read_table(path, "labels", int)
    if table.shape[1] == 1:
        y = table[:, 0]
        return y, y >= 0
    if table.shape[1] != 2:
        raise DataError(
            f"labels file {path} has {table.shape[1]} columns; give 1 or 2 (node,label)."
        )
    ids, values = table[:, 0], table[:, 1]
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise DataError(f"labels file {path} names nodes outside 0..{num_nodes - 1}.")
    y = np.zeros(num_nodes, dtype=np.int64)
    labelled = np.zeros(num_nodes, dtype=bool)
    y[ids], labelled[ids] = values, values >= 0
    return y, labelled


def read_masks(path: Path) -> dict[str, npt.NDArray[np.bool_]]:
    """`train_mask`, `val_mask`, `test_mask` from an `.npz` file."""
    if not path.is_file():
        raise _missing(path, "masks")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in MASK_KEYS if k not in archive.files]
            if missing:
                raise DataError(f"masks file {path} lacks {', '.join(missing)}; save all three.")
            return {k: archive[k].astype(bool) for k in MASK_KEYS}
    except (OSError, ValueError) as err:
        raise DataError(f"masks file {path} is not a readable .npz file ({err}).") from None


def _load_npy(path: Path, what: str) -> npt.NDArray[Any]:
    if not path.is_file():
        raise _missing(path, what)
    try:
        array: npt.NDArray[Any] = np.asarray(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as err:
        raise DataError(f"{what} file {path} is not a readable .npy array ({err}).") from None
    return array


def split_masks(
    labelled_N: npt.NDArray[np.bool_], fractions: tuple[float, float, float], seed: int
) -> dict[str, npt.NDArray[np.bool_]]:
    """Random train / val / test masks over the labelled nodes, by fractions (sum <= 1)."""
    nodes = np.flatnonzero(labelled_N)
    order = np.random.default_rng(seed).permutation(nodes)
    counts = [int(round(f * len(nodes))) for f in fractions]
    bounds = np.cumsum([0, *counts])
    masks = {}
    for key, lo, hi in zip(MASK_KEYS, bounds[:-1], bounds[1:], strict=True):
        mask = np.zeros(labelled_N.shape[0], dtype=bool)
        mask[order[lo : min(hi, len(order))]] = True
        masks[key] = mask
    return masks


def parse_split(text: str) -> tuple[float, float, float]:
    """`0.6,0.2,0.2` as three fractions, each in [0, 1], summing to at most 1."""
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or any(not 0 <= p <= 1 for p in parts) or sum(parts) > 1 + 1e-9:
        raise DataError(
            f"--split {text} is not three fractions summing to at most 1 (e.g. 0.6,0.2,0.2)."
        )
    return parts[0], parts[1], parts[2]


def read_source(edges: Path | None, from_pyg: Path | None, from_dgl: Path | None = None) -> Arrays:
    """The graph of an edge list, a networkx file, a PyG dict or a DGL graph file."""
    if sum(source is not None for source in (edges, from_pyg, from_dgl)) != 1:
        raise DataError(
            "give one source: an edge list / graph file, --from-pyg FILE or --from-dgl FILE."
        )
    if from_pyg is not None:
        return read_pyg(from_pyg)
    if from_dgl is not None:
        return read_dgl(from_dgl)
    assert edges is not None
    if edges.suffix.lower() in NETWORKX_READERS:
        return read_networkx(edges)
    return read_edge_list(edges)


def convert(
    found: Arrays,
    out: Path,
    features: Path | None = None,
    labels: Path | None = None,
    masks: Path | None = None,
    split: tuple[float, float, float] = (0.6, 0.2, 0.2),
    seed: int = 0,
) -> tuple[Graph, list[str]]:
    """Complete what the source lacks from the given files, write `out` and load it back with
    LEO's loader; returns the graph and notes for the user."""
    notes = list(found.notes or [])
    _check_size(found.num_nodes)
    x = read_features(features) if features is not None else found.x_NF
    n = max(found.num_nodes, 0 if x is None else x.shape[0])
    if x is None:
        x = np.ones((n, 1), dtype=np.float32)
        notes.append("no features given: every node gets the constant feature 1 (--features)")
    elif x.shape[0] != n:
        raise DataError(
            f"the features have {x.shape[0]} rows but the edges name {n} nodes; give one "
            "feature row per node 0..N-1."
        )
    y, labelled = found.y_N, found.labelled_N
    if labels is not None:
        y, labelled = read_labels(labels, n)
    if y is None or labelled is None:
        raise DataError(
            "no labels: pass --labels FILE (.npy or CSV), or a graph file whose nodes carry a "
            "`y` (or `label`, `class`) attribute."
        )
    if y.shape[0] != n:
        raise DataError(f"the labels cover {y.shape[0]} nodes but the graph has {n}.")
    if labelled.any() and int(y[labelled].max()) >= MAX_CLASSES:
        raise DataError(
            f"the labels reach {int(y[labelled].max())}; classes are numbered 0..C-1 with C at "
            f"most {MAX_CLASSES:,}."
        )
    y = np.where(labelled, y, 0)
    chosen = read_masks(masks) if masks is not None else found.masks
    if chosen is None:
        chosen = split_masks(labelled, split, seed)
        share = "/".join(f"{f:g}" for f in split)
        notes.append(f"random {share} split of the {int(labelled.sum())} labelled nodes")
    for key, mask in chosen.items():
        if mask.shape != (n,):
            raise DataError(f"{key} has {mask.shape[0]} entries but the graph has {n} nodes.")
    dropped = sum(int((m & ~labelled).sum()) for m in chosen.values())
    if dropped:
        chosen = {k: m & labelled for k, m in chosen.items()}
        notes.append(f"{dropped} mask entries of nodes without a label left out")
    graph = write_npz(out, {"edge_index": found.edge_index_2E, "x": x, "y": y, **chosen})
    return graph, notes


NODE_BYTES = 4 + 8 + 8 + 3  # a node's feature 1, label, symmetrising key share, three masks


def _check_size(num_nodes: int) -> None:
    """Refuse, before allocating anything per node, a node count past `MAX_NODES` or one whose
    arrays cannot fit in the free memory (an id far beyond the others, most often)."""
    if num_nodes > MAX_NODES:
        raise DataError(
            f"the edges name node {num_nodes - 1:,}; LEO numbers nodes 0..N-1 with N at most "
            f"{MAX_NODES:,}: renumber the ids without gaps."
        )
    free = available_memory_bytes()
    if free is not None and num_nodes * NODE_BYTES > free:
        raise DataError(
            f"the edges name node {num_nodes - 1:,}, and {num_nodes:,} nodes need "
            f"{num_nodes * NODE_BYTES / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB "
            "free here: renumber the ids 0..N-1 without gaps."
        )


def _unwritable(out: Path, exc: OSError) -> DataError:
    return DataError(f"--out {out} cannot be written ({exc.strerror}); choose another path.")


def write_npz(out: Path, arrays: dict[str, npt.NDArray[Any]]) -> Graph:
    """Write `out` atomically, checked by LEO's loader first (the graph it loads is returned);
    nothing is left behind on failure."""
    if out.suffix != ".npz":
        raise DataError(f"--out {out} must end in .npz (data.name recognises the suffix).")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".npz")
    except OSError as exc:
        raise DataError(
            f"--out {out} cannot be written ({exc.strerror}); choose another."
        ) from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        try:
            graph = load_npz(tmp)  # what a run will read, checked before it takes the name
        except DataError as err:
            raise DataError(str(err).replace(tmp, str(out))) from None
        graph.name = out.stem
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise DataError(
            f"--out {out} cannot be written ({exc.strerror}); choose another."
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return graph
