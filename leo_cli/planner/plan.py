"""The cache plan as the run reads it: `cache-plan.json`, its digests and one `load_plan`.

The plan holds, per rank, the cache levels (static aggregate, replicated halo positions, halo
positions read per edge), the chunk count of every layer, the predicted stage times, every
mode's predicted step and each rank's predicted step and busy time; planner/make.py makes it.
Its content is read as untrusted input (`read_plan` validates every field, `check_fits` the
rows and counts against the run); `load_plan` returns it only when it was made for this run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pydantic_core

from leo_cli.comm.rounding import CODECS
from leo_cli.config import LeoConfig
from leo_cli.config.schema import CacheConfig, ModelConfig
from leo_cli.errors import CacheError, LeoError
from leo_cli.graph.storage import read_meta
from leo_cli.graph.types import IntArray
from leo_cli.planner import plan_schema
from leo_cli.planner.reach import Reach, reaches_of
from leo_cli.registry import mode_of, prediction_key
from leo_cli.run_dir import RunDir
from leo_cli.util import files

PLAN = RunDir.PLAN
# 2: the sweep's points say their share and budget fit; plan_s; 3: predicted_run; 4: rows read
# in place chosen per pair (`ranks[r].every_row_from`)
FORMAT_VERSION = 5
OLDER_VERSIONS = (1, 2, 3, 4)


def digest(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def graph_inputs(
    partition_meta: dict[str, Any],
    model: ModelConfig,
    dtype: str,
    num_chunks: str | int,
    reach: Reach | None = None,
    priced: Reach | None = None,
) -> str:
    """Digest of what every mode's prediction depends on: partitions, model, dtype,
    `pipeline.num_chunks`, which rows the plan's mode reads in place (`reach`) and, where
    they differ, which rows the modes that read in place are priced with (`priced`)."""
    fields = {
        "format": FORMAT_VERSION,
        "partitions": partition_meta.get("files", partition_meta),
        "model": model.model_dump(mode="json"),
        "dtype": dtype,
        "num_chunks": num_chunks,
        "reach": _reach_key(reach),
    }
    if priced is not None and _reach_key(priced) != fields["reach"]:
        fields["priced"] = _reach_key(priced)
    return digest(fields)


def _reach_key(reach: Reach | None) -> list[Any] | None:
    """`reach` as a digest reads it."""
    return None if reach is None else [reach.published.tolist(), reach.every().tolist()]


def plan_inputs(
    partition_meta: dict[str, Any],
    model: ModelConfig,
    cache: CacheConfig,
    dtype: str,
    num_chunks: str | int,
    reach: Reach | None = None,
) -> str:
    """Digest of what the cache levels depend on: the graph inputs and the cache settings.

    Workers check it, so a plan made for other partitions or settings is never used.
    """
    return _with_cache(graph_inputs(partition_meta, model, dtype, num_chunks, reach), cache)


def _with_cache(graph: str, cache: CacheConfig) -> str:
    """`plan_inputs` from the graph inputs' digest."""
    return digest({"graph": graph, "cache": cache.model_dump(mode="json", exclude={"hardware"})})


@dataclass(frozen=True)
class RankCache:
    """One rank's cache levels: halo positions replicated (L1) and fetched per edge (L3)."""

    static_aggregate: bool = False
    replica_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    l3_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass
