"""The cache plan: `cache-plan.json` in the run folder, made once, read by every worker.

It holds, per rank, the cache levels (static aggregate, replicated halo positions, halo
positions fetched per edge), the chunk count of every layer (the same on every rank, since
both ends of a transfer must cut it the same way), the predicted stage times, the predicted
step time of every mode, and each rank's predicted step and busy time with their spread
(slowest busy over fastest), so `leo train` can put prediction beside measurement. The
policy's sweep over replicated shares (predicted step against replica bytes) feeds
`cache-plan.png`.

The plan is stale when the partitions, the model's widths or dropout, the policy, the
budgets or the hardware profile change (its `key` covers all of them). Its content is read
as untrusted input: `read_plan` validates every field, `check_fits` the rows and counts
against the run (cache/plan_check.py says why validation rather than a digest).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.cache import plan_check
from leo_cli.cache.access import PartAccess
from leo_cli.cache.cost import ModelShape, Prediction, RankCache, Reach, predict
from leo_cli.cache.hardware import HardwareProfile
from leo_cli.cache.policy import PLANNED, Budgets, Decision, decide
from leo_cli.comm.modes import auto_chunk_count
from leo_cli.config.schema import CacheConfig, ModelConfig
from leo_cli.errors import CacheError
from leo_cli.registry import MODES, Mode, auto_candidates, conv_of, mode_of
from leo_cli.util import files

PLAN = "cache-plan.json"
# 2: the sweep's points say their share and budget fit; plan_s; 3: predicted_run; 4: rows read
# in place chosen per pair (`ranks[r].every_row_from`)
FORMAT_VERSION = 4
OLDER_VERSIONS = (1, 2, 3)


def model_shape(
    model: ModelConfig,
    num_features: int,
    num_classes: int,
    dtype_bytes: int,
    halo: tuple[int, int, bool] = (0, 0, False),
) -> ModelShape:
    """The model as the cost model sees it; `halo`: bytes per element and per row of rows
    rounded to a narrower type (`pipeline.halo_dtype`), (0, 0) where they are not, and
    whether the rounding draws random bytes."""
    widths = tuple(model.layer_widths(num_features, num_classes))
    return ModelShape(
        widths, model.dropout, model.effective_input_dropout, dtype_bytes,
        conv_of(model.name).extra_gemm, attention=model.attention,
        rows=tuple(model.row_widths(num_classes)), halo_bytes=halo[0], halo_row_bytes=halo[1],
        halo_stochastic=halo[2],
    )  # fmt: skip


def budget_bytes(value: float | str, own_bytes: int) -> int:
    """A budget in MiB, or a percentage of the part's own feature bytes ("25%")."""
    if isinstance(value, str):
        return int(float(value.rstrip("%")) / 100.0 * own_bytes)
    return int(value * 2**20)


def budgets(cache: CacheConfig, accesses: list[PartAccess], shape: ModelShape) -> Budgets:
    own = [p.num_inner * shape.widths[0] * shape.dtype_bytes for p in accesses]
    return Budgets(
        [budget_bytes(cache.replica_budget_mb, o) for o in own],
        [budget_bytes(cache.halo_budget_mb, o) for o in own],
    )


