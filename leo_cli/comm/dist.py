"""Process-group setup and teardown for workers started by torchrun / the elastic agent."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


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
    """`auto` means nccl on CUDA, gloo on CPU."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(env: DistEnv, backend: str, timeout_s: float) -> None:
    """Join the group through the rendezvous store, namespaced by the restart attempt.

    A restarted group must not read the addresses the dead attempt left in the shared store
    (pytorch/pytorch#135712), so every attempt gets its own key prefix.
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
    prefixed = dist.PrefixStore(f"leo/attempt{env.restart}", store)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend, store=prefixed, rank=env.rank, world_size=env.world_size, timeout=timeout
    )


def all_reduce_(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce when a group exists; identity in a single process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t
