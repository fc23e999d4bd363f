"""The on-disk partition format (DESIGN.md §3): META.json + `part_<r>/<array>.npy`.

Writes go to a temporary folder renamed into place, so an interrupted run never leaves a
partition that looks complete. Readers check the format version and every file's sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.errors import PartitionError
from leo_cli.graph.layout import LocalPart, ProgressFn

FORMAT_VERSION = 1
META = "META.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed in 4 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_partitions(
    target: Path, parts: list[LocalPart], meta: dict[str, Any], progress: ProgressFn | None = None
) -> None:
    """Write all parts and META.json into `target`, replacing it atomically."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise PartitionError(
            f"Cannot create {tmp.parent} ({exc.strerror}); set run.out_dir to a writable folder."
        ) from None
    try:
        files: dict[str, str] = {}
        for i, part in enumerate(parts):
            files.update(write_part(tmp, part))
            if progress is not None:
                progress("write", i + 1, len(parts))
        meta = {"format_version": FORMAT_VERSION, **meta, "files": files}
        (tmp / META).write_text(json.dumps(meta, indent=2))
        swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_part(root: Path, part: LocalPart) -> dict[str, str]:
    """Write one part's arrays; return relative path -> sha256."""
    folder = root / f"part_{part.rank}"
    folder.mkdir()
    files = {}
    for name, arr in part.arrays().items():
        path = folder / f"{name}.npy"
        np.save(path, np.ascontiguousarray(arr), allow_pickle=False)
        files[f"part_{part.rank}/{name}.npy"] = sha256_file(path)
    return files


def swap_into_place(tmp: Path, target: Path) -> None:
    """Replace `target` by `tmp`; the old folder is removed only after the rename."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def read_meta(root: Path) -> dict[str, Any]:
    """META.json of a partition folder, version-checked."""
    path = root / META
    if not path.is_file():
        raise PartitionError(f"{path} is missing; run `leo partition` (add --force to rebuild).")
    try:
        meta: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise PartitionError(
            f"{path} is not valid JSON; rebuild with `leo partition --force`."
        ) from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise PartitionError(
            f"{path} has format version {meta.get('format_version')!r}, this LEO reads "
            f"{FORMAT_VERSION}; rebuild with `leo partition --force`."
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


def read_part(root: Path, rank: int, verify: bool = True, mmap: bool = False) -> LocalPart:
    """Load part `rank` (checksums verified first unless `verify=False`)."""
    meta = read_meta(root)
    num_parts = int(meta["num_parts"])
    if not 0 <= rank < num_parts:
        raise PartitionError(f"{root} holds {num_parts} parts; there is no part {rank}.")
    if verify:
        verify_files(root, meta, prefix=f"part_{rank}/")
    arrays = {}
    for rel in meta["files"]:
        if rel.startswith(f"part_{rank}/"):
            name = rel.split("/", 1)[1].removesuffix(".npy")
            arrays[name] = np.load(root / rel, mmap_mode="r" if mmap else None, allow_pickle=False)
    return LocalPart(rank=rank, num_parts=num_parts, **arrays)
