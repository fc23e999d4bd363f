"""The on-disk partition format: META.json + `part_<r>/<array>.npy`.

Writes go to a temporary folder renamed into place, so an interrupted run never leaves a
partition that looks complete. Readers check the format version and every file's sha256.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.errors import PartitionError
from leo_cli.graph.layout import LocalPart, ProgressFn
from leo_cli.graph.meta_check import meta_problem
from leo_cli.graph.types import Graph
from leo_cli.util.files import private_dir, sha256_file

FORMAT_VERSION = 1
META = "META.json"


class PartitionWriter:
    """Writes parts one at a time into a temporary folder; `finish` renames it into place.

    Used as a context manager: leaving it without `finish` (an error, an interrupt) removes
    the temporary folder, so a half-written partition never looks complete.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        self.tmp = target  # set by __enter__
        self.files: dict[str, str] = {}

    def __enter__(self) -> PartitionWriter:
        try:
            self.tmp = private_dir(self.target)
        except OSError as exc:
            raise cannot_create(self.tmp.parent, exc) from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.tmp != self.target:
            shutil.rmtree(self.tmp, ignore_errors=True)  # gone already after `finish`

    def write(self, rank: int, arrays: dict[str, np.ndarray]) -> None:
        """Write arrays of part `rank` as `part_<rank>/<name>.npy` (more may follow)."""
        folder = self.tmp / f"part_{rank}"
        folder.mkdir(exist_ok=True)
        for name, arr in arrays.items():
            path = folder / f"{name}.npy"
            save_array(path, np.ascontiguousarray(arr))
            self.files[f"part_{rank}/{name}.npy"] = sha256_file(path)

    def finish(self, meta: dict[str, Any]) -> None:
        """Write META.json (files listed part by part, in `LocalPart` field order) and swap
        the folder into place."""
        order = {name: i for i, name in enumerate(LocalPart.__dataclass_fields__)}

        def position(rel: str) -> tuple[int, int]:
            folder, name = rel.split("/", 1)
            return int(folder.removeprefix("part_")), order.get(name.removesuffix(".npy"), -1)

        files = {rel: self.files[rel] for rel in sorted(self.files, key=position)}
        meta = {"format_version": FORMAT_VERSION, **meta, "files": files}
        (self.tmp / META).write_text(json.dumps(meta, indent=2, allow_nan=False))
        swap_into_place(self.tmp, self.target)


def write_partitions(
    target: Path, parts: list[LocalPart], meta: dict[str, Any], progress: ProgressFn | None = None
) -> None:
    """Write all parts and META.json into `target`, replacing it atomically."""
    with PartitionWriter(target) as writer:
        for i, part in enumerate(parts):
            writer.write(part.rank, part.arrays())
            if progress is not None:
                progress("write", i + 1, len(parts))
        writer.finish(meta)


def cannot_create(folder: Path, exc: OSError) -> PartitionError:
    """The error for a folder of the partition stage that cannot be made."""
    return PartitionError(
        f"Cannot create {folder} ({exc.strerror}); set run.cache_dir (or run.out_dir) to a "
        "writable folder."
    )


def save_array(path: Path, arr: np.ndarray) -> None:
    """`np.save` whose failure (a full disk, no permission) is one sentence naming the file."""
    try:
        np.save(path, arr, allow_pickle=False)
    except OSError as exc:
        raise PartitionError(
            f"Cannot write {path} ({exc.strerror or exc}); free space there or set "
            "run.cache_dir (or run.out_dir) to another folder (while it runs, the partition "
            "stage keeps a copy of the graph beside the partitions)."
        ) from None


