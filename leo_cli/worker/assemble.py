"""Assembling one worker's job: partition -> halo plan -> aggregator -> graph, data, model.

Names: `halo` is a worker's HaloPlan (who sends what), `cache_plan` the run's CachePlan
(cache-plan.json), `mode` the registry record of `pipeline.mode`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.aggregate import Aggregator, Rounding
from leo_cli.comm.dist import all_reduce_
from leo_cli.comm.exchange import CommStats, HaloPlan
from leo_cli.comm.grads import make_grad_reducer
from leo_cli.comm.levels import (
    InPlaceSetting,
    Levels,
    RankLevels,
    build_levels,
    levels_for_mode,
    static_aggregate,
)
from leo_cli.comm.modes import Wiring, auto_chunks, make_layer_aggregators
from leo_cli.comm.rounding import CODECS, wire_bytes
from leo_cli.config import LeoConfig
from leo_cli.config.schema import MAX_CHUNKS, ModelConfig
from leo_cli.errors import TrainError
from leo_cli.graph.layout import LocalPart
from leo_cli.graph.types import DatasetInfo
from leo_cli.models.gnn import build_model
from leo_cli.models.local_graph import LocalGraph, part_adjacency, transpose_scales
from leo_cli.models.optim import Adam
from leo_cli.planner.auto_mode import OWN_LEVELS, PLANNED_LEVELS
from leo_cli.planner.plan import CachePlan
from leo_cli.planner.reach import reads_in_place
from leo_cli.registry import is_auto, mode_of, row_transport
from leo_cli.util.rss import trim_heap
from leo_cli.util.timing import Laps
from leo_cli.worker.step import Job, WorkerData

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def halo_plan(part: LocalPart, device: torch.device) -> HaloPlan:
    return HaloPlan(
        num_inner=part.num_inner,
        send_idx_S=torch.from_numpy(np.array(part.send_idx)).to(device),
        send_counts=[int(c) for c in part.send_counts],
        recv_counts=[int(c) for c in part.recv_counts],
    )


def exchange_width(model: ModelConfig, dataset: DatasetInfo, static_layer0: bool = False) -> int:
    """The widest rows any layer exchanges: each layer sends the narrower of its input and
    the row it computes (for attention: the features and source score of every head).
    `static_layer0`: layer 0 never aggregates (`static_layer0_of`), so its rows never move
    (a model of one such layer moves none: its own width is kept, segments are never empty)."""
    widths = model.layer_widths(dataset.num_features, dataset.num_classes)
    rows = model.row_widths(dataset.num_classes)
    moved = [min(a, b) for a, b in zip(widths, rows, strict=False)]
    return max(moved[1:] if static_layer0 and len(moved) > 1 else moved)


def chunk_counts(
    setting: str | int,
    planned: list[int] | None,
    halo: HaloPlan,
    row_bytes: int,
) -> list[int]:
    """Chunks per peer of every layer: the setting, else the plan's, else the heuristic
    (`row_bytes`: bytes of the widest row as it travels).

    Both ends of a transfer must cut it the same way, so the heuristic's count is agreed
    on by all workers (the largest any of them wants).
    """
    if setting != "auto":
        counts = [int(setting)]
    elif planned:
        counts = planned
    else:
        wanted = torch.tensor([auto_chunks(halo, row_bytes)], dtype=torch.int64)
        counts = [int(all_reduce_(wanted, op="max").item())]
    # Checked where they are read (config schema, cache plan); 0 chunks would send nothing.
    assert all(1 <= k <= MAX_CHUNKS for k in counts), f"chunk counts {counts} out of range"
    return counts


def static_layer0_of(cfg: LeoConfig, cache: RankLevels | None) -> bool:
    """Whether layer 0 never aggregates: its static aggregate stands in (no input dropout).
    Read from `cache` before the levels are built: they hold the static aggregate wherever
    the plan's share asks for it (`build_levels`), whatever the mode (`levels_for_mode`)."""
    return cache is not None and cache.static_aggregate and cfg.model.effective_input_dropout == 0


