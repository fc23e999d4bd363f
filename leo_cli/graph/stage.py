"""The partition stage: dataset -> parts on disk, reused while its inputs are unchanged."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leo_cli.config.schema import DataConfig, PartitionConfig
from leo_cli.errors import ConfigError, DataError
from leo_cli.graph.datasets import load_dataset, source_files
from leo_cli.graph.layout import ProgressFn, build_parts, partition_stats
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.storage import FORMAT_VERSION, META, read_meta, verify_files, write_partitions


@dataclass
class PartitionResult:
    """Where the partitions are, their META.json, and whether they were reused."""

    path: Path
    meta: dict[str, Any]
    reused: bool


def partition_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "partitions"


def source_key(data: DataConfig, part: PartitionConfig, seed: int) -> str:
    """Fingerprint of everything the partitions depend on, cheap to compute without loading.

    Covers the data and partition config, the seed, the format version and the size and
    modification time of the raw files, so edited inputs make the partitions stale.
    """
    payload = {
        "data": data.model_dump(mode="json"),
        "partition": part.model_dump(mode="json"),
        "seed": seed,
        "format_version": FORMAT_VERSION,
        "files": [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in source_files(data)],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def ensure_partitions(
    data: DataConfig,
    part: PartitionConfig,
    seed: int,
    out_dir: Path,
    force: bool = False,
    progress: ProgressFn | None = None,
    verify: bool = True,
) -> PartitionResult:
    """Reuse `<out_dir>/partitions` when its source key matches, else build.

    `verify=False` skips hashing reused files here, for callers whose readers verify each
    part themselves (training workers do).
    """
    target = partition_dir(out_dir)
    key = source_key(data, part, seed)
    if not force and (target / META).is_file():
        meta = read_meta(target)
        if meta.get("source_key") == key:
            if verify:
                verify_files(target, meta)
            return PartitionResult(target, meta, reused=True)
    meta = build_partitions(data, part, seed, target, key, progress)
    return PartitionResult(target, meta, reused=False)


def build_partitions(
    data: DataConfig,
    part: PartitionConfig,
    seed: int,
    target: Path,
    key: str,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """Load, assign owners, lay out parts and write them; returns META.json's content."""
    t0 = time.perf_counter()
    graph = load_dataset(data, seed)
    if progress is not None:
        progress("load", 1, 1)
    if not graph.train_mask_N.any():
        raise DataError(
            f"{graph.name} has no training nodes (its train mask is empty); "
            "check the dataset's split."
        )
    if part.num_parts > graph.num_nodes:
        raise ConfigError(
            f"partition.num_parts={part.num_parts} exceeds the {graph.num_nodes} nodes of "
            f"{graph.name}; use at most {graph.num_nodes} parts."
        )
    t1 = time.perf_counter()
    parts_N = assign_parts(graph, part.num_parts, part.method, seed)
    if progress is not None:
        progress("partition", 1, 1)
    t2 = time.perf_counter()
    local = build_parts(graph, parts_N, part.num_parts, progress)
    meta: dict[str, Any] = {
        "dataset": {
            "name": graph.name,
            "fingerprint": graph.fingerprint(),
            "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges,
            "num_features": graph.num_features,
            "num_classes": graph.num_classes,
            "num_train": int(graph.train_mask_N.sum()),
        },
        "num_parts": part.num_parts,
        "method": part.method,
        "seed": seed,
        "source_key": key,
        "stats": partition_stats(graph, parts_N, local),
    }
    meta["timings_s"] = {
        "load": round(t1 - t0, 4),
        "partition": round(t2 - t1, 4),
        "layout": round(time.perf_counter() - t2, 4),
    }
    write_partitions(target, local, meta, progress)
    return read_meta(target)
