"""Cora, CiteSeer and PubMed from the raw Planetoid files (Yang et al. 2016).

The files `ind.<name>.{x,y,tx,ty,allx,ally,graph}` are Python 2 pickles of numpy arrays, scipy
CSR matrices and a dict of adjacency lists; `ind.<name>.test.index` is text. They are read with
an unpickler that resolves only the handful of classes those files contain, so a tampered file
cannot run code, and every shape, id and neighbour list in them is checked (dense sizes bounded
by the file's size), so crafted content is a one-sentence `DataError`. Preprocessing follows
Kipf & Welling (2017): test rows are put back in node-id order, CiteSeer's test ids without a
node get zero rows, features are row-normalised, and the split is train = the first 140
(CiteSeer 120, PubMed 60) nodes, val = the next 500, test = the ids in `test.index`.
"""

from __future__ import annotations

import functools
import io
import operator
import pickle
import reprlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.errors import DataError
from leo_cli.graph.types import (
    BoolArray,
    Graph,
    IntArray,
    check_graph,
    row_normalise,
    symmetrize,
)

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
_MATRIX_PARTS = ("x", "y", "tx", "ty", "allx", "ally")
_PICKLED_PARTS = (*_MATRIX_PARTS, "graph")
PLANETOID_PARTS = (*_PICKLED_PARTS, "test.index")
# The real files hold 0.2-15 matrix entries per byte; far more means a crafted shape.
_MAX_ENTRIES_PER_BYTE = 1024
_NUM_VAL = 500


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """The exact globals the original files reference, mapped to where they live today
    (scipy imported where a file is read: a run on cached partitions reads none)."""
    import scipy.sparse as sp

    return {
        ("numpy.core.multiarray", "_reconstruct"): np.empty(0).__reduce__()[0],
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
        ("collections", "defaultdict"): defaultdict,
        ("__builtin__", "list"): list,
    }


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals the original Planetoid files reference."""

    def find_class(self, module: str, name: str) -> Any:
        """Return the allowed object for `module.name`; refuse anything else."""
        try:
            return _allowed_globals()[(module, name)]
        except KeyError:
            raise DataError(
                f"refusing to load `{module}.{name}` from a pickled dataset file: Planetoid files "
                "contain only numpy arrays, scipy CSR matrices and adjacency lists."
            ) from None


def restricted_loads(data: bytes, source: Path) -> Any:
    """Unpickle `data` (read from `source`) with `RestrictedUnpickler`.

    Raises:
        DataError: the pickle references a disallowed global or is corrupt.
    """
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except DataError as err:
        raise DataError(f"{source}: {err}") from None
    except Exception as err:  # corrupt pickles raise many types (EOFError, ValueError, ...)
        raise DataError(f"{source} is not a readable Planetoid pickle ({err}).") from None


def planetoid_files(name: str, root: Path) -> dict[str, Path]:
    """Paths of every raw file of dataset `name` under `root`, checked to exist.

    Raises:
        DataError: naming the first missing file and the dataset card to read.
    """
    files = {part: root / f"ind.{name}.{part}" for part in PLANETOID_PARTS}
    for path in files.values():
        if not path.is_file():
            raise DataError(
                f"Planetoid file {path} is missing: put the raw `ind.{name}.*` files in "
                f"data.root (see datasets/{name}.md)."
            )
    return files


def _shape(matrix: Any, path: Path) -> tuple[int, int]:
    """(rows, columns) of a pickled CSR matrix or 2-D array."""
    import scipy.sparse as sp

    try:
        if isinstance(matrix, (sp.spmatrix, np.ndarray)):
            rows, cols = (operator.index(n) for n in matrix.shape)
            return rows, cols
    except (AttributeError, TypeError, ValueError):
        pass  # a crafted object without a usable shape: refused below like any other
    raise DataError(f"{path} holds a {type(matrix).__name__}, expected a 2-D matrix.")


def _dense(matrix: Any, path: Path) -> np.ndarray:
    """A pickled CSR matrix or array as a dense float64 array (old CSR pickles are rebuilt).

    The dense size is bounded by the file's size: a sparse matrix may declare any shape, and a
    crafted one would otherwise ask for petabytes.
    """
    import scipy.sparse as sp

    rows, cols = _shape(matrix, path)
    if rows * cols > _MAX_ENTRIES_PER_BYTE * path.stat().st_size:
        raise DataError(
            f"{path} declares a {rows} x {cols} matrix, far more than its "
            f"{path.stat().st_size} bytes describe; the file is not a Planetoid matrix."
        )
    try:
        if isinstance(matrix, sp.spmatrix):
            parts = (matrix.data, matrix.indices, matrix.indptr)
            dense = sp.csr_matrix(parts, shape=(rows, cols)).toarray()
        else:
            dense = matrix
        dense = np.asarray(dense, dtype=np.float64)
    except (AttributeError, TypeError, ValueError) as err:
        raise DataError(f"{path} holds a malformed matrix ({err}).") from None
    if not np.isfinite(dense).all():
        raise DataError(f"{path} holds NaN or infinite values.")
    return dense


def _check_shapes(files: dict[str, Path], m: dict[str, np.ndarray]) -> None:
    """Features and labels pair up row by row; features share a width, labels too."""
    for feat, label in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        if m[feat].shape[0] != m[label].shape[0]:
            raise DataError(
                f"{files[label]} has {m[label].shape[0]} rows but {files[feat]} has "
                f"{m[feat].shape[0]}; the files do not belong together."
            )
    for group in (("allx", "x", "tx"), ("ally", "y", "ty")):
        for part in group[1:]:
            if m[part].shape[1] != m[group[0]].shape[1]:
                raise DataError(
                    f"{files[part]} has {m[part].shape[1]} columns but {files[group[0]]} has "
                    f"{m[group[0]].shape[1]}; the files do not belong together."
                )
    if m["ally"].shape[1] == 0:
        raise DataError(f"{files['ally']} has no columns; it needs one per class.")
    if m["x"].shape[0] > m["allx"].shape[0]:
        raise DataError(
            f"{files['x']} has more rows than {files['allx']}; its training nodes are the first "
            "rows of allx, so the files do not belong together."
        )


def _read_test_index(path: Path) -> IntArray:
    """The test node ids of `ind.<name>.test.index`, one integer per line, in file order."""
    try:
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except ValueError as err:
        raise DataError(f"{path} must hold one integer node id per line ({err}).") from None


def _check_test_rows(files: dict[str, Path], m: dict[str, np.ndarray], ids: IntArray) -> None:
    """tx holds one row per listed test id; the ids are distinct and follow allx's rows.

    The test ids may leave holes (CiteSeer has 15), but no more holes than ids: that bounds the
    rows `_stack_with_test` allocates by the size of tx.
    """
    num_test, num_all = int(ids.shape[0]), int(m["allx"].shape[0])
    if m["tx"].shape[0] != num_test or num_test == 0:
        raise DataError(
            f"{files['tx']} has {m['tx'].shape[0]} rows but {files['test.index']} lists "
            f"{num_test} test ids; the files do not belong together."
        )
    if int(ids.min()) < num_all or int(ids.max()) >= num_all + 2 * num_test:
        raise DataError(
            f"{files['test.index']} lists ids outside {num_all}..{num_all + 2 * num_test - 1} "
            f"(after the {num_all} rows of allx, at most one hole per test id); the files do "
            "not belong together."
        )
    if np.unique(ids).shape[0] != num_test:
        raise DataError(f"{files['test.index']} lists a node id twice.")


def _stack_with_test(
    train_part: np.ndarray, test_part: np.ndarray, test_index: IntArray
) -> np.ndarray:
    """Rows of allx/ally then tx/ty, with row k of tx/ty moved to node `test_index[k]`.

    Test ids form a range right after the other nodes; CiteSeer's range has holes (ids in the
    range but not in the file), which get zero rows. Same two steps as Kipf & Welling's code.
    """
    sorted_index = np.sort(test_index)
    lo, hi = train_part.shape[0], int(sorted_index[-1])
    full_test = np.zeros((hi - lo + 1, test_part.shape[1]), dtype=np.float64)
    full_test[sorted_index - lo] = test_part
    stacked = np.concatenate([train_part, full_test])
    # Row k now sits at the k-th smallest test id; the file lists ids unsorted: move it.
    stacked[test_index] = stacked[sorted_index]
    return stacked


def _adjacency_to_edges(adjacency: Any, path: Path, num_nodes: int) -> IntArray:
    """Directed edge list of a dict {node: [neighbours]}, before symmetrisation.

    Checked entry by entry: keys and neighbours must be Python ints in 0..num_nodes-1.
    """
    if not isinstance(adjacency, dict):
        raise DataError(f"{path} holds a {type(adjacency).__name__}, expected a dict of lists.")
    heads: list[int] = []
    tails: list[int] = []
    for head, neighbours in adjacency.items():
        if not isinstance(neighbours, list):
            raise DataError(
                f"{path} maps node {reprlib.repr(head)} to a {type(neighbours).__name__}, "
                "expected a list of node ids."
            )
        for node in (head, *neighbours):
            if type(node) is not int or not 0 <= node < num_nodes:
                raise DataError(
                    f"{path} holds {reprlib.repr(node)} where a node id in "
                    f"0..{num_nodes - 1} belongs."
                )
        heads += [head] * len(neighbours)
        tails += neighbours
    return np.array([heads, tails], dtype=np.int64).reshape(2, -1)


def _masks(num_nodes: int, num_train: int, test_index: IntArray) -> tuple[BoolArray, ...]:
    """Kipf & Welling's split: first `num_train` nodes, next 500, and the test ids."""
    train, val, test = (np.zeros(num_nodes, dtype=np.bool_) for _ in range(3))
    train[:num_train] = True
    val[num_train : num_train + _NUM_VAL] = True
    test[test_index] = True
    return train, val, test