def assemble(
    cfg: LeoConfig,
    part: LocalPart,
    dataset: DatasetInfo,
    world_size: int,
    device: torch.device,
    cache: RankLevels | None = None,
    chunks_planned: list[int] | None = None,
    laps: Laps | None = None,
    every_row_from: list[int] | None = None,
    tensors: PartTensors | None = None,
    static_NF: Tensor | None = None,
) -> Job:
    """Build a job from an in-memory part (used by workers and by the single-process oracle).

    `cache` is this rank's share of the cache plan; None means no cache (every halo row is
    exchanged each layer). Every rank must pass one, or none (set-up runs collectives).
    `chunks_planned` are the plan's chunk counts per layer, used when num_chunks is `auto`;
    `every_row_from`: the same-host owners every row of which the plan reads in place (`auto`
    chose it for those pairs), not only their L3 rows.
    `laps` gets the seconds of each step (util/timing.py); `tensors`: the part's CSR and data
    where already made for this config (`part_tensors`: `auto`'s candidates share them), and
    `static_NF` the static aggregate where the cache has one (`shared_static`).
    """
    laps = laps or Laps()
    assert not is_auto(cfg.pipeline.mode), "pipeline.mode=auto is resolved before workers start"
    mode = mode_of(cfg.pipeline.mode)
    dtype = DTYPES[cfg.train.dtype]
    halo = halo_plan(part, device)
    stats = CommStats()  # every aggregator of this worker counts here
    if mode.per_edge_rows and world_size > 1:  # MGG: every halo row L3 (replicas excepted)
        cache = every_row_l3(cache, halo.num_halo)
    static = static_layer0_of(cfg, cache)
    setting = None
    if world_size > 1:
        setting = in_place_setting(cfg, part, dataset, device, stats, every_row_from, static)
    if cache is None and setting is not None and setting.every_row_from:
        cache = RankLevels(False, [], [])  # no plan, yet every same-host row read in place
    transpose = not views_leave_the_part(cfg, cache, setting)
    adj, data = tensors or part_tensors(cfg, part, dataset, device, transpose)
    laps.lap("graph_s")
    levels = None
    if cache is not None:
        assert cfg.model.admits_replicas or not (cache.replica_rows or cache.static_aggregate), (
            f"{cfg.model.name}: L2/L3 rows only (no replicas or static aggregate for this model)"
        )
        assert cfg.admits_replicas or not cache.replica_rows, (
            f"pipeline.halo_dtype={cfg.pipeline.halo_dtype}: no replicas (rows are rounded)"
        )
        halo_ids = torch.from_numpy(np.array(part.halo_nodes)).to(device)
        mode_cache = levels_for_mode(cache, mode)
        levels = build_levels(
            adj, halo, data.x_NF, halo_ids, mode_cache, world_size > 1, setting, static_NF
        )
        levels.transpose_whole(adj)
    laps.lap("levels_s")
    ids_N = torch.from_numpy(np.array(part.inner_nodes, dtype=np.int64)).to(device)
    rounding = rounding_of(cfg, ids_N)
    aggregator = aggregator_of(
        cfg,
        part,
        (adj, halo),
        levels,
        world_size,
        dataset,
        (chunks_planned, stats),
        rounding,
        static,
    )
    graph = LocalGraph(
        global_ids_N=ids_N,
        aggregator=aggregator,
        replicas=None if levels is None else levels.replicas,
        static_agg_NF=None if levels is None else levels.static_agg_NF,
    )
    laps.lap("aggregator_s")
    if cfg.model.attention:
        graph.prepare_attention(cfg.model.num_layers)
    model = build_model(cfg.model, dataset.num_features, dataset.num_classes, cfg.run.seed)
    model = model.to(device=device, dtype=dtype)
    opt = Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    reducer = make_grad_reducer(model, mode)
    laps.lap("model_s")
    return Job(halo, graph, reducer, data, model, opt, static)


PartTensors = tuple[kernels.CSR, WorkerData]


def part_tensors(
    cfg: LeoConfig,
    part: LocalPart,
    dataset: DatasetInfo,
    device: torch.device,
    transpose: bool = True,
) -> PartTensors:
    """The part's CSR, weighted for the model, and its data (features, labels, splits), in
    the training dtype: what every mode's job of this part starts from (read, never written,
    by a job: jobs of several modes can share them). Without `transpose`, a forward-only
    CSR (`views_leave_the_part`). The heap's free pages are handed back after the CSR
    (`trim_heap`): what its build freed on the heap would otherwise stay resident through
    set-up's peak, more or less of it from run to run."""
    dtype = DTYPES[cfg.train.dtype]
    adj = part_adjacency(part, cfg.model.name, dtype, device, transpose)
    trim_heap()
    return adj, WorkerData.from_part(part, dataset.num_train, dtype, device)


