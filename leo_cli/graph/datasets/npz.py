"""A graph stored as one `.npz` file (the format for bringing your own data).

Keys (see datasets/npz.md):

- `edge_index`: integer [2, E], source row then target row; made symmetric on load;
- `x`: float (or integer) [N, F] node features, finite;
- `y`: integer [N] labels in `0..num_classes-1`;
- `train_mask`, `val_mask`, `test_mask`: bool [N];
- `num_classes` (optional): integer scalar, at least `max(y) + 1` (default `max(y) + 1`),
  at most `MAX_CLASSES`.

Files are opened with `allow_pickle=False`: object arrays are refused. Before any member is
read, the sizes its zip headers declare are checked (the inflated data never exceeds them):
a file that inflates past the free memory, or a large member that inflates more than
`MAX_INFLATION` times (a zip bomb), is refused.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from leo_cli.errors import DataError
from leo_cli.graph.types import MAX_CLASSES, MAX_NODES, Graph, check_graph, symmetrize
from leo_cli.util.rss import available_memory_bytes

MAX_INFLATION = 1000  # inflated / compressed size of a member beyond which it is a zip bomb
INFLATION_FLOOR = 1 << 30  # members inflating to less are read whatever their ratio
REQUIRED_KEYS = ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask")
MASK_KEYS = ("train_mask", "val_mask", "test_mask")


def _read(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file, loaded eagerly (the file is closed on return)."""
    if not path.is_file():
        raise DataError(f"graph file {path} does not exist (see datasets/npz.md for the format).")
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path} is not an .npz archive; write it with numpy.savez.")
    try:
        _check_inflation(path)
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except MemoryError:
        raise DataError(f"{path} does not fit in this machine's memory.") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DataError(
            f"{path} is not a readable .npz file without pickled objects ({err})."
        ) from None


def _check_inflation(path: Path) -> None:
    """Refuse an archive whose declared sizes are a zip bomb or exceed the free memory: the
    zip's sizes, and each array's own header (numpy allocates the shape it declares before
    reading a byte)."""
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        for info in members:
            _check_declared(path, archive, info)
    for info in members:
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > INFLATION_FLOOR and ratio > MAX_INFLATION:
            raise DataError(
                f"{path}: member {info.filename} inflates {ratio:,.0f} times to "
                f"{info.file_size / 2**30:,.1f} GiB (a zip bomb?); write the file with "
                "numpy.savez."
            )
    total, free = sum(i.file_size for i in members), available_memory_bytes()
    if free is not None and total > free:
        raise DataError(
            f"{path} inflates to {total / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB of memory free here; load it on a larger machine."
        )


def _check_declared(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """An .npy member's declared shape must fit in the bytes the member holds."""
    if not info.filename.endswith(".npy"):
        return
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(member)
        except ValueError:
            return  # not an array header: np.load says what is wrong
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > info.file_size:
        raise DataError(
            f"{path}: member {info.filename} declares {declared:,} bytes of shape "
            f"{tuple(shape)} but holds {info.file_size:,}; write the file with numpy.savez."
        )


def _bad(path: Path, key: str, problem: str) -> DataError:
    """A DataError naming the file and the offending key."""
    return DataError(f"{path}: key `{key}` {problem} (see datasets/npz.md).")


def _check_kinds(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Presence, dtype kinds and ranks of every key."""
    for key in REQUIRED_KEYS:
        if key not in arrays:
            raise _bad(path, key, "is missing")
    if arrays["edge_index"].dtype.kind not in "iu" or arrays["edge_index"].ndim != 2:
        raise _bad(path, "edge_index", "must be an integer array of shape [2, E]")
    if arrays["edge_index"].shape[0] != 2:
        raise _bad(path, "edge_index", f"has shape {arrays['edge_index'].shape}, expected [2, E]")
    if arrays["x"].dtype.kind not in "fiu" or arrays["x"].ndim != 2:
        raise _bad(path, "x", "must be a float array of shape [N, F]")
    if arrays["y"].dtype.kind not in "iu" or arrays["y"].ndim != 1:
        raise _bad(path, "y", "must be an integer array of shape [N]")
    for key in MASK_KEYS:
        if arrays[key].dtype != np.bool_ or arrays[key].ndim != 1:
            raise _bad(path, key, "must be a bool array of shape [N]")


def _check_values(path: Path, arrays: dict[str, np.ndarray]) -> int:
    """Sizes agree, ids and labels are in range, features are finite; returns num_classes."""
    num_nodes = arrays["x"].shape[0]
    if num_nodes > MAX_NODES:
        raise _bad(path, "x", f"has {num_nodes:,} rows; LEO trains at most {MAX_NODES:,} nodes")
    for key in ("y", *MASK_KEYS):
        if arrays[key].shape[0] != num_nodes:
            raise _bad(
                path, key, f"has {arrays[key].shape[0]} entries but `x` has {num_nodes} rows"
            )
    edges = arrays["edge_index"]
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise _bad(path, "edge_index", f"holds node ids outside 0..{num_nodes - 1}")
    if not np.isfinite(arrays["x"]).all():
        raise _bad(path, "x", "holds NaN or infinite values")
    y = arrays["y"]
    if y.size and y.min() < 0:
        raise _bad(path, "y", "holds negative labels")
    num_classes = int(y.max()) + 1 if y.size else 1
    if "num_classes" in arrays:
        given = arrays["num_classes"]
        if given.ndim != 0 or given.dtype.kind not in "iu" or int(given) < num_classes:
            raise _bad(
                path, "num_classes", f"must be an integer scalar >= max(y) + 1 = {num_classes}"
            )
        num_classes = int(given)
    if num_classes > MAX_CLASSES:
        raise _bad(
            path, "y" if "num_classes" not in arrays else "num_classes",
            f"gives {num_classes:,} classes; LEO trains at most {MAX_CLASSES:,} (number the "
            "classes 0..C-1 without gaps)",
        )  # fmt: skip
    return num_classes


def load_npz(path_like: str | Path) -> Graph:
    """Load a graph from a `.npz` file with the documented keys.

    Args:
        path_like: path to the file, relative to the working directory or absolute.

    Returns:
        The graph (named after the file's stem), made symmetric.

    Raises:
        DataError: the file is missing or unreadable, or a key is missing or invalid.
    """
    path = Path(path_like).expanduser()
    arrays = _read(path)
    _check_kinds(path, arrays)
    # Cast before the finiteness check, so that float64 values beyond float32's range fail it.
    arrays["x"] = arrays["x"].astype(np.float32)
    num_classes = _check_values(path, arrays)
    num_nodes = arrays["x"].shape[0]
    graph = Graph(
        name=path.stem,
        edge_index_2E=symmetrize(arrays["edge_index"].astype(np.int64), num_nodes),
        x_NF=arrays["x"],
        y_N=arrays["y"].astype(np.int64),
        train_mask_N=arrays["train_mask"],
        val_mask_N=arrays["val_mask"],
        test_mask_N=arrays["test_mask"],
        num_classes=num_classes,
    )
    check_graph(graph)
    return graph