def swap_into_place(tmp: Path, target: Path) -> None:
    """Replace `target` by `tmp`; the old folder is removed only after the rename. A link
    there (a run folder's `partitions` pointing into the cache, live or dangling) is replaced
    itself: what it points to stays as it is."""
    if target.is_symlink():
        target.unlink()
    old = private_dir(target)  # an empty folder of ours, which the rename replaces
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def spill_graph(graph: Graph, folder: Path) -> Graph:
    """The same graph with its arrays written to `folder` and mapped back read-only.

    While nothing reads them, mapped arrays take no resident memory, so a stage that needs
    the graph only later (the layout, after METIS) does not hold it through METIS's peak.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_create(folder.parent, exc) from None
    arrays = {}
    for f in dataclasses.fields(graph):
        value = getattr(graph, f.name)
        if isinstance(value, np.ndarray):
            save_array(folder / f"{f.name}.npy", value)
            arrays[f.name] = np.load(folder / f"{f.name}.npy", mmap_mode="r")
    return dataclasses.replace(graph, **arrays)


def read_meta(root: Path, stage: bool = True) -> dict[str, Any]:
    """META.json of a partition folder, checked as untrusted input (graph/meta_check.py):
    every field the stages read, or (`stage=False`) the part count and file list only."""
    path = root / META
    if root.is_symlink() and not root.exists():
        raise PartitionError(
            f"{root} links to {os.readlink(root)}, which is gone (a cleared run.cache_dir?); "
            "`leo train` rebuilds it (with --resume for a trained run)."
        )
    if not path.is_file():
        raise PartitionError(f"{path} is missing; run `leo partition` (add --force to rebuild).")
    try:
        meta: dict[str, Any] = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise PartitionError(
            f"{path} is not valid JSON; rebuild with `leo partition --force`."
        ) from None
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise PartitionError(
            f"{path} has format version {version!r}, this LEO reads "
            f"{FORMAT_VERSION}; rebuild with `leo partition --force`."
        )
    problem = meta_problem(meta, stage)  # untrusted: checked before any field is used
    if problem is not None:
        raise PartitionError(
            f"{path} is not what LEO wrote ({problem}); rebuild with `leo partition --force`."
        )
    return meta


def verify_files(root: Path, meta: dict[str, Any], prefix: str = "") -> None:
    """Check the sha256 of every file (or those under `prefix`) against META.json."""
    for rel, digest in meta["files"].items():
        if not rel.startswith(prefix):
            continue
        path = root / rel
        if not path.is_file():
            raise PartitionError(
                f"Partition file {path} is missing; rebuild with `leo partition --force`."
            )
        if sha256_file(path) != digest:
            raise PartitionError(
                f"Partition file {path} does not match its checksum in {root / META}; "
                "it was modified or truncated; rebuild with `leo partition --force`."
            )


# np.load parses a file's header with ast.literal_eval, which CPython 3.11 can fail with a
# SystemError when two threads parse at once (python/cpython#106905; the planner reads parts
# in threads): one load at a time (a mapped load reads the header only).
_LOADING = threading.Lock()


def _load(path: Path, mmap: bool) -> np.ndarray:
    """One part file; unreadable (truncated, say, when its checksum was left to the workers:
    `read_part(verify=False)`) is one sentence, as a checksum mismatch is."""
    try:
        with _LOADING:
            array: np.ndarray = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise PartitionError(
            f"Partition file {path} cannot be read ({exc}); it was modified or truncated; "
            "rebuild with `leo partition --force`."
        ) from None
    return array


def read_part(root: Path, rank: int, verify: bool = True, mmap: bool = False) -> LocalPart:
    """Load part `rank` (checksums verified first unless `verify=False`); `mmap` maps the
    files instead of reading them into memory."""
    meta = read_meta(root, stage=False)
    num_parts = int(meta["num_parts"])
    if not 0 <= rank < num_parts:
        raise PartitionError(f"{root} holds {num_parts} parts; there is no part {rank}.")
    if verify:
        verify_files(root, meta, prefix=f"part_{rank}/")
    arrays = {}
    for rel in meta["files"]:
        if rel.startswith(f"part_{rank}/"):
            name = rel.split("/", 1)[1].removesuffix(".npy")
            # Copy-on-write maps: pages come from the file (shared, reclaimable) and the arrays
            # stay writable, so torch.from_numpy takes them without a copy or a warning.
            arrays[name] = _load(root / rel, mmap)
    return LocalPart(rank=rank, num_parts=num_parts, **arrays)
