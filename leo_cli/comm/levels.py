"""The cache levels of one worker at run time, built once from its part of the cache plan.

L1s, the static aggregate `Â·X` computed once when layer 0's input never changes; L1, replicated
layer-0 input rows aggregated locally with the masks their owners draw; L2 / L3, the exchanged
rows, deduplicated or fetched per edge, or read in place from a same-host owner's published
rows (comm/inplace.py).

Specification: docs/design/cache-levels.md.
Legend: N inner rows, H halo rows, R replicated rows, F input width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock, selected_columns_block
from leo_cli.comm.dist import all_reduce_
from leo_cli.comm.exchange import CommStats, HaloPlan, distinct_rows, fetch_halo
from leo_cli.comm.inplace import InPlace, build_in_place, same_host_ranks
from leo_cli.comm.views import IN_PLACE, L1, L2, L3, halo_owner, level_view, remap_plan
from leo_cli.kernels import variants
from leo_cli.kernels.csr import with_built_transpose
from leo_cli.registry import Mode


@dataclass(frozen=True)
class RankLevels:
    """This worker's share of the cache plan (halo positions are local ids minus N); the L3
    rows as a list or a tensor (the plan's rows, or every halo row: no Python int per row)."""

    static_aggregate: bool
    replica_rows: list[int]
    l3_rows: list[int] | Tensor


@dataclass
class Replicas:
    """Layer-0 input rows of replicated halo nodes and the edges that read them."""

    x_RF: Tensor
    ids_R: Tensor
    block: ColumnBlock

    def add_into(self, out_NO: Tensor, xr_RF: Tensor, weight_OF: Tensor | None) -> Tensor:
        """out + (Â_R·X'_R)·Wᵀ on the rows that read replicas (out of place, differentiable)."""
        part = self.block.forward(xr_RF)
        if weight_OF is not None:
            part = torch.nn.functional.linear(part, weight_OF)
        assert self.block.rows_R is not None
        return out_NO.index_add(0, self.block.rows_R, part)


@dataclass
class Levels:
    """What the cache changes for the layers: views per layer, replicas, static aggregate,
    rows read in place."""

    layer0: tuple[kernels.CSR, HaloPlan]
    others: tuple[kernels.CSR, HaloPlan]
    replicas: Replicas | None
    static_agg_NF: Tensor | None
    in_place: InPlace | None = None

    def transpose_whole(self, adj: kernels.CSR) -> None:
        """Give a view that is the part's CSR `adj` itself its transpose, where `adj` was
        built forward-only (its aggregator may run backward over it); the views that replace
        it have their own."""
        if adj.t_perm.shape[0] == adj.num_edges:
            return
        whole = [self.layer0[0] is adj, self.others[0] is adj]
        if not any(whole):
            return
        full = with_built_transpose(adj)
        if whole[0]:
            self.layer0 = (full, self.layer0[1])
        if whole[1]:
            self.others = (full, self.others[1])


def levels_for_mode(levels: RankLevels, mode: Mode) -> RankLevels:
    """What a mode can use of a plan: modes without cache levels (shared memory reads every
    halo row out of the segment, compute-only moves nothing) keep only the static aggregate
    (a per-edge mode then fetches every row that is not replicated once per edge)."""
    if not mode.cache_levels:
        return RankLevels(levels.static_aggregate, [], [])
    return levels


def level_of_rows(
    num_halo: int,
    rows: tuple[Tensor, Tensor],
    layer0: bool,
    in_place_H: Tensor | None = None,
) -> Tensor:
    """Level of every halo row at layer 0 (replicas win) or at the other layers (replicas
    exist only for layer 0's input; there a row is L3 if the plan fetches it per edge, read
    in place where `in_place_H` says its owner publishes to this worker). `rows`: the L3 and
    the replicated halo positions (`rows_of`)."""
    l3_H, replica_H = rows
    level = torch.full((num_halo,), L2, dtype=torch.int64, device=l3_H.device)
    level[l3_H] = L3
    if in_place_H is not None:
        level[l3_H[in_place_H[l3_H]]] = IN_PLACE
    if layer0:
        level[replica_H] = L1
    return level


def rows_of(levels: RankLevels, device: torch.device) -> tuple[Tensor, Tensor]:
    """(L3 rows, replicated rows) of a worker's levels as tensors of halo positions."""
    l3_H = torch.as_tensor(levels.l3_rows, dtype=torch.int64, device=device)
    return l3_H, torch.tensor(levels.replica_rows, dtype=torch.int64, device=device)


@dataclass(frozen=True)
class InPlaceSetting:
    """What reading L3 rows in place needs (None where they travel per edge instead)."""

    width: int  # the widest row any layer moves
    timeout_s: float
    stats: CommStats  # the worker's communication statistics
    # Same-host owners every row of which is read in place, not only the L3 ones (all of them
    # under pipeline.transport=shared-memory; the plan's pairs under auto).
    every_row_from: frozenset[int] = frozenset()


@torch.no_grad()
def build_levels(
    adj: kernels.CSR,
    plan: HaloPlan,
    x_NF: Tensor,
    halo_ids_H: Tensor,
    levels: RankLevels,
    distributed: bool,
    in_place: InPlaceSetting | None = None,
    static_NF: Tensor | None = None,
) -> Levels:
    """Fetch replicas, precompute the static aggregate (or take `static_NF`, made before by
    `static_aggregate` for these inputs: `auto`'s candidates share it), lay out the exchanged
    halo, set up the rows read in place (L3 rows of same-host owners, when `in_place` is
    given).

    Every worker calls this at the same point (it runs collectives) when a plan exists.
    """
    static = None
    if levels.static_aggregate:
        static = static_NF if static_NF is not None else static_aggregate(adj, plan, x_NF,
                                                                          distributed)  # fmt: skip
    if not distributed:
        return Levels((adj, plan), (adj, plan), None, static)
    device = adj.device
    l3_H, replica_H = rows_of(levels, device)  # once: the plan's lists can hold every row
    in_place_H, rows = None, None
    if in_place is not None:
        # L3 rows of same-host owners, unless replicated at layer 0 (those travel per edge at
        # the other layers: one set of rows read in place serves every layer).
        hosts = torch.tensor(same_host_ranks(len(plan.send_counts)), device=device)
        owner_H = halo_owner(plan, torch.arange(plan.num_halo, device=device))
        in_place_H = hosts[owner_H]
        in_place_H[replica_H] = False
        if in_place.every_row_from:  # every row of these same-host owners is read in place
            owners = torch.tensor(sorted(in_place.every_row_from), device=device)
            more = torch.nonzero(in_place_H & torch.isin(owner_H, owners)).squeeze(1)
            l3_H = distinct_rows(torch.cat([l3_H, more]), plan.num_halo)
        rows = distinct_rows(l3_H[in_place_H[l3_H]], plan.num_halo)  # sorted, by a mark per row
        wanted = all_reduce_(torch.tensor([rows.numel()], device=device), op="max")
        if int(wanted.item()) == 0:
            in_place_H, rows = None, None
    level0_H = level_of_rows(plan.num_halo, (l3_H, replica_H), True, in_place_H)
    # Rows read in place make every aggregator read its gradients as rows (comm/modes.py),
    # unless some worker replicates rows (their gradients must not reach their owners):
    # the views' CSRs then run forward only.
    replicas = torch.tensor([replica_H.numel()], device=device)
    any_replicas = int(all_reduce_(replicas, op="max").item()) > 0
    grads_as_rows = rows is not None and not any_replicas
    layer0 = view_of_layer(adj, plan, level0_H, transpose=not grads_as_rows)
    others = layer0  # no worker replicates: every layer has layer 0's levels, so its view
    if any_replicas:
        # Without replicas here the later layers' levels are layer 0's: so is their view's
        # CSR (the plan is made again: peers' replicas change what they ask of this worker).
        same = layer0[0] if replica_H.numel() == 0 and layer0[0] is not adj else None
        level_H = level_of_rows(plan.num_halo, (l3_H, replica_H), False, in_place_H)
        others = view_of_layer(adj, plan, level_H, same, transpose=True)
    return Levels(
        layer0,
        others,
        fetch_replicas(adj, plan, x_NF, halo_ids_H, level0_H),
        static,
        None
        if rows is None or in_place is None
        else _in_place(adj, plan, rows, x_NF, in_place, grads_as_rows),
    )


@torch.no_grad()
def static_aggregate(adj: kernels.CSR, plan: HaloPlan, x_NF: Tensor, distributed: bool) -> Tensor:
    """`Â·X` of the inner rows, the halo's input rows fetched first where `distributed`
    (collective: every worker calls it at the same point). Always with the rule's CPU SpMM
    (`pipeline.spmm=auto` untried): it is made once, before `auto`'s trials choose the
    variant, so a run whose variant they choose holds the bits of one that sets it by name.
    The halo's rows land behind the inner rows' copy in one buffer (no concatenation holding
    both beside it)."""
    full = x_NF
    if distributed:
        n = x_NF.shape[0]
        full = x_NF.new_empty((n + plan.num_halo, x_NF.shape[1]))
        full[:n] = x_NF
        fetch_halo(x_NF, plan, out=full[n:])
    with variants.serving(variants.AUTO):
        return kernels.spmm(adj, full)


def _in_place(
    adj: kernels.CSR,
    plan: HaloPlan,
    rows_H: Tensor,
    x_NF: Tensor,
    s: InPlaceSetting,
    grads_as_rows: bool,
) -> InPlace:
    setting = (s.width, x_NF.dtype, s.timeout_s)
    return build_in_place(adj, plan, rows_H, setting, s.stats, grads_as_rows)


def view_of_layer(
    adj: kernels.CSR,
    plan: HaloPlan,
    level_H: Tensor,
    same_csr: kernels.CSR | None = None,
    transpose: bool = True,
) -> tuple[kernels.CSR, HaloPlan]:
    """The halo view of a layer's levels `level_H` (`level_of_rows`: layer 0's leave replicas
    out, every layer's the rows read in place): the part's own CSR and plan when no worker
    has a row of another level than L2 there (rebuilding them would hold another copy of
    every edge while set-up peaks, and one more all run). `same_csr`: the CSR of a view with
    the same levels here (see `level_view`); without `transpose`, a view's CSR is
    forward-only.

    Collective: a view's owners answer its readers, so all workers decide together.
    """
    other = torch.tensor([int((level_H != L2).sum())], device=adj.device)
    if int(all_reduce_(other, op="max").item()) == 0:
        return adj, plan
    return level_view(adj, plan, level_H, same_csr, transpose)


def fetch_replicas(
    adj: kernels.CSR, plan: HaloPlan, x_NF: Tensor, halo_ids_H: Tensor, level_H: Tensor
) -> Replicas | None:
    """Bring the input rows of L1 halo nodes here once (an exchange restricted to them)."""
    rows_R = torch.nonzero(level_H == L1).squeeze(1)
    plan_R = remap_plan(plan, rows_R)  # the plan alone: no CSR of the edges is needed here
    x_RF = fetch_halo(x_NF, plan_R)  # kept for the run: its own buffer, not a slice
    if rows_R.numel() == 0:
        return None
    block = selected_columns_block(adj, rows_R + plan.num_inner)
    return Replicas(x_RF, halo_ids_H[rows_R], block)
