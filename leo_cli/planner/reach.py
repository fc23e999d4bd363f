"""Which halo rows a run reads in place from its peers' published rows (comm/inplace.py).

One rule for the plan (`reach_of`, priced by the cost model) and the workers
(worker/assemble.py), so what the plan prices is what the workers do.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np
import torch

from leo_cli.comm.dist import uses_cuda
from leo_cli.comm.row_areas import peer_memory_available
from leo_cli.config import LeoConfig
from leo_cli.planner.auto_mode import planning_config
from leo_cli.registry import mode_of, row_transport

# Readiness is a counter written after the rows (comm/published.py): ordered on x86's
# total-store-order memory, not on weaker models (aarch64) without fences this code lacks.
ORDERED_STORES = ("x86_64", "amd64", "i686")


def reads_in_place(cfg: LeoConfig, device: torch.device | str) -> bool:
    """Whether same-host rows may be read in place in this run: a mode that reads in place
    where `rows_readable_in_place` holds."""
    return mode_of(cfg.pipeline.mode).reads_in_place and rows_readable_in_place(cfg, device)


def rows_readable_in_place(cfg: LeoConfig, device: torch.device | str) -> bool:
    """Whether a mode that reads in place would read same-host rows so under `cfg`'s other
    settings: no attention and no rounded rows (`pipeline.halo_dtype`: published rows are in
    the training dtype), `pipeline.transport` other than process-group, on x86 (the counters
    are host memory). CPU workers read host memory; CUDA workers a peer GPU's memory, only
    when asked for (`pipeline.transport=shared-memory`: this path has not yet run on a GPU
    here, so `auto` keeps GPUs on the process group) and where this torch can map it
    (comm/row_areas.py)."""
    rounded, attention = cfg.pipeline.rounds_rows, cfg.model.attention  # (then the registry's)
    transport = row_transport(cfg.pipeline.transport)
    kind = torch.device(device).type
    x86 = platform.machine().lower() in ORDERED_STORES
    gpu = kind == "cuda" and transport.gpu and peer_memory_available()
    readable = not attention and not rounded and transport.in_place != "none"
    return readable and (kind == "cpu" or gpu) and x86


@dataclass(frozen=True)
class Reach:
    """Which owners' rows each rank may read in place (comm/inplace.py), and which rows.

    `published[r, q]`: rank q publishes rows rank r maps (same host, CPU, `pipeline.transport`
    not process-group). `every_row` (one value for every pair, or `[r, q]` per pair): rank r
    reads every row of such an owner q in place (`pipeline.transport=shared-memory`, or where
    `auto` chose it for the pair), not only the L3 rows (the rest of q's rows then travel
    through the process group). Replicated rows are never read in place (they are exchanged
    at the layers past 0).
    """

    published: np.ndarray
    every_row: np.ndarray | bool = False

    @classmethod
    def none(cls, num: int) -> Reach:
        return cls(np.zeros((num, num), dtype=bool))

    def every(self) -> np.ndarray:
        """`[r, q]`: r reads every row of q in place (a pair q publishes to r)."""
        every = np.broadcast_to(np.asarray(self.every_row, dtype=bool), self.published.shape)
        return np.asarray(self.published & every)


def reach_of(cfg: LeoConfig, num_parts: int) -> Reach:
    """Which ranks' rows each rank can read in place (comm/inplace.py): those on its host,
    in a mode that reads in place, on CPU (on GPUs only under
    `pipeline.transport=shared-memory`), unless `pipeline.transport=process-group` (or
    attention: its rows are not read in place); every row of them under
    `pipeline.transport=shared-memory` (worker/assemble.py reads_in_place decides alike).
    Under `pipeline.mode=auto`, the planned mode's (the plan is made for it: auto_mode.py)."""
    return reaches_of(cfg, num_parts)[0]


def reaches_of(cfg: LeoConfig, num_parts: int) -> tuple[Reach, Reach]:
    """`reach_of`, and the same for a mode that reads in place whatever `pipeline.mode`
    says: the rows a plan made for a mode that reads none prices such modes with."""
    priced = _in_place_reach(cfg, num_parts)
    reads = mode_of(planning_config(cfg).pipeline.mode).reads_in_place
    return (priced if reads else Reach.none(num_parts)), priced


def _in_place_reach(cfg: LeoConfig, num_parts: int) -> Reach:
    """`reaches_of`'s second: same-host owners' rows where they are readable in place."""
    if not rows_readable_in_place(cfg, "cuda" if uses_cuda(cfg.launch) else "cpu"):
        return Reach.none(num_parts)
    # Workers per node as launched (launch/elastic.py workers_per_node, without its checks:
    # a pinned worker calls this too, and sees only its own cores).
    per_node = cfg.launch.nproc or max(num_parts // cfg.launch.nnodes, 1)
    host = np.arange(num_parts) // per_node
    published = host[:, None] == host[None, :]
    np.fill_diagonal(published, False)
    return Reach(published, every_row=row_transport(cfg.pipeline.transport).every_row)
