"""Process-group setup and teardown for workers started by torchrun / the elastic agent."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from leo_cli.config.schema import LaunchConfig


@dataclass(frozen=True)
class DistEnv:
    """Where this worker sits: global rank, world size, local rank, restart attempt."""

    rank: int
    world_size: int
    local_rank: int
    restart: int
    local_world_size: int = 1

    @classmethod
    def from_env(cls) -> DistEnv:
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )


def pick_backend(device: torch.device, backend: str) -> str:
    """The process group's backend, as torch's per-device map when it needs one.

    `auto` means nccl on CUDA, gloo on CPU. NCCL serves only CUDA tensors, but small CPU
    tensors (start-up checks, epoch statistics, evaluation counts) go through collectives too:
    with NCCL, gloo serves the CPU ones (`cpu:gloo,cuda:nccl`). Gloo alone serves both devices.
    """
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def init_process_group(
    env: DistEnv,
    backend: str,
    timeout_s: float,
    device: torch.device | None = None,
    prefix: str = "leo/attempt",
) -> Any:
    """Join the group through the rendezvous store, namespaced by the restart attempt (and
    `prefix`: another group of the same processes uses its own); returns that namespaced
    store, for keys of the group's own.

    A restarted group must not read the addresses the dead attempt left in the shared store
    (pytorch/pytorch#135712), so every attempt gets its own key prefix. On a CUDA `device` the
    group is bound to it (`device_id`): NCCL then builds its communicator here, with every rank
    present, instead of lazily at the first CUDA collective, where a rank with nothing to send
    in the first round of point-to-point transfers would leave the others creating it alone
    (undefined per torch's `batch_isend_irecv` docs: a possible hang).
    """
    timeout = timedelta(seconds=timeout_s)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    store = dist.TCPStore(  # type: ignore[attr-defined]
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=env.world_size,
        is_master=env.rank == 0 and not agent_store,
        timeout=timeout,
        wait_for_workers=False,
    )
    prefixed = dist.PrefixStore(f"{prefix}{env.restart}", store)  # type: ignore[attr-defined]
    device_id = device if device is not None and device.type == "cuda" else None
    dist.init_process_group(
        backend,
        store=prefixed,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=device_id,
    )
    return prefixed


def all_reduce_(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce when a group exists; identity in a single process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


def all_gather_(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t` (equal shapes), stacked by rank: `[world_size, *t.shape]`."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return t.unsqueeze(0).clone()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return torch.stack(out)


def uses_cuda(launch: LaunchConfig) -> bool:
    """Whether the workers will train on CUDA devices (as this process sees them)."""
    return launch.device == "cuda" or (launch.device == "auto" and torch.cuda.is_available())
