"""The partition stage: dataset -> parts on disk, reused while its inputs are unchanged.

Each part's target share of the work comes from `partition.part_weights` (equal, given, or
`measured` by a `Weigher` the caller hands in). Equal parts weigh a node 1 + in-degree (the
`degree` rule), unequal ones by the cost model's price of it (the `cost` rule). The source key
covers the weights, the rule and an owners file's content, so parts made for others are
rebuilt; META.json records the target shares, the rule and the shares achieved.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.config.schema import METIS_OPTIONS, PART_OPTIONS, DataConfig, PartitionConfig
from leo_cli.errors import ConfigError, DataError, PartitionError
from leo_cli.graph.datasets import load_dataset, source_files
from leo_cli.graph.layout import (
    ProgressFn,
    iter_parts,
    partition_stats,
    send_lists,
    summarize,
)
from leo_cli.graph.partitioners import (
    DEGREE,
    SAMPLING,
    GraphSize,
    MetisInput,
    WorkMeasure,
    assign_parts,
    metis_edge_fraction,
    metis_input,
    normalised,
    owners_from_file,
    projected_metis_gb,
)
from leo_cli.graph.storage import (
    FORMAT_VERSION,
    META,
    PartitionWriter,
    cannot_create,
    read_meta,
    spill_graph,
    verify_files,
)
from leo_cli.graph.types import Graph, IntArray
from leo_cli.run_dir import RunDir
from leo_cli.util.files import private_dir, sha256_file, stored_sha256, sweep_temporaries
from leo_cli.util.rss import peak_rss_bytes


@dataclass
class PartitionResult:
    """Where the partitions are, their META.json, and whether they were reused."""

    path: Path
    meta: dict[str, Any]
    reused: bool


# The `cost` rule's name in the source key: parts made under another pricing are rebuilt.
COST_RULE = "cost: busy seconds per node and per in-edge, halo-less part, mean rank's rates"


@dataclass(frozen=True)
class Weigher:
    """Unequal part weights (`partition.part_weights=measured` or a list) as numbers.

    Attributes:
        key: what the numbers are computed from (the hardware profile and the model), part of
            the partitions' source key: a new probe or another model rebuilds the parts.
        weigh: the weight of every part, from the loaded graph (its size and widths); needed
            for `measured`, unused for a list.
        work: what every node weighs (the `cost` rule), from the loaded graph; None: the
            `degree` rule.
    """

    key: str
    weigh: Callable[[Graph], list[float]] | None = None
    work: Callable[[Graph], WorkMeasure] | None = None


def weighted(part: PartitionConfig) -> bool:
    """Whether the parts get unequal target shares (measured or listed) that need the hardware
    profile: the shares, and so the vertex weights, are then shares of time. `random` draws
    owners by share whatever a node weighs, so its listed shares need no profile."""
    unequal = part.part_weights != "uniform" and part.num_parts > 1 and part.method != "file"
    return unequal and (part.method != "random" or part.part_weights == "measured")


def source_key(
    data: DataConfig,
    part: PartitionConfig,
    seed: int,
    weigher: Weigher | None = None,
    digests: Path | None = None,
) -> str:
    """Fingerprint of everything the partitions depend on, cheap to compute without loading.

    Covers the data and partition config, the seed, the format version and the content of the
    raw files (sha256, kept in `digests` and hashed again only when a file's size, times or
    inode change), so an edit that keeps a file's size and mtime makes the partitions stale
    too; for measured weights what they come from (`weigher.key`); for unequal weights priced
    by the cost model, the rule and what its prices come from; for an owners file its content.
    """
    payload = {
        # normalize_features at `auto` keeps the key partitions had before it existed.
        "data": data.model_dump(
            mode="json",
            exclude={"normalize_features"} if data.normalize_features == "auto" else None,
        ),
        # Options at their defaults keep the key partitions had before the options existed
        # (on every graph whose METIS fits the memory limit, their parts are the same).
        "partition": part.model_dump(mode="json", exclude=defaulted_options(part)),
        "seed": seed,
        "format_version": FORMAT_VERSION,
        "files": source_digests(data, digests),
    }
    if part.part_weights == "measured" and weighted(part):
        assert weigher is not None, "part_weights=measured needs a weigher"
        payload["measured"] = weigher.key
    if weighted(part) and weigher is not None and weigher.work is not None:
        payload["vertex_weights"] = [COST_RULE, weigher.key]
    if part.owners_path is not None:
        payload["owners"] = owners_digest(part.owners_path)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def source_digests(data: DataConfig, store: Path | None) -> list[tuple[str, str]]:
    """(path, sha256) of each raw file the dataset reads (`store`: where digests are kept)."""
    paths = source_files(data)
    try:
        if store is None:
            return [(str(p), sha256_file(p)) for p in paths]
        return list(zip(map(str, paths), stored_sha256(paths, store), strict=True))
    except OSError as exc:
        raise DataError(
            f"cannot read {exc.filename} ({exc.strerror}); check data.name and data.root."
        ) from None


def owners_digest(path: Path) -> str:
    """sha256 of an owners file, or a marker when it cannot be read (building says why)."""
    try:
        return sha256_file(path)
    except OSError:
        return "unreadable"


def defaulted_options(part: PartitionConfig) -> set[str]:
    """The METIS options and part options of `part` left at their defaults."""
    keys = (*METIS_OPTIONS, *PART_OPTIONS)
    return {k for k in keys if getattr(part, k) == PartitionConfig.model_fields[k].default}


def target_shares(
    part: PartitionConfig, graph: Graph, weigher: Weigher | None
) -> list[float] | None:
    """Each part's target share of the work (summing to 1), or None for equal parts."""
    weights = part.part_weights
    if weights == "uniform" or part.num_parts == 1:
        return None
    if weights == "measured":
        assert weigher is not None and weigher.weigh is not None, "measured needs a weigher"
        weights = weigher.weigh(graph)
    return normalised(list(weights))


