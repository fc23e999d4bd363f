"""Making the cache plan: run the policy over every part's halo accesses, predict every mode
with the chunk counts and in-place reads it will run, and choose per peer pair how rows
travel (`make_plan`). The cost model (planner/cost.py) prices; planner/plan.py holds the file.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import numpy as np

import leo_cli
from leo_cli.comm.modes import auto_chunk_count
from leo_cli.config.schema import CacheConfig, ModelConfig
from leo_cli.errors import CacheError
from leo_cli.planner.access import PartAccess
from leo_cli.planner.auto_mode import candidate_name
from leo_cli.planner.cost import (
    Buffers,
    ModelShape,
    Prediction,
    counts_memo,
    mode_buffers,
    predict,
)
from leo_cli.planner.plan import CachePlan, RankCache, digest
from leo_cli.planner.policy import PLANNED, Budgets, Decision, decide
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.reach import Reach
from leo_cli.registry import Mode, auto_candidates, conv_of, mode_of, planned_mode, priced_runs

PLANNER = "leo_cli.planner"  # the package whose own modules `planner_sources` lists
# `from leo_cli.x import a, b`: the module, and the names on the import's first line (where one
# names a submodule, `from leo_cli.x import (` lists x only: import a submodule on its own line).
IMPORT = re.compile(r"^\s*from (leo_cli\.[\w.]+) import \(?([\w, ]*)", re.MULTILINE)


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
        halo_stochastic=halo[2], diagonal=conv_of(model.name).diagonal,
        input_reads=conv_of(model.name).input_reads,
        learnt_self_weight=conv_of(model.name).learnt_self_weight,
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


def plan_key(inputs: str, hw: HardwareProfile) -> str:
    """Staleness key: the plan's inputs, the hardware profile it was predicted with and the
    planner that made it (`planner_code`)."""
    return digest({"inputs": inputs, "hardware": hw.fingerprint(), "planner": planner_code()})


def planner_sources() -> list[Path]:
    """The modules that make a plan: the planner's own, the mode registry it prices, and every
    other LEO module they import from (the transports whose copies and segments it sizes, the
    schema's bounds), so that a change to any of them makes cached plans stale."""
    package = Path(__file__).resolve().parents[1]
    own = sorted(Path(__file__).resolve().parent.glob("*.py"))
    used = {package / "registry.py"}
    for path in own:
        for module, names in IMPORT.findall(path.read_text()):
            if module.startswith(PLANNER):
                continue
            base = package.joinpath(*module.split(".")[1:])
            subs = [base / f"{name.split()[0]}.py" for name in names.split(",") if name.split()]
            used.update(f for f in (base.with_suffix(".py"), base / "__init__.py", *subs)
                        if f.is_file())  # fmt: skip
    return sorted({*own, *used})


@functools.cache
def planner_code() -> str:
    """Digest of `planner_sources`, so that a plan cached by another cost model is made again
    rather than read; LEO's version where the sources are not installed."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    try:
        for path in planner_sources():
            h.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
    except OSError:
        return f"leo {leo_cli.__version__}"
    return h.hexdigest()


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
    priced: Reach | None = None,
) -> CachePlan:
    """Run the policy (which also gives the replica sweep for the plot), predict every mode
    with the chunk counts it will run (`num_chunks`: the `pipeline.num_chunks` setting) and
    the rows it reads in place: the levels' (`reach`; default none), or where they read
    none, those a mode that reads in place would read so (`priced`; default `reach`: a plan
    made for a mode that reads nothing in place prices the modes that do with the rows they
    read, though without the per-pair transport choice a plan of their own makes).

    `keys` are the plan's (key, inputs, graph_inputs) digests.
    """
    with counts_memo(len(accesses)):  # the policy's trials change one rank at a time
        return _make_plan(cache, accesses, shape, hw, keys, num_chunks, reach, priced_reach=priced)


def _make_plan(
    cache: CacheConfig,
    accesses: list[PartAccess],
    shape: ModelShape,
    hw: HardwareProfile,
    keys: tuple[str, str, str],
    num_chunks: str | int,
    reach: Reach | None,
    priced_reach: Reach | None,
) -> CachePlan:
    """`make_plan`'s work."""
    b = budgets(cache, accesses, shape)
    reach = reach or Reach.none(len(accesses))
    asked = priced_reach or reach  # what modes run without the plan read in place
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
    # what the modes that read in place are priced with, run with the plan's levels
    rows_read = reach if reach.published.any() else asked
    none = [RankCache() for _ in accesses]
    predicted: dict[str, float | None] = {}
    stages: dict[str, dict[str, float]] = {}
    ranks_s: dict[str, list[dict[str, float]]] = {}
    for priced in priced_runs():  # the planned mode with the levels, every mode without
        name, cached = priced.name, priced.cached
        chunks = chunks_run(priced.runs, decision.num_chunks, num_chunks, accesses, shape, cached)
        caches, rows = (decision.caches, rows_read) if cached else (none, asked)
        try:
            pred = predict(accesses, caches, shape, hw, priced.mode, chunks, rows)
        except CacheError:  # the profile lacks that link (e.g. shared memory across hosts)
            predicted[name] = None
            continue
        predicted[name], stages[name] = pred.epoch_time_s, pred.stages
        ranks_s[name] = [{"step_s": t["step_s"], "busy_s": t["busy_s"]} for t in pred.per_rank]
    run = predicted_run(accesses, decision, shape, hw, (num_chunks, rows_read), predicted)
    buffers = predicted_buffers(accesses, decision, shape, rows_read)
    shm = {name: b.shm for name, b in buffers.items()}
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
        {name: sum(b.total) for name, b in buffers.items()}, shm,
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
        chunks = chunks_run(mode, decision.num_chunks, num_chunks, accesses, shape)
        try:
            out[name] = predict(
                accesses, run_caches(mode, decision), shape, hw, name, chunks, reach
            ).epoch_time_s
        except CacheError:
            out[name] = None
    return out


def run_caches(mode: Mode, decision: Decision) -> list[RankCache]:
    """The levels a mode other than the planned one runs with: the decided ones where it has
    cache levels, else the static aggregate alone (comm/levels.py levels_for_mode)."""
    return [c if mode.cache_levels else RankCache(c.static_aggregate) for c in decision.caches]


def predicted_buffers(
    accesses: list[PartAccess], decision: Decision, shape: ModelShape, reach: Reach
) -> dict[str, Buffers]:
    """Every exact pipeline mode's bytes of buffers that move rows per rank, and of them in
    /dev/shm (cost.mode_buffers), run as `predicted_run` prices it: the planned mode with the
    decided levels and `reach`, the others with what they can use of them."""
    out = {
        name: mode_buffers(accesses, run_caches(mode_of(name), decision), shape, name, reach)
        for name in auto_candidates()
    }
    # `auto`'s variants of the planned mode's levels (comm: worker/assemble.py chosen_levels),
    # so that they are checked against free memory by their own buffers.
    planned = planned_mode()
    bare = [RankCache(c.static_aggregate, c.replica_rows) for c in decision.caches]
    no_replicas = [RankCache(c.static_aggregate, l3_rows=c.l3_rows) for c in decision.caches]
    num = len(accesses)
    out[candidate_name(planned, "no-replicas")] = mode_buffers(
        accesses, no_replicas, shape, planned, reach
    )
    out[candidate_name(planned, "no-in-place")] = mode_buffers(
        accesses, bare, shape, planned, Reach.none(num)
    )
    return out


def rows_per_level(p: PartAccess, c: RankCache, reach: Reach) -> dict[str, int]:
    """Halo rows of a rank per level: L1 replicas (layer 0), L3 (not replicated), L2 the rest;
    `in_place`: how many of the L2 and L3 rows are read in place from published rows."""
    l1 = int(c.replica_rows.shape[0])
    l3 = int(np.isin(c.l3_rows, c.replica_rows, invert=True, kind="table").sum())
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
    with_plan: bool = True,
) -> list[int]:
    """The chunk counts a run of `mode` cuts its transfers into (worker/assemble.py
    chunk_counts): none for a mode that does not chunk; the `pipeline.num_chunks` setting; the
    plan's; or for a run without a plan (`with_plan` False: cache.policy none) the 4 MiB
    heuristic of comm/modes.py, whose count every worker agrees on (the largest)."""
    if not mode.chunks:
        return [1]
    if setting != "auto" or with_plan:
        return planned
    width = max(shape.exchanged_width(layer) for layer in range(shape.num_layers))
    rows = max(max([*p.send_counts, *p.recv_counts, 0]) for p in accesses)
    return [auto_chunk_count(rows * shape.wire_row(width))]