def load_planetoid(name: str, root: Path, normalize: bool = True) -> Graph:
    """Load Planetoid dataset `name` (`cora`, `citeseer` or `pubmed`) from `root`.

    Args:
        name: lower-case dataset name.
        root: folder holding `ind.<name>.*` (`data.root`).
        normalize: divide each node's features by their sum (`data.normalize_features`).

    Returns:
        The preprocessed graph.

    Raises:
        DataError: a file is missing, unreadable or inconsistent.
    """
    files = planetoid_files(name, root)
    obj = {part: restricted_loads(files[part].read_bytes(), files[part]) for part in _PICKLED_PARTS}
    m = {part: _dense(obj[part], files[part]) for part in _MATRIX_PARTS}
    test_index = _read_test_index(files["test.index"])
    _check_shapes(files, m)
    _check_test_rows(files, m, test_index)
    x = _stack_with_test(m["allx"], m["tx"], test_index)
    onehot = _stack_with_test(m["ally"], m["ty"], test_index)
    num_nodes = x.shape[0]
    edges = _adjacency_to_edges(obj["graph"], files["graph"], num_nodes)
    train, val, test = _masks(num_nodes, m["y"].shape[0], test_index)
    graph = Graph(
        name=name,
        edge_index_2E=symmetrize(edges, num_nodes),
        x_NF=row_normalise(x) if normalize else np.asarray(x, dtype=np.float32),
        y_N=onehot.argmax(axis=1).astype(np.int64),
        train_mask_N=train,
        val_mask_N=val,
        test_mask_N=test,
        num_classes=int(onehot.shape[1]),
    )
    check_graph(graph)
    return graph
