"""Config checks that every start of training runs: in the launcher (`leo train`) and in each
worker, since plain `torchrun -m leo_cli.worker.entry` starts workers without the launcher.

Settings training cannot honour (a mode's needs from its registry record, gloo with CUDA
tensors) are refused with one sentence naming the key, rather than failing deep inside a
worker.
"""

from __future__ import annotations

import platform

from leo_cli.comm.row_areas import peer_memory_available
from leo_cli.config import LeoConfig
from leo_cli.errors import ConfigError
from leo_cli.planner.auto_mode import planning_config
from leo_cli.planner.reach import reads_in_place
from leo_cli.registry import is_auto, mode_of, pipeline_modes, planned_mode, row_transport


def check_transport(cfg: LeoConfig, on_cuda: bool) -> None:
    """Refuse `pipeline.transport=shared-memory` where no row can be read in place (it would
    otherwise move every row through the process group without a word): CUDA workers whose
    torch cannot map a peer GPU's memory (symmetric memory), attention models, modes that read
    nothing in place, and machines without x86's store order."""
    if not row_transport(cfg.pipeline.transport).every_row:
        return
    key = "pipeline.transport=shared-memory"
    mode = cfg.pipeline.mode
    if is_auto(mode):  # auto then chooses among the modes that read in place (auto_mode.py)
        cfg = planning_config(cfg)
        mode = cfg.pipeline.mode
    if on_cuda and not peer_memory_available():
        raise ConfigError(
            f"{key} on CUDA workers maps peer GPUs' memory through PyTorch's symmetric memory "
            "(torch.distributed._symmetric_memory), which this torch build lacks; use "
            "pipeline.transport=auto or process-group."
        )
    if cfg.model.attention:
        raise ConfigError(
            f"{key} does not apply to model.name={cfg.model.name} (attention rows are not read "
            "in place); use pipeline.transport=auto or process-group."
        )
    if not mode_of(mode).reads_in_place:
        readers = ", ".join(m for m in pipeline_modes() if mode_of(m).reads_in_place)
        raise ConfigError(
            f"{key} does not apply to pipeline.mode={mode} (that mode reads no rows from "
            f"published rows); use it with pipeline.mode {readers}, or drop the key."
        )
    if not reads_in_place(cfg, "cuda" if on_cuda else "cpu"):
        raise ConfigError(
            f"{key} needs x86's store order to read published rows safely, which this "
            f"{platform.machine()} machine lacks; use pipeline.transport=process-group."
        )


def check_backend(backend: str, on_cuda: bool) -> None:
    """Refuse gloo for workers whose tensors live on GPUs (the launcher checks what it sees,
    each worker its own device).

    Gloo's point-to-point transfers read host memory, so the first halo exchange of CUDA
    tensors would fail deep inside a worker; training tensors are not kept on the CPU for it
    either (every step would copy them both ways), so the setting is refused.
    """
    if on_cuda and backend == "gloo":
        raise ConfigError(
            "launch.backend=gloo cannot move the CUDA tensors of the halo exchange; use "
            "launch.backend=auto or nccl on GPUs, or launch.device=cpu to train on the CPU."
        )


def check_config(cfg: LeoConfig, allow_inexact: bool = False) -> None:
    """Refuse settings that training cannot honour, and inexact modes unless asked for.

    Args:
        cfg: the resolved config.
        allow_inexact: permit an inexact `pipeline.mode` such as compute-only
            (`leo train --allow-inexact`).

    `pipeline.mode=auto` passes: it chooses among the exact modes these checks accept
    (planner/auto_mode.py candidates).
    """
    if is_auto(cfg.pipeline.mode):
        return
    mode = mode_of(cfg.pipeline.mode)
    if not mode.exact and not allow_inexact:
        raise ConfigError(
            f"pipeline.mode={mode.name} skips the halo exchange and trains on wrong numbers on "
            "purpose; it exists for `leo bench` (pass --allow-inexact to leo train to run it "
            "anyway)."
        )
    if mode.one_host and cfg.launch.nnodes > 1:
        raise ConfigError(
            f"pipeline.mode={mode.name} needs every worker on one host (launch.nnodes=1); "
            f"use pipeline.mode={planned_mode()} across machines."
        )