def work_measure(part: PartitionConfig, graph: Graph, weigher: Weigher | None) -> WorkMeasure:
    """What a node weighs for these parts: the weigher's `cost` rule for unequal shares,
    else the `degree` rule (uniform parts stay the parts of before)."""
    if weighted(part) and weigher is not None and weigher.work is not None:
        return weigher.work(graph)
    return DEGREE


def achieved_shares(stats: dict[str, Any], work: WorkMeasure = DEGREE) -> list[float]:
    """Each part's share of the work measure (default 1 + in-degree): from its nodes and
    in-edges."""
    return work.shares(stats["nodes"], stats["edges"])


def node_shares(stats: dict[str, Any]) -> list[float]:
    """Each part's share of the nodes."""
    total = max(sum(stats["nodes"]), 1)
    return [round(n / total, 6) for n in stats["nodes"]]


def ensure_partitions(
    data: DataConfig,
    part: PartitionConfig,
    seed: int,
    out_dir: Path,
    force: bool = False,
    progress: ProgressFn | None = None,
    verify: bool = True,
    weigher: Weigher | None = None,
    cache_dir: Path | None = None,
) -> PartitionResult:
    """The partitions `<out_dir>/partitions` names, reused when their source key matches,
    else built.

    With `cache_dir` they are kept there, one folder per source key shared by every run, and
    `<out_dir>/partitions` is a link to it (a run folder that already holds partitions of its
    own keeps them there). `verify=False` skips hashing reused files here, for callers whose
    readers verify each part themselves (training workers do). `weigher`: how
    `partition.part_weights=measured` becomes numbers (needed then, unused otherwise).
    """
    # The source's key first (the datasets' files, then their digests), then the folders.
    store = (Path(cache_dir) / "partitions" if cache_dir is not None else Path(out_dir)) / (
        RunDir.SOURCE_DIGESTS
    )
    key = source_key(data, part, seed, weigher, store)
    link = Path(out_dir) / RunDir.PARTITIONS
    sweep_temporaries(Path(out_dir))  # files and folders of writers killed mid-write
    own = link.is_dir() and not link.is_symlink()
    target = link if cache_dir is None or own else cache_entry(cache_dir, data, part, key)
    shared = target != link  # a second run wanting the same entry waits, then reuses it
    with entry_lock(target) if shared else contextlib.nullcontext():
        sweep_temporaries(target.parent)
        if not force and (target / META).is_file():
            meta = read_meta(target)
            if meta.get("source_key") == key and metis_plan_holds(meta, part):
                if verify:
                    verify_files(target, meta)
                point(link, target)
                return PartitionResult(link, meta, reused=True)
        meta = build_partitions(data, part, seed, target, key, progress, weigher)
        point(link, target)
        return PartitionResult(link, meta, reused=False)