def shared_static(
    cfg: LeoConfig,
    cache_plan: CachePlan | None,
    part: LocalPart,
    tensors: PartTensors,
    world_size: int,
) -> Tensor | None:
    """The static aggregate every candidate of `auto` would compute alike (the plan's levels
    keep it in every variant and mode), made once before the trials; None where the plan has
    none (decided alike on every rank: the same plan file)."""
    if not cfg.cache.enabled or cache_plan is None or not cache_plan.caches:
        return None
    if not all(c.static_aggregate for c in cache_plan.caches):
        return None
    adj, data = tensors
    return static_aggregate(adj, halo_plan(part, adj.device), data.x_NF, world_size > 1)


def aggregator_of(
    cfg: LeoConfig,
    part: LocalPart,
    whole: tuple[kernels.CSR, HaloPlan],
    levels: Levels | None,
    world_size: int,
    dataset: DatasetInfo,
    planned: tuple[list[int] | None, CommStats],
    rounding: Rounding | None = None,
    static_layer0: bool = False,
) -> Aggregator:
    """The mode's aggregator over the part's halo (`whole`) or the cache levels' views; a
    single worker has no halo to move (its views carry no plan). `planned`: the plan's chunk
    counts (None: no plan) and where the aggregator counts what it moves; `rounding`: how
    its rows are rounded (`rounding_of`); `static_layer0`: layer 0 never aggregates
    (`static_layer0_of` of the levels' cache)."""
    adj, halo = whole
    chunks_planned, stats = planned
    dtype = DTYPES[cfg.train.dtype]
    width = exchange_width(cfg.model, dataset, static_layer0)  # segments' rows
    # the chunking heuristic's rows, as the planner prices them (planner/make.py)
    row_bytes = wire_bytes(
        cfg.pipeline.halo_dtype, exchange_width(cfg.model, dataset), dtype.itemsize
    )
    scales = transpose_scales(part, cfg.model.name, dtype, adj.device)  # gradients as rows
    if world_size == 1:  # rows are rounded all the same: one worker reads what P workers do
        return make_layer_aggregators(
            mode_of(cfg.pipeline.mode), (adj, None), (adj, None),
            Wiring(CommStats(), torch.zeros(0), width, dtype, rounding, scales), [1],
            attention=cfg.model.attention,
        )  # fmt: skip
    others = whole if levels is None else levels.others
    first = others if levels is None or static_layer0 else levels.layer0
    local_H = torch.from_numpy(np.array(part.halo_owner_local)).to(adj.device)
    return make_layer_aggregators(
        mode_of(cfg.pipeline.mode),
        first,
        others,
        Wiring(stats, local_H, width, dtype, rounding, scales),
        chunk_counts(cfg.pipeline.num_chunks, chunks_planned, halo, row_bytes),
        attention=cfg.model.attention,
        static_layer0=static_layer0,
        in_place=None if levels is None else levels.in_place,
    )


def rounding_of(cfg: LeoConfig, ids_N: Tensor) -> Rounding | None:
    """How this worker rounds the rows its aggregations read (`pipeline.halo_dtype`);
    `ids_N`: the global ids of its inner rows."""
    codec = CODECS[cfg.pipeline.halo_dtype]
    return None if codec is None else Rounding(codec, ids_N)


def views_leave_the_part(
    cfg: LeoConfig, cache: RankLevels | None, setting: InPlaceSetting | None
) -> bool:
    """Whether the cache levels' views are expected to replace the part's CSR and run
    forward only (rows read in place, no replicas here, no attention), so that the part's
    CSR needs no transpose: its sort of every edge is a third of a large part's set-up.
    Where a view turns out to be the part's CSR after all, `Levels.transpose_whole` builds
    it then."""
    if setting is None or cache is None or cfg.model.attention:
        return False
    return not cache.replica_rows


def every_row_l3(cache: RankLevels | None, num_halo: int) -> RankLevels:
    """The levels of a per-edge mode: every halo row L3 (a tensor of halo positions, not a
    list of every row), replicas and the static aggregate kept where a plan has them."""
    replicas = [] if cache is None else cache.replica_rows
    static = cache is not None and cache.static_aggregate
    l3_H = torch.ones(num_halo, dtype=torch.bool)
    l3_H[torch.tensor(replicas, dtype=torch.int64)] = False
    return RankLevels(static, replicas, torch.nonzero(l3_H).squeeze(1))