class CachePlan:
    """What `cache-plan.json` holds (see the module docstring)."""

    key: str
    inputs: str
    graph_inputs: str
    policy: str
    caches: list[RankCache]
    num_chunks: list[int]
    predicted: dict[str, float | None]
    stages: dict[str, dict[str, float]]
    bytes_per_level: list[dict[str, int]]
    sweep: list[dict[str, float | bool]]
    replica_budget_mb: float
    plan_s: float | None = None  # seconds it took to make (accesses, policy, plot)
    # Per rank: rows per level (L1 replicas, L2, L3) and how rows of each peer travel.
    levels: list[dict[str, int]] | None = None
    transport: list[list[str | None]] | None = None
    # Per rank, the same-host owners every row of which it reads in place, not only their L3
    # rows (`pipeline.transport=auto` chose it for the pair: the planned mode predicted faster).
    every_row: list[list[int]] = field(default_factory=list)
    ranks_s: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Per mode, each rank's predicted `step_s` and `busy_s` (cost.Prediction.per_rank)."""
    predicted_run: dict[str, float | None] = field(default_factory=dict)
    """Per exact pipeline mode, its predicted step when run with this plan's levels (what it
    can use of them, comm/levels.py levels_for_mode): what `pipeline.mode=auto` chooses from.
    `predicted` prices the modes other than the planned one without a cache, as `leo bench`
    runs them."""
    buffer_bytes: dict[str, int] = field(default_factory=dict)
    """Per exact pipeline mode run as `predicted_run` prices it, the bytes of the buffers
    that move rows, all ranks together (planner/cost.py buffer_bytes): what else
    `pipeline.mode=auto` weighs (`pipeline.auto_margin`)."""
    shm_bytes: dict[str, list[int]] = field(default_factory=dict)
    """Per exact pipeline mode, each rank's bytes of those buffers mapped from /dev/shm: what
    must fit its host's free /dev/shm before workers start (planner/auto_mode.py)."""

    def spread(self) -> dict[str, float]:
        """Per mode, the slowest rank's predicted busy time over the fastest's."""
        out = {}
        for mode, ranks in self.ranks_s.items():
            busy = [r["busy_s"] for r in ranks if "busy_s" in r]
            if busy and min(busy) > 0:
                out[mode] = max(busy) / min(busy)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "key": self.key,
            "inputs": self.inputs,
            "graph_inputs": self.graph_inputs,
            "policy": self.policy,
            "num_chunks": self.num_chunks,
            "predicted_epoch_time_s": self.predicted,
            "predicted_stages_s": self.stages,
            "ranks": [
                {
                    "rank": r,
                    "static_aggregate": c.static_aggregate,
                    "replica_rows": c.replica_rows.tolist(),
                    "l3_rows": c.l3_rows.tolist(),
                    "bytes_per_level": self.bytes_per_level[r],
                    "levels": None if self.levels is None else self.levels[r],
                    "transport": None if self.transport is None else self.transport[r],
                    "every_row_from": self.every_row[r] if self.every_row else [],
                }
                for r, c in enumerate(self.caches)
            ],
            "replica_budget_sweep": self.sweep,
            "replica_budget_mb": self.replica_budget_mb,
            "plan_s": self.plan_s,
            "predicted_ranks_s": self.ranks_s,
            "predicted_rank_spread": self.spread(),
            "predicted_run_s": self.predicted_run,
            "predicted_buffer_bytes": self.buffer_bytes,
            "predicted_shm_bytes": self.shm_bytes,
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> CachePlan:
        """The plan in `data`, validated as untrusted input (planner/plan_schema.py).

        Raises:
            CacheError: naming the file and the first field that is wrong.
        """
        try:
            f = plan_schema.parse(data)
        except ValueError as exc:
            raise invalid(path, str(exc)) from None
        caches = [
            RankCache(
                r.static_aggregate,
                np.asarray(r.replica_rows, dtype=np.int64),
                np.asarray(r.l3_rows, dtype=np.int64),
            )
            for r in f.ranks
        ]
        return cls(
            f.key, f.inputs, f.graph_inputs, f.policy, caches, list(f.num_chunks),
            {k: None if v is None else float(v) for k, v in f.predicted_epoch_time_s.items()},
            {m: {k: float(v) for k, v in st.items()} for m, st in f.predicted_stages_s.items()},
            [r.bytes_per_level.model_dump() for r in f.ranks],
            [p.model_dump() for p in f.replica_budget_sweep],
            float(f.replica_budget_mb), f.plan_s,
            None if any(r.levels is None for r in f.ranks)
            else [r.levels.model_dump() for r in f.ranks if r.levels is not None],
            None if any(r.transport is None for r in f.ranks)
            else [list(r.transport or []) for r in f.ranks],
            [list(r.every_row_from) for r in f.ranks],
            {m: [dict(r) for r in ranks] for m, ranks in f.predicted_ranks_s.items()},
            {k: None if v is None else float(v) for k, v in f.predicted_run_s.items()},
            dict(f.predicted_buffer_bytes),
            {m: list(ranks) for m, ranks in f.predicted_shm_bytes.items()},
        )  # fmt: skip

    def check_fits(
        self,
        path: Path,
        halo_sizes: list[int],
        num_layers: int,
        attention: bool,
        rounded: bool = False,
    ) -> None:
        """Refuse a plan that does not fit the run (see `plan_schema.fit_problem`).

        Raises:
            CacheError: naming the file and the field.
        """
        ranks = [(c.static_aggregate, c.replica_rows, c.l3_rows) for c in self.caches]
        problem = plan_schema.fit_problem(
            ranks, self.num_chunks, halo_sizes, num_layers, attention, rounded
        )
        if problem is not None:
            raise invalid(path, problem)