@contextlib.contextmanager
def entry_lock(target: Path) -> Iterator[None]:
    """Hold `<target>.lock` (an advisory lock beside the partitions' folder) while checking and
    building them, so two runs do not build the same folder at once."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle = open(target.with_name(target.name + ".lock"), "a")  # noqa: SIM115
    except OSError as exc:
        raise cannot_create(target.parent, exc) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cache_entry(cache_dir: Path, data: DataConfig, part: PartitionConfig, key: str) -> Path:
    """The shared folder of the partitions with source key `key`:
    `<cache_dir>/partitions/<dataset>-p<parts>-<key>`."""
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", Path(data.name).stem).strip("-.") or "graph"
    return Path(cache_dir) / "partitions" / f"{name}-p{part.num_parts}-{key[:16]}"


def point(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target` (replaced atomically); nothing where they
    are the same folder."""
    if link == target:
        return
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath(Path(target).resolve(), link.parent.resolve())
        if link.is_symlink() and os.readlink(link) == relative:
            return
        temporary = link.with_name(f".{link.name}.{os.getpid()}.link")
        temporary.unlink(missing_ok=True)
        os.symlink(relative, temporary)
        os.replace(temporary, link)
    except OSError as exc:
        raise PartitionError(
            f"Cannot link {link} to the partitions in {target} ({exc.strerror}); set "
            "run.out_dir to a writable folder."
        ) from None


def build_partitions(
    data: DataConfig,
    part: PartitionConfig,
    seed: int,
    target: Path,
    key: str,
    progress: ProgressFn | None,
    weigher: Weigher | None = None,
) -> dict[str, Any]:
    """Load, assign owners, lay out and write parts one by one; returns META.json's content.

    METIS's working set is the stage's peak, so its input is built first and the graph is
    moved to memory-mapped files while METIS runs; each part is then written as soon as it is
    built and dropped. META.json records the time and peak resident memory of every stage.
    """
    report = progress or (lambda stage, done, total: None)
    clock = StageClock()
    report("load", 0, 1)
    graph = load_dataset(data, seed, progress)
    check_partitionable(graph, part.num_parts)
    meta: dict[str, Any] = {
        "dataset": dataset_meta(graph),
        "num_parts": part.num_parts,
        "method": part.method,
        "seed": seed,
        "source_key": key,
    }
    shares = target_shares(part, graph, weigher)
    meta["part_weights"] = shares  # null: equal parts
    work = work_measure(part, graph, weigher)
    meta["vertex_weights"] = work.meta()
    if part.owners_path is not None:
        meta["owners_sha256"] = owners_digest(part.owners_path)
    clock.lap("load")
    report("load", 1, 1)
    report("partition", 0, 1)
    prepared = None
    if part.method == "metis" and part.num_parts > 1:
        meta["metis"] = metis_plan(GraphSize.of(graph), part, graph.name)
        prepared = metis_input(graph, meta["metis"]["edge_fraction"], seed, work)
    scratch = None
    try:
        if prepared is not None:  # METIS's working set is the peak: hold nothing else
            scratch = scratch_dir(target)
            graph = spill_graph(graph, scratch)
        parts_N = owners(graph, part, seed, prepared, shares, work)
        del prepared
        clock.lap("partition")
        report("partition", 1, 1)
        layout_and_write(graph, parts_N, part.num_parts, target, progress, clock, meta, work)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return read_meta(target)


def owners(
    graph: Graph,
    part: PartitionConfig,
    seed: int,
    prepared: MetisInput | None,
    shares: list[float] | None,
    work: WorkMeasure,
) -> IntArray:
    """The owner of every node: read from the owners file, or assigned by the method."""
    if part.method == "file":
        assert part.owners_path is not None, "checked by the config"
        return owners_from_file(part.owners_path, graph.num_nodes, part.num_parts)
    measure = None if work.rule == "degree" else work  # `range` keeps its node counts
    parts_N = assign_parts(graph, part.num_parts, part.method, seed, prepared, shares, measure)
    empty = np.flatnonzero(np.bincount(parts_N, minlength=part.num_parts) == 0)
    if empty.size:
        raise PartitionError(
            f"partition.method={part.method} left part {int(empty[0])} without a node "
            f"({graph.num_nodes} nodes in partition.num_parts={part.num_parts} parts); lower "
            "partition.num_parts."
        )
    return parts_N


def scratch_dir(target: Path) -> Path:
    """A private folder beside the partitions for the spilled graph (a unique name: never a
    folder or symlink planted under a predictable one)."""
    try:
        return private_dir(target.with_name(f"{target.name}.graph"))
    except OSError as exc:
        raise cannot_create(target.parent, exc) from None


