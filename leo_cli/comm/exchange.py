"""Exact halo exchange: owners send boundary rows forward, halo gradients flow back.

Legend: N inner rows, H halo rows, S rows this worker sends (sum over peers), F width.
Every exchanger implements `HaloExchanger`; the blocking one here is the exact reference that
every other mode must match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli import kernels


@dataclass
class CommStats:
    """Bytes this worker sent and seconds it spent inside exchanges, since the last reset."""

    bytes_sent: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        self.bytes_sent, self.seconds = 0, 0.0


@dataclass
class HaloPlan:
    """Who sends what: the boundary rows per peer and the halo rows received per peer."""

    num_inner: int
    send_idx_S: Tensor
    send_counts: list[int]
    recv_counts: list[int]
    stats: CommStats = field(default_factory=CommStats)

    @property
    def num_halo(self) -> int:
        return sum(self.recv_counts)


class HaloExchanger(Protocol):
    """Turns this worker's inner rows into `[inner | halo]` rows, differentiably."""

    plan: HaloPlan

    def exchange(self, h_NF: Tensor) -> Tensor: ...


def _all_to_all(
    send: Tensor, send_counts: list[int], recv_counts: list[int], stats: CommStats
) -> Tensor:
    """Uneven all-to-all of rows; counts bytes leaving this worker."""
    recv = send.new_empty((sum(recv_counts), send.shape[1]))
    t0 = time.perf_counter()
    dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts)
    stats.seconds += time.perf_counter() - t0
    stats.bytes_sent += send.numel() * send.element_size()
    return recv


class _BlockingHalo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h_NF: Tensor, plan: HaloPlan) -> Tensor:
        ctx.plan = plan
        send_SF = kernels.gather_rows(h_NF, plan.send_idx_S)
        halo_HF = _all_to_all(send_SF, plan.send_counts, plan.recv_counts, plan.stats)
        return torch.cat([h_NF, halo_HF])

    @staticmethod
    def backward(ctx: Any, grad_full: Tensor) -> tuple[Tensor, None]:
        plan: HaloPlan = ctx.plan
        grad_halo_HF = grad_full[plan.num_inner :]
        back_SF = _all_to_all(grad_halo_HF, plan.recv_counts, plan.send_counts, plan.stats)
        grad_h = grad_full[: plan.num_inner] + kernels.scatter_add_rows(
            back_SF, plan.send_idx_S, plan.num_inner
        )
        return grad_h, None


class BlockingExchanger:
    """Exchange the whole halo, wait, then compute (DGL/PyG-style; the exact reference)."""

    def __init__(self, plan: HaloPlan) -> None:
        self.plan = plan

    def exchange(self, h_NF: Tensor) -> Tensor:
        out: Tensor = _BlockingHalo.apply(h_NF, self.plan)  # type: ignore[no-untyped-call]
        return out


class LocalExchanger:
    """A single worker owns every node: there is no halo."""

    def __init__(self, plan: HaloPlan) -> None:
        assert plan.num_halo == 0, "a single-worker plan has no halo"
        self.plan = plan

    def exchange(self, h_NF: Tensor) -> Tensor:
        return h_NF


def make_exchanger(mode: str, plan: HaloPlan, world_size: int) -> HaloExchanger:
    """The exchanger for `pipeline.mode` (only modes that exist; no silent fallback)."""
    if world_size == 1:
        return LocalExchanger(plan)
    if mode == "blocking":
        return BlockingExchanger(plan)
    raise NotImplementedError(f"pipeline.mode={mode!r} has no exchanger yet")