def invalid(path: Path, problem: str) -> CacheError:
    """The one sentence for a plan that cannot be used."""
    return CacheError(
        f"{path} is not a cache plan LEO can use ({problem}); delete it and run leo "
        "profile-cache (leo train makes a new one itself)."
    )


def plan_bytes(plan: CachePlan) -> bytes:
    """The plan as its file holds it."""
    return files.json_text(plan.to_json()).encode()


def write_plan(run_dir: Path, plan: CachePlan, data: bytes | None = None) -> Path:
    """Write cache-plan.json atomically (a fresh temporary file, then a rename); `data`: the
    plan's `plan_bytes` where the caller has them (a copy is not encoded again).

    Raises:
        CacheError: the run folder cannot hold it (no space, or the name is a folder).
    """
    path = run_dir / PLAN
    try:
        files.write_bytes(path, plan_bytes(plan) if data is None else data)
    except OSError as exc:
        raise CacheError(
            f"cannot write {path} ({exc.strerror or exc}); remove what is there or choose "
            "another run.out_dir."
        ) from None
    return path


def read_plan(run_dir: Path) -> CachePlan | None:
    """The run folder's plan, validated, or None when there is none (or an earlier LEO's).

    Raises:
        CacheError: it is not a regular file, not UTF-8 JSON, or not a valid plan.
    """
    path = run_dir / PLAN
    if not path.exists():
        return None
    if not path.is_file():
        raise CacheError(f"{path} is not a file; remove it and run leo profile-cache.")
    try:
        data = pydantic_core.from_json(path.read_bytes().decode("utf-8"))  # faster than json's
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 JSON"
        raise CacheError(
            f"cannot read {path} ({reason}); delete it and run leo profile-cache."
        ) from None
    if isinstance(data, dict) and data.get("format_version") in OLDER_VERSIONS:
        return None  # made by an earlier LEO: made again, like a missing one
    return CachePlan.from_json(data, path)


DTYPE_BYTES = {"float32": 4, "float64": 8}


def halo_bytes(cfg: LeoConfig) -> tuple[int, int, bool]:
    """Bytes per element and per row of a rounded row (`pipeline.halo_dtype`; (0, 0): rows
    are not rounded), and whether its rounding draws random bytes, for the cost model."""
    codec = CODECS[cfg.pipeline.halo_dtype]
    if codec is None:
        return 0, 0, False
    return codec.element_bytes, codec.row_bytes, codec.stochastic


def dtype_key(cfg: LeoConfig) -> str:
    """The numeric types a plan depends on: the training dtype, and the rows' where
    `pipeline.halo_dtype` rounds them (`float32+rows:bfloat16`)."""
    halo = cfg.pipeline.halo_dtype
    return cfg.train.dtype + (f"+rows:{halo}" if cfg.pipeline.rounds_rows else "")