def layout_and_write(
    graph: Graph,
    parts_N: IntArray,
    num_parts: int,
    target: Path,
    progress: ProgressFn | None,
    clock: StageClock,
    meta: dict[str, Any],
    work: WorkMeasure = DEGREE,
) -> None:
    """Build each part, write it and drop it; then the send lists, stats and META.json (with
    the shares achieved in `work`'s measure and in nodes)."""
    with PartitionWriter(target) as writer:
        summaries = []
        if progress is not None:
            progress("layout", 0, num_parts)
        for local in iter_parts(graph, parts_N, num_parts, progress):
            writer.write(local.rank, local.arrays())
            summaries.append(summarize(local))
            del local
        for rank, (send_idx, send_counts) in enumerate(send_lists(summaries)):
            writer.write(rank, {"send_idx": send_idx, "send_counts": send_counts})
        clock.lap("layout")
        ds = meta["dataset"]
        meta["stats"] = partition_stats(ds["num_nodes"], ds["num_edges"], summaries)
        meta["achieved_shares"] = achieved_shares(meta["stats"], work)
        meta["achieved_node_shares"] = node_shares(meta["stats"])
        meta["timings_s"] = clock.seconds
        meta["peak_rss_gb"] = clock.peak_gb
        writer.finish(meta)


def metis_plan(size: GraphSize, part: PartitionConfig, name: str) -> dict[str, Any]:
    """The share of edges METIS sees (metis_edge_fraction, lowered to fit metis_memory_gb) and
    the projected peaks behind that choice, for META.json and the summary table."""
    fraction = metis_edge_fraction(size, part.metis_edge_fraction, part.metis_memory_gb, name)
    return {
        "edge_fraction": fraction,
        "requested_edge_fraction": part.metis_edge_fraction,
        "memory_limit_gb": part.metis_memory_gb,
        "projected_gb": projected_metis_gb(size, fraction),
        "exact_projected_gb": projected_metis_gb(size, 1.0),
        "feature_bytes": size.feature_bytes,
        "sampling": SAMPLING if fraction < 1 else None,
    }


def metis_plan_holds(meta: dict[str, Any], part: PartitionConfig) -> bool:
    """Whether partitions on disk saw the share of edges METIS would see if built now.

    The source key cannot say (the share depends on the graph's size, known after loading,
    and on the memory model of this version): partitions built before the limit existed, or
    under another model or sampling scheme, are rebuilt rather than reused as if they were
    what this config makes.
    """
    if part.method != "metis" or part.num_parts == 1:
        return True
    ds = meta["dataset"]
    plan = meta.get("metis", {})
    features = plan.get("feature_bytes", 4 * ds["num_nodes"] * ds["num_features"])
    size = GraphSize(ds["num_nodes"], ds["num_edges"], features)
    built = plan.get("edge_fraction", part.metis_edge_fraction)
    wanted = metis_edge_fraction(size, part.metis_edge_fraction, part.metis_memory_gb, ds["name"])
    sampling = plan.get("sampling") if built < 1 else None
    return bool(built == wanted) and sampling == (SAMPLING if wanted < 1 else None)


def metis_note(meta: dict[str, Any]) -> str | None:
    """One sentence when the memory limit made METIS see fewer edges than asked, else None."""
    plan = meta.get("metis")
    if not plan or plan["edge_fraction"] >= plan["requested_edge_fraction"]:
        return None
    asked = plan["requested_edge_fraction"]
    what = "exact METIS" if asked == 1 else f"METIS on {asked:.0%} of the edges as asked"
    return (
        f"METIS saw {plan['edge_fraction']:.0%} of the edges to stay under "
        f"partition.metis_memory_gb={plan['memory_limit_gb']:g} (exact METIS is projected at "
        f"{plan['exact_projected_gb']:.3g} GB), so the edge cut is slightly higher; set "
        f"partition.metis_memory_gb=null (or a larger limit) for {what}."
    )


def check_partitionable(graph: Graph, num_parts: int) -> None:
    """User errors: no training nodes, or more parts than nodes."""
    if not graph.train_mask_N.any():
        raise DataError(
            f"{graph.name} has no training nodes (its train mask is empty); "
            "check the dataset's split."
        )
    if num_parts > graph.num_nodes:
        raise ConfigError(
            f"partition.num_parts={num_parts} exceeds the {graph.num_nodes} nodes of "
            f"{graph.name}; use at most {graph.num_nodes} parts."
        )


def dataset_meta(graph: Graph) -> dict[str, Any]:
    return {
        "name": graph.name,
        "fingerprint": graph.fingerprint(),
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_features": graph.num_features,
        "num_classes": graph.num_classes,
        "num_train": int(graph.train_mask_N.sum()),
    }


class StageClock:
    """Seconds of each stage and the process's peak resident memory at its end (GB = 1e9 B).

    The peak is `ru_maxrss`, the highest resident set since the process started: at the end
    of a stage it is the peak so far, so the stage that raised it is the first to show it.
    """

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peak_gb: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.last, 4)
        self.last = now
        self.peak_gb[stage] = round(peak_rss_bytes() / 1e9, 3)
