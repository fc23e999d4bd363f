"""cache-plan.json as untrusted input: every field checked before a worker builds on it.

Workers build their exchange from the plan, so an edited, truncated or foreign plan must be
refused wherever it would break exactness or safety. The file is validated, not digested:
schema and types, intrinsic bounds (chunk counts 1..`MAX_CHUNKS`, rows, one entry per rank, the
static aggregate on every rank or none) and its fit to the run (`check_fits`). Workers check
every rank's entries after comparing the plan's bytes across ranks (worker/agree.py).

Specification: docs/design/planning.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from leo_cli.config.schema import MAX_CHUNKS
from leo_cli.util.strict import Finite, NonNegative

MAX_ROW = 2**62  # far beyond any halo; keeps every row an int64
Row = Annotated[StrictInt, Field(ge=0, le=MAX_ROW)]
Count = Annotated[StrictInt, Field(ge=0)]
Chunks = Annotated[StrictInt, Field(ge=1, le=MAX_CHUNKS)]
Digest = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
STAGES_READ = ("forward_s", "backward_s", "comm_wait_s")  # what `leo profile-cache` shows


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LevelBytes(_Strict):
    """Bytes a rank holds at L1 and receives per step at L2 / L3."""

    L1_replica_bytes: Count
    L1s_static_bytes: Count
    L2_bytes_per_step: Count
    L3_bytes_per_step: Count
    published_bytes_per_step: Count = 0


class LevelRows(_Strict):
    """Halo rows a rank holds at each level."""

    L1: Count
    L2: Count
    L3: Count
    in_place: Count = 0


PairTransport = Literal["process-group", "published-rows", "mixed"]


class RankEntry(_Strict):
    """One rank's cache levels."""

    rank: Count
    static_aggregate: StrictBool
    replica_rows: list[Row]
    l3_rows: list[Row]
    bytes_per_level: LevelBytes
    levels: LevelRows | None = None
    transport: list[PairTransport | None] | None = None
    every_row_from: list[Count] = []
    """Owners every row of which this rank reads in place (`pipeline.transport=auto` chose it
    for the pair), not only their L3 rows."""


class SweepPoint(_Strict):
    """One point of cache-plan.png: every rank replicating this share of its halo."""

    replica_share: Annotated[NonNegative, Field(le=1)]
    replica_budget_mb: NonNegative
    predicted_epoch_time_s: Finite
    within_budget: StrictBool