def static_layer0(cfg: LeoConfig) -> bool:
    """Whether a plan would run layer 0 on the static aggregate (cache level L1s)."""
    c = cfg.cache
    no_input_dropout = cfg.model.effective_input_dropout == 0
    return c.enabled and c.static_aggregate and no_input_dropout and cfg.model.admits_replicas


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is made for, worked out of a config once: the partitions (`meta`, their
    META.json), which rows each rank reads in place (`reach`), which rows a mode that reads
    in place would read so (`priced`: the rows the plan prices such modes with where its own
    mode reads none), and the digests the plan is made for and
    checked against (`inputs`: its levels'; `graph`: every mode's predictions')."""

    meta: dict[str, Any]
    reach: Reach
    inputs: str
    graph: str
    priced: Reach

    @classmethod
    def of(cls, cfg: LeoConfig, meta: dict[str, Any]) -> PlanInputs:
        """For the run of `cfg` on the partitions of `meta` (under `pipeline.mode=auto`, the
        planned mode's, as `reach_of`)."""
        num = int(meta["num_parts"])
        reach, priced = reaches_of(cfg, num)
        chunks = cfg.pipeline.num_chunks
        graph = graph_inputs(meta, cfg.model, dtype_key(cfg), chunks, reach, priced)
        return cls(meta, reach, _with_cache(graph, cfg.cache), graph, priced)


def plan_digests(cfg: LeoConfig, meta: dict[str, Any]) -> tuple[str, str]:
    """The digests a plan is made for and checked against, (inputs, graph inputs): one place,
    so the plan stage, the workers and the summary agree."""
    made_for = PlanInputs.of(cfg, meta)
    return made_for.inputs, made_for.graph


def halo_sizes(meta: dict[str, Any]) -> list[int]:
    """Every part's halo rows, as META.json records them (checked by graph/storage.py)."""
    return [int(n) for n in meta["stats"]["halo_nodes"]]


# `pipeline.levels` that drop part of the plan's levels: the plan prices no run of them.
UNPRICED_LEVELS = ("no-replicas", "no-in-place")


def predicted_time(plan: CachePlan | None, cfg: LeoConfig) -> float | None:
    """The predicted step time of this run's mode from the plan `load_plan` found for it.
    With a cache, the planned mode's is the plan's own prediction and another exact mode's
    the one priced with what it can use of the plan's levels (`predicted_run`); without a
    cache, every mode's (the planned mode under the key of its run without a cache,
    registry.prediction_key); None for levels the plan does not price (`UNPRICED_LEVELS`)."""
    if plan is None or cfg.pipeline.levels in UNPRICED_LEVELS:
        return None
    if _runs_levels_unplanned(cfg):
        return plan.predicted_run.get(cfg.pipeline.mode)
    return plan.predicted.get(prediction_key(cfg.pipeline.mode, cfg.cache.enabled))


def predicted_busy(plan: CachePlan | None, cfg: LeoConfig) -> list[float] | None:
    """Each rank's predicted busy time (its own work, no waiting) in this run's mode, as
    `predicted_time`; None for a mode other than the planned one run with a cache (the plan
    keeps only its step, not its ranks)."""
    if plan is None or _runs_levels_unplanned(cfg) or cfg.pipeline.levels in UNPRICED_LEVELS:
        return None
    ranks = plan.ranks_s.get(prediction_key(cfg.pipeline.mode, cfg.cache.enabled))
    return None if not ranks else [r["busy_s"] for r in ranks]


def _runs_levels_unplanned(cfg: LeoConfig) -> bool:
    """Whether this run uses a cache plan's levels in a mode the plan was not made for."""
    return cfg.cache.enabled and not mode_of(cfg.pipeline.mode).planned


def load_plan(
    cfg: LeoConfig, run_dir: Path, meta: dict[str, Any] | None = None
) -> CachePlan | None:
    """The run folder's plan when it was made for this run, else None (missing, stale, an
    earlier LEO's). With a cache, made for these partitions, levels and prices (`inputs`)
    and as many ranks; without, for the graph and partitions alone (`graph_inputs`: its
    predictions still price every mode). `meta`: the partitions' META.json (read if None).

    Raises:
        CacheError: with a cache, the file is there but is not a valid plan (without one, a
            bad file only means no prediction).
    """
    try:
        plan = read_plan(run_dir)
    except CacheError:
        if cfg.cache.enabled:
            raise
        return None
    if plan is None:
        return None
    if meta is None:
        try:
            meta = read_meta(RunDir(run_dir).partitions)
        except LeoError:
            return None
    num_parts = int(meta["num_parts"])
    inputs, graph_key = plan_digests(cfg, meta)
    if not cfg.cache.enabled:
        return plan if plan.graph_inputs == graph_key else None
    if plan.inputs != inputs or len(plan.caches) != num_parts:
        return None
    check_static(plan, cfg, RunDir(run_dir).plan)
    return plan


def check_static(plan: CachePlan, cfg: LeoConfig, path: Path) -> None:
    """A plan's static aggregate must be the config's (`static_layer0`): a plan edited either
    way would round layer 0 differently or skip its dropout, while its digests still match.

    Raises:
        CacheError: naming the file and the keys that decide it.
    """
    wanted = static_layer0(cfg)
    if any(c.static_aggregate != wanted for c in plan.caches):
        raise CacheError(
            f"{path}: ranks.*.static_aggregate is {not wanted}, but this config runs layer 0 "
            f"{'on' if wanted else 'without'} the static aggregate (cache.static_aggregate, "
            "model.input_dropout, model.name); delete the file to have the plan made again."
        )
