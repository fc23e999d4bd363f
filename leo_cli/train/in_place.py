"""Whether a run reads halo rows in place from its peers' published rows (comm/inplace.py).

One rule for the plan (train/plan_stage.py `reach_of`) and the workers (train/assemble.py), so
what the plan prices is what the workers do.
"""

from __future__ import annotations

import platform

import torch

from leo_cli.comm.row_areas import peer_memory_available
from leo_cli.config import LeoConfig
from leo_cli.registry import mode_of

# Readiness is a counter written after the rows (comm/published.py): ordered on x86's
# total-store-order memory, not on weaker models (aarch64) without fences this code lacks.
ORDERED_STORES = ("x86_64", "amd64", "i686")


def reads_in_place(cfg: LeoConfig, device: torch.device | str) -> bool:
    """Whether same-host rows may be read in place in this run: a mode that reads in place,
    no attention and no rounded rows (`pipeline.halo_dtype`: published rows are in the
    training dtype), `pipeline.transport` other than process-group, on x86 (the counters are
    host memory). CPU workers read host memory; CUDA workers a peer GPU's memory, only when
    asked for (`pipeline.transport=shared-memory`: this path has not yet run on a GPU here, so
    `auto` keeps GPUs on the process group) and where this torch can map it
    (comm/row_areas.py)."""
    mode = mode_of(cfg.pipeline.mode)
    kind = torch.device(device).type
    x86 = platform.machine().lower() in ORDERED_STORES
    in_place = mode.reads_in_place and not cfg.model.attention and not cfg.pipeline.rounds_rows
    transport = cfg.pipeline.transport
    gpu = kind == "cuda" and transport == "shared-memory" and peer_memory_available()
    return in_place and transport != "process-group" and (kind == "cpu" or gpu) and x86