class PlanFile(_Strict):
    """The layout of cache-plan.json (format version 5)."""

    format_version: Literal[5]
    key: Digest
    inputs: Digest
    graph_inputs: Digest
    policy: Literal["none", "degree", "leo"]
    num_chunks: Annotated[list[Chunks], Field(min_length=1)]
    predicted_epoch_time_s: dict[str, Finite | None]
    predicted_stages_s: dict[str, dict[str, Finite]]
    ranks: Annotated[list[RankEntry], Field(min_length=1)]
    replica_budget_sweep: list[SweepPoint]
    replica_budget_mb: NonNegative
    plan_s: NonNegative | None = None
    predicted_ranks_s: dict[str, list[dict[str, Finite]]] = {}
    """Per mode, each rank's predicted `step_s` and `busy_s` (shown, not used)."""
    predicted_rank_spread: dict[str, Finite] = {}
    """Per mode, the slowest rank's busy time over the fastest's (shown, not used)."""
    predicted_run_s: dict[str, Finite | None] = {}
    """Per exact pipeline mode, its predicted step run with this plan's levels (what
    `pipeline.mode=auto` chooses from)."""
    predicted_buffer_bytes: dict[str, Count] = {}
    """Per exact pipeline mode, the bytes it holds at its peak beyond what every mode holds
    (planner/cost.py `mode_buffers`: segments, blocks, set-up's transpose, moving rows), all
    ranks together (what `pipeline.mode=auto` also weighs: `pipeline.auto_margin`)."""
    predicted_shm_bytes: dict[str, list[Count]] = {}
    """Per exact pipeline mode, each rank's bytes of them in /dev/shm (checked against the
    host's free /dev/shm before workers start)."""

    @model_validator(mode="after")
    def _consistent(self) -> PlanFile:
        for i, entry in enumerate(self.ranks):
            if entry.rank != i:
                raise ValueError(f"ranks.{i}.rank is {entry.rank}; entries must be in rank order")
            for name in ("replica_rows", "l3_rows", "every_row_from"):
                repeated = first_repeat(getattr(entry, name))
                if repeated is not None:
                    noun = "owner" if name == "every_row_from" else "row"
                    raise ValueError(f"ranks.{i}.{name} lists {noun} {repeated} twice")
            strangers = [q for q in entry.every_row_from if q == i or q >= len(self.ranks)]
            if strangers:
                raise ValueError(
                    f"ranks.{i}.every_row_from lists {strangers[0]}, not a peer of rank {i}"
                )
        static = {e.static_aggregate for e in self.ranks}
        if len(static) > 1:
            on = [e.rank for e in self.ranks if e.static_aggregate]
            raise ValueError(
                f"ranks.*.static_aggregate is true for ranks {on} only; it must be the same on "
                "every rank (layer 0 exchanges rows on all of them or on none)"
            )
        for mode, t in self.predicted_epoch_time_s.items():
            stages = self.predicted_stages_s.get(mode)
            if t is not None and (stages is None or any(k not in stages for k in STAGES_READ)):
                raise ValueError(f"predicted_stages_s.{mode} must hold {', '.join(STAGES_READ)}")
        return self


def first_repeat(rows: list[int]) -> int | None:
    """A row listed more than once, or None."""
    if len(rows) < 2:
        return None
    values = np.sort(np.asarray(rows, dtype=np.int64))
    same = np.flatnonzero(values[1:] == values[:-1])
    return int(values[same[0]]) if same.size else None


def parse(data: Any) -> PlanFile:
    """The validated file content.

    Raises:
        ValueError: one phrase naming the field and what is wrong with it.
    """
    try:
        return PlanFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "top level"
        value = err.get("input")
        shown = f", got {value!r}" if isinstance(value, str | int | float | bool) else ""
        message = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: {message}{shown}" if err["loc"] else message) from None


def fit_problem(
    ranks: list[tuple[bool, np.ndarray, np.ndarray]],
    num_chunks: list[int],
    halo_sizes: list[int],
    num_layers: int,
    attention: bool,
    rounded: bool = False,
) -> str | None:
    """What makes a parsed plan unfit for this run, or None.

    Args:
        ranks: per rank (static aggregate, replica rows, L3 rows).
        num_chunks: the plan's chunk count per layer.
        halo_sizes: the halo rows of every rank (from the partitions).
        num_layers: layers of the model trained.
        attention: the model is an attention model (gat).
        rounded: rows are rounded to a narrower type (`pipeline.halo_dtype`).
    """
    if len(ranks) != len(halo_sizes):
        return f"ranks: {len(ranks)} entries for {len(halo_sizes)} workers"
    if len(num_chunks) != num_layers:
        return f"num_chunks: {len(num_chunks)} counts for a model of {num_layers} layers"
    for r, ((static, replicas, l3), num_halo) in enumerate(zip(ranks, halo_sizes, strict=True)):
        for name, rows in (("replica_rows", replicas), ("l3_rows", l3)):
            outside = np.flatnonzero(rows >= num_halo)
            if outside.size:
                i = int(outside[0])
                return (
                    f"ranks.{r}.{name}.{i}: row {int(rows[i])} is not among rank {r}'s "
                    f"{num_halo} halo rows"
                )
        if attention and (static or replicas.size):
            return f"ranks.{r}: attention models use neither replicas nor a static aggregate"
        if rounded and replicas.size:
            return f"ranks.{r}: rows rounded to pipeline.halo_dtype use no replicas"
    return None