def in_place_setting(
    cfg: LeoConfig,
    part: LocalPart,
    dataset: DatasetInfo,
    device: torch.device,
    stats: CommStats,
    planned_every_row: list[int] | None = None,
    static_layer0: bool = False,
) -> InPlaceSetting | None:
    """What reading rows in place needs, or None where every row travels through the mode's
    transport: a mode that does not read in place, `pipeline.transport=process-group`, or
    CUDA workers unless `pipeline.transport=shared-memory` (planner/reach.py).
    `static_layer0`: layer 0's rows are never published (`static_layer0_of`)."""
    if not reads_in_place(cfg, device):
        return None
    width = exchange_width(cfg.model, dataset, static_layer0)
    every: set[int] = set()
    transport = row_transport(cfg.pipeline.transport)
    if transport.every_row:
        every = set(range(part.num_parts)) - {part.rank}  # (those on this host only)
    elif transport.in_place == "planned":
        every = set(planned_every_row or [])
    timeout = cfg.launch.timeout_s
    return InPlaceSetting(width, timeout, stats, frozenset(every))


def build_job(
    plan_path: Path,
    cfg: LeoConfig,
    cache_plan: CachePlan | None,
    meta: dict[str, Any],
    part: LocalPart,
    world_size: int,
    device: torch.device,
    halo_sizes: list[int],
    laps: Laps | None = None,
    tensors: PartTensors | None = None,
    static_NF: Tensor | None = None,
) -> Job:
    """The job of one part, with its share of the run's cache plan (`load_plan`: made for
    these partitions and settings; checked whole against `halo_sizes`, every rank's halo
    rows: every rank then refuses a bad plan alike, before any set-up collective);
    `tensors` and `static_NF` as `assemble` takes them."""
    dataset = DatasetInfo.from_meta(meta)
    if not cfg.cache.enabled:
        return assemble(cfg, part, dataset, world_size, device, laps=laps, tensors=tensors)
    if cache_plan is None:
        raise TrainError(
            f"{plan_path} is missing or was made for other partitions or settings; run "
            "leo profile-cache with this config (leo train does so itself)."
        )
    layers, attention = cfg.model.num_layers, cfg.model.attention
    cache_plan.check_fits(plan_path, halo_sizes, layers, attention, cfg.pipeline.rounds_rows)
    c = cache_plan.caches[part.rank]
    levels = RankLevels(c.static_aggregate, c.replica_rows.tolist(), torch.from_numpy(c.l3_rows))
    every_row = cache_plan.every_row[part.rank] if cache_plan.every_row else None
    levels, every_row = chosen_levels(cfg, levels, every_row)
    return assemble(
        cfg, part, dataset, world_size, device, levels, cache_plan.num_chunks, laps=laps,
        every_row_from=every_row, tensors=tensors, static_NF=static_NF,
    )  # fmt: skip


def chosen_levels(
    cfg: LeoConfig, levels: RankLevels, every_row: list[int] | None
) -> tuple[RankLevels, list[int] | None]:
    """This rank's levels and the owners it reads every row of in place, as
    `pipeline.levels` takes them from the plan: as made (`own`, `planned`), without replicas,
    or without rows read in place (those travel in bulk with the rest, as they do for a mode
    that reads nothing in place)."""
    setting = cfg.pipeline.levels
    if keeps_plan_levels(cfg):
        return levels, every_row
    replicas = [] if setting == "no-replicas" else levels.replica_rows
    if setting == "no-in-place" or not mode_of(cfg.pipeline.mode).reads_in_place:
        return RankLevels(levels.static_aggregate, replicas, []), None
    return RankLevels(levels.static_aggregate, replicas, levels.l3_rows), every_row


def keeps_plan_levels(cfg: LeoConfig) -> bool:
    """Whether `chosen_levels` leaves the plan's levels as they are: its own plan, or the
    planned mode's taken as planned by a mode that reads in place as that mode does."""
    setting = cfg.pipeline.levels
    planned = setting == PLANNED_LEVELS and mode_of(cfg.pipeline.mode).reads_in_place
    return setting == OWN_LEVELS or planned