def _digest(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def graph_inputs(
    partition_meta: dict[str, Any],
    model: ModelConfig,
    dtype: str,
    num_chunks: str | int,
    reach: Reach | None = None,
) -> str:
    """Digest of what every mode's prediction depends on: partitions, model, dtype,
    `pipeline.num_chunks` and which rows can be read in place (`reach`)."""
    return _digest(
        {
            "format": FORMAT_VERSION,
            "partitions": partition_meta.get("files", partition_meta),
            "model": model.model_dump(mode="json"),
            "dtype": dtype,
            "num_chunks": num_chunks,
            "reach": None if reach is None else [reach.published.tolist(), reach.every().tolist()],
        }
    )


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
    settings = cache.model_dump(mode="json", exclude={"hardware"})
    graph = graph_inputs(partition_meta, model, dtype, num_chunks, reach)
    return _digest({"graph": graph, "cache": settings})


def plan_key(inputs: str, hw: HardwareProfile) -> str:
    """Staleness key: the plan's inputs and the hardware profile it was predicted with."""
    return _digest({"inputs": inputs, "hardware": hw.fingerprint()})


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
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> CachePlan:
        """The plan in `data`, validated as untrusted input (cache/plan_check.py).

        Raises:
            CacheError: naming the file and the first field that is wrong.
        """
        try:
            f = plan_check.parse(data)
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
        )  # fmt: skip

    def check_fits(
        self,
        path: Path,
        halo_sizes: list[int],
        num_layers: int,
        attention: bool,
        rounded: bool = False,
    ) -> None:
        """Refuse a plan that does not fit the run (see `plan_check.fit_problem`).

        Raises:
            CacheError: naming the file and the field.
        """
        ranks = [(c.static_aggregate, c.replica_rows, c.l3_rows) for c in self.caches]
        problem = plan_check.fit_problem(
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


def _seconds(value: Any) -> float | None:
    """A recorded duration: a finite number >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ValueError(f"plan_s must be seconds, not {value!r}")
    return float(value)


def read_in_place(p: PartAccess, c: RankCache, reach: Reach) -> np.ndarray:
    """Halo rows this rank reads in place (comm/levels.py build_levels): rows of owners that
    publish to it, L3 ones or every one (the pairs of `reach.every_row`), replicas never."""
    if not reach.published.size:
        return np.zeros(p.num_halo, dtype=bool)
    l3 = np.zeros(p.num_halo, dtype=bool)
    l3[c.l3_rows] = True
    every_H = reach.every()[p.rank][p.owner_H]
    mask: np.ndarray = reach.published[p.rank][p.owner_H] & (l3 | every_H)
    mask[c.replica_rows] = False
    return mask


def bytes_per_level(
    p: PartAccess, c: RankCache, shape: ModelShape, reach: Reach | None = None
) -> dict[str, int]:
    """Bytes this rank holds at L1 (replicas, static aggregate), receives per step at L2/L3
    through the process group, and reads in place or publishes back (`published`: each row
    read in place once per reading edge forward, its gradient once backward)."""
    l3 = np.zeros(p.num_halo, dtype=bool)
    l3[c.l3_rows] = True
    l1 = np.zeros(p.num_halo, dtype=bool)
    l1[c.replica_rows] = True
    in_place = np.zeros(p.num_halo, dtype=bool) if reach is None else read_in_place(p, c, reach)
    per_step_l2 = per_step_l3 = published = 0
    for layer in range(shape.num_layers):
        if layer == 0 and c.static_aggregate:
            continue
        a, b = shape.widths[layer], shape.widths[layer + 1]
        # Rows forward, gradients backward, except layer 0 aggregating first: its input
        # needs no gradient, so nothing flows back.
        directions = 1 if layer == 0 and b >= a else 2
        width = shape.exchanged_width(layer)  # rows as they travel, and gradients
        w = shape.wire_row(width) + shape.wire_row(width, gradient=True) * (directions - 1)
        skip = (l1 if layer == 0 else np.zeros_like(l1)) | in_place
        per_step_l2 += int((~l3 & ~skip).sum()) * w
        per_step_l3 += int(p.reuse_H[l3 & ~skip].sum()) * w
        row = width * shape.dtype_bytes
        published += int(p.reuse_H[in_place].sum()) * row  # forward, per reading edge
        published += int(in_place.sum()) * row * (directions - 1)  # gradients, per row
    row_in = shape.widths[0] * shape.dtype_bytes
    return {
        "L1_replica_bytes": int(l1.sum()) * row_in,
        "L1s_static_bytes": p.num_inner * row_in if c.static_aggregate else 0,
        "L2_bytes_per_step": per_step_l2,
        "L3_bytes_per_step": per_step_l3,
        "published_bytes_per_step": published,
    }


def make_plan(
    cache: CacheConfig,
    accesses: list[PartAccess],
    shape: ModelShape,
    hw: HardwareProfile,
    keys: tuple[str, str, str],
    num_chunks: str | int = "auto",
    reach: Reach | None = None,
) -> CachePlan:
    """Run the policy (which also gives the replica sweep for the plot), predict every mode
    with the chunk counts it will run (`num_chunks`: the `pipeline.num_chunks` setting) and
    the rows it reads in place (`reach`; default none).

    `keys` are the plan's (key, inputs, graph_inputs) digests.
    """
    b = budgets(cache, accesses, shape)
    reach = reach or Reach.none(len(accesses))
    asked = reach  # what modes run without the plan read in place
    decision = decide(cache.policy, accesses, shape, b, hw, cache.static_aggregate, reach)
    if reach.published.any() and not reach.every().any():
        # auto: per pair, L3 rows only or every row in place; the policy decides the levels
        # for each of the two uniform choices, each is refined pair by pair, the faster kept
        every = Reach(reach.published, every_row=True)
        alt = decide(cache.policy, accesses, shape, b, hw, cache.static_aggregate, every)
        first = per_pair(accesses, decision, shape, hw, reach)
        second = per_pair(accesses, alt, shape, hw, every)
        if better(second[1], first[1]):
            decision, reach = alt, second[0]
        else:
            reach = first[0]
    if num_chunks != "auto":  # a set count serves every layer (and the plan says so)
        decision.num_chunks = [int(num_chunks)] * shape.num_layers
    none = [RankCache() for _ in accesses]
    predicted: dict[str, float | None] = {}
    stages: dict[str, dict[str, float]] = {}
    ranks_s: dict[str, list[dict[str, float]]] = {}
    for name, mode in MODES.items():
        caches = decision.caches if mode.planned else none
        chunks = chunks_run(mode, decision.num_chunks, num_chunks, accesses, shape)
        try:
            pred = predict(
                accesses, caches, shape, hw, name, chunks, reach if mode.planned else asked
            )
        except CacheError:  # the profile lacks that link (e.g. shared memory across hosts)
            predicted[name] = None
            continue
        predicted[name], stages[name] = pred.epoch_time_s, pred.stages
        ranks_s[name] = [{"step_s": t["step_s"], "busy_s": t["busy_s"]} for t in pred.per_rank]
    run = predicted_run(accesses, decision, shape, hw, (num_chunks, reach), predicted)
    return CachePlan(
        *keys, cache.policy, decision.caches, decision.num_chunks, predicted, stages,
        [
            bytes_per_level(p, c, shape, reach)
            for p, c in zip(accesses, decision.caches, strict=True)
        ],
        decision.sweep, max(b.replica_bytes) / 2**20, None,
        [rows_per_level(p, c, reach) for p, c in zip(accesses, decision.caches, strict=True)],
        transports(accesses, decision.caches, reach),
        [np.flatnonzero(row).tolist() for row in reach.every()], ranks_s, run,
    )  # fmt: skip


def per_pair(
    accesses: list[PartAccess],
    decision: Decision,
    shape: ModelShape,
    hw: HardwareProfile,
    reach: Reach,
) -> tuple[Reach, Prediction]:
    """`pipeline.transport=auto` per pair: from `reach` (L3 rows only, or every row of every
    same-host owner), pairs switch between reading every row of the owner in place and its L3
    rows only (the rest through the process group), and a switch is kept where the planned
    mode's predicted step gets faster, or stays as fast with less work over all ranks. The
    switches tried: each pair alone, each reader's pairs together and each owner's pairs
    together (a reader's transfer waits for its slowest peer, so switching one of its pairs
    alone may save nothing); passes repeat while one changes something, at most
    `PAIR_PASSES`. A pair whose reader reads no rows of the owner is left out. Each switch
    costs a prediction with the decided levels and chunk counts, not a policy run. Returns
    the pairs' reach and its prediction."""
    eye = np.eye(len(accesses), dtype=bool)
    pairs = reach.published & np.array([[c > 0 for c in p.recv_counts] for p in accesses])
    every = reach.every() & pairs
    moves = [eye[r][:, None] & eye[q] for r, q in zip(*np.nonzero(pairs), strict=True)]
    moves += [eye[r][:, None] & pairs for r in range(len(eye))]  # a reader's pairs
    moves += [pairs & eye[q] for q in range(len(eye))]  # an owner's pairs
    moves = [m for m in moves if m.any()]

    def priced(every_rq: np.ndarray) -> Prediction:
        candidate = Reach(reach.published, every_rq)
        return predict(accesses, decision.caches, shape, hw, PLANNED, decision.num_chunks,
                       candidate)  # fmt: skip

    best = priced(every)
    for _ in range(PAIR_PASSES):
        changed = False
        for move in moves:
            for value in (True, False):  # the pairs of the move all on, or all off
                trial = np.where(move, value, every)
                if (trial == every).all():
                    continue
                pred = priced(trial)
                if better(pred, best):
                    every, best, changed = trial, pred, True
        if not changed:
            break
    return Reach(reach.published, every), best


PAIR_PASSES = 3
TIE = 1e-6  # relative: steps this close are as fast (float noise of the sums, ~100 ns)


def better(a: Prediction, b: Prediction) -> bool:
    """Prediction a is a faster step than b, or as fast (to `TIE`) with less busy time over
    all ranks (a switch for a rank that does not set the pace still saves it work)."""
    if a.epoch_time_s < b.epoch_time_s * (1 - TIE):
        return True
    busy = [sum(r["busy_s"] for r in p.per_rank) for p in (a, b)]
    return a.epoch_time_s <= b.epoch_time_s * (1 + TIE) and busy[0] < busy[1] * (1 - TIE)


def predicted_run(
    accesses: list[PartAccess],
    decision: Decision,
    shape: ModelShape,
    hw: HardwareProfile,
    setting: tuple[str | int, Reach],
    predicted: dict[str, float | None],
) -> dict[str, float | None]:
    """Every exact pipeline mode's predicted step when run with the decided levels: the
    planned mode's is `predicted`'s; another keeps what it can use of them (the static
    aggregate alone without cache levels: comm/levels.py levels_for_mode) and reads in place
    what `reach` lets it. `setting`: the `pipeline.num_chunks` setting and the plan's reach.
    None where the profile lacks a link the mode needs, or where rows spilled to L3 to fit
    `cache.halo_budget_mb` and the mode reads nothing in place (its own plan could not spill
    them: policy.py spill_to_l3 would refuse the budget)."""
    num_chunks, reach = setting
    spilled = any(c.l3_rows.size for c in decision.caches)
    out: dict[str, float | None] = {}
    for name in auto_candidates():
        mode = mode_of(name)
        if mode.planned or (spilled and not mode.reads_in_place):
            out[name] = predicted.get(name) if mode.planned else None
            continue
        caches = [c if mode.cache_levels else RankCache(c.static_aggregate)
                  for c in decision.caches]  # fmt: skip
        chunks = chunks_run(mode, decision.num_chunks, num_chunks, accesses, shape)
        try:
            out[name] = predict(accesses, caches, shape, hw, name, chunks, reach).epoch_time_s
        except CacheError:
            out[name] = None
    return out


def rows_per_level(p: PartAccess, c: RankCache, reach: Reach) -> dict[str, int]:
    """Halo rows of a rank per level: L1 replicas (layer 0), L3 (not replicated), L2 the rest;
    `in_place`: how many of the L2 and L3 rows are read in place from published rows."""
    l1 = int(c.replica_rows.shape[0])
    l3 = int(np.setdiff1d(c.l3_rows, c.replica_rows).shape[0])
    read = int(read_in_place(p, c, reach).sum())
    return {"L1": l1, "L2": p.num_halo - l3 - l1, "L3": l3, "in_place": read}


def transports(
    accesses: list[PartAccess], caches: list[RankCache], reach: Reach
) -> list[list[str | None]]:
    """Per rank and peer, how the planned mode moves that peer's rows (replicas aside):
    `process-group` (L2 in bulk, L3 per edge), `published-rows` (every row read in place),
    `mixed` (its L3 rows read in place, its L2 rows through the process group), or None (no
    rows from that peer)."""
    out: list[list[str | None]] = []
    for p, c in zip(accesses, caches, strict=True):
        num = len(p.recv_counts)
        read = np.bincount(p.owner_H[read_in_place(p, c, reach)], minlength=num)
        rows = np.asarray(p.recv_counts) - np.bincount(p.owner_H[c.replica_rows], minlength=num)
        row: list[str | None] = []
        for q in range(num):
            if rows[q] == 0:
                row.append(None)
            elif read[q] == 0:
                row.append("process-group")
            else:
                row.append("published-rows" if read[q] == rows[q] else "mixed")
        out.append(row)
    return out


def chunks_run(
    mode: Mode,
    planned: list[int],
    setting: str | int,
    accesses: list[PartAccess],
    shape: ModelShape,
) -> list[int]:
    """The chunk counts a run of `mode` cuts its transfers into (train/assemble.py
    chunk_counts): none for a mode that does not chunk; the `pipeline.num_chunks` setting; the
    plan's; or for a mode run without a plan (cache.policy none) the 4 MiB heuristic of
    comm/modes.py, whose count every worker agrees on (the largest)."""
    if not mode.chunks:
        return [1]
    if setting != "auto" or mode.cache_policy != "none":
        return planned
    width = max(shape.exchanged_width(layer) for layer in range(shape.num_layers))
    rows = max(max([*p.send_counts, *p.recv_counts, 0]) for p in accesses)
    return [auto_chunk_count(rows * shape.wire_row(width))]


def write_plan(run_dir: Path, plan: CachePlan) -> Path:
    """Write cache-plan.json atomically (a fresh temporary file, then a rename).

    Raises:
        CacheError: the run folder cannot hold it (no space, or the name is a folder).
    """
    path = run_dir / PLAN
    try:
        files.write_text(path, files.json_text(plan.to_json()))
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
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 JSON"
        raise CacheError(
            f"cannot read {path} ({reason}); delete it and run leo profile-cache."
        ) from None
    if isinstance(data, dict) and data.get("format_version") in OLDER_VERSIONS:
        return None  # made by an earlier LEO: made again, like a missing one
    return CachePlan.from_json(data, path)
