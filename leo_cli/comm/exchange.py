"""Moving halo rows between workers: who sends what (HaloPlan), bulk and chunked transfers.

Legend: N inner rows, H halo rows, S rows this worker sends (sum over peers), F width.
The bulk all-to-all here is the exact reference (`blocking`); the chunked point-to-point
transfers serve the pipelined mode. Both count bytes and time: `wait_s` is time this worker
sat waiting for a transfer (exposed), `transfer_s` the time from posting a transfer to seeing
it complete (hidden + exposed; an upper bound, since completion is only observed at a wait).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli import kernels


@dataclass
class CommStats:
    """Bytes this worker sent and seconds it spent on transfers, since the last reset.

    On CUDA a collective's return is only its enqueue; waits are then timed with CUDA events
    around the point where the compute stream waits, and settled by `settle()`.
    """

    bytes_sent: int = 0
    wait_s: float = 0.0
    transfer_s: float = 0.0
    _events: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    def reset(self) -> None:
        self.bytes_sent, self.wait_s, self.transfer_s = 0, 0.0, 0.0
        self._events.clear()

    @contextmanager
    def waiting(self, device: torch.device) -> Iterator[None]:
        """Time a wait: wall clock on the CPU, stream time (CUDA events) on GPUs."""
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            yield
            end.record()
            self._events.append((start, end))
            return
        t0 = time.perf_counter()
        yield
        self.wait_s += time.perf_counter() - t0

    def settle(self) -> None:
        """Fold pending CUDA event timings into wait_s (synchronises with the device)."""
        for start, end in self._events:
            end.synchronize()
            self.wait_s += start.elapsed_time(end) / 1000.0
        self._events.clear()


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

    @property
    def device(self) -> torch.device:
        return self.send_idx_S.device

    def send_offsets(self) -> list[int]:
        return _offsets(self.send_counts)

    def recv_offsets(self) -> list[int]:
        return _offsets(self.recv_counts)


def _offsets(counts: list[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def all_to_all_rows(
    send_SF: Tensor, send_counts: list[int], recv_counts: list[int], stats: CommStats
) -> Tensor:
    """Uneven all-to-all of rows, waited for at once; counts bytes leaving this worker."""
    recv = send_SF.new_empty((sum(recv_counts), send_SF.shape[1]))
    t0 = time.perf_counter()
    with stats.waiting(send_SF.device):
        dist.all_to_all_single(recv, send_SF.contiguous(), recv_counts, send_counts)
    stats.transfer_s += time.perf_counter() - t0
    stats.bytes_sent += send_SF.numel() * send_SF.element_size()
    return recv


class _BlockingHalo(torch.autograd.Function):
    """h -> [h | halo(h)]: forward sends boundary rows, backward returns halo gradients."""

    @staticmethod
    def forward(ctx: Any, h_NF: Tensor, plan: HaloPlan) -> Tensor:
        ctx.plan = plan
        send_SF = kernels.gather_rows(h_NF, plan.send_idx_S)
        halo_HF = all_to_all_rows(send_SF, plan.send_counts, plan.recv_counts, plan.stats)
        return torch.cat([h_NF, halo_HF])

    @staticmethod
    def backward(ctx: Any, grad_full: Tensor) -> tuple[Tensor, None]:
        plan: HaloPlan = ctx.plan
        grad_halo_HF = grad_full[plan.num_inner :]
        back_SF = all_to_all_rows(grad_halo_HF, plan.recv_counts, plan.send_counts, plan.stats)
        grad_h = grad_full[: plan.num_inner] + kernels.scatter_add_rows(
            back_SF, plan.send_idx_S, plan.num_inner
        )
        return grad_h, None


def exchange_halo(h_NF: Tensor, plan: HaloPlan) -> Tensor:
    """`[h | halo]` rows, differentiably: the whole halo in one all-to-all."""
    out: Tensor = _BlockingHalo.apply(h_NF, plan)  # type: ignore[no-untyped-call]
    return out


class Transfer:
    """Chunks in flight between this worker and its peers (one exchange of one layer).

    Receives are posted first (`expect`), sends as soon as their rows exist (`send`);
    `wait(i)` blocks until the i-th expected chunk has landed, `finish()` until every send is
    done (send buffers stay alive until then). Chunks between a pair of workers are matched
    in posting order, so both sides list them in the same order (they cut the same counts
    the same way). Empty chunks are skipped on both sides.
    """

    def __init__(self, stats: CommStats, device: torch.device) -> None:
        self.stats, self.device = stats, device
        self.recv_buffers: list[Tensor] = []
        self.recv_works: list[Any] = []
        self.send_works: list[Any] = []
        self.sent_buffers: list[Tensor] = []
        self.posted_at = time.perf_counter()

    def expect(self, peer: int, buf: Tensor) -> None:
        self.recv_buffers.append(buf)
        self.recv_works.append(dist.irecv(buf, peer) if buf.numel() > 0 else None)

    def send(self, peer: int, rows: Tensor) -> None:
        if rows.numel() == 0:
            return
        rows = rows.contiguous()
        self.send_works.append(dist.isend(rows, peer))
        self.sent_buffers.append(rows)
        self.stats.bytes_sent += rows.numel() * rows.element_size()

    def wait(self, i: int) -> Tensor:
        """The i-th expected chunk, once it has landed."""
        with self.stats.waiting(self.device):
            if self.recv_works[i] is not None:
                self.recv_works[i].wait()
        return self.recv_buffers[i]

    def finish(self) -> None:
        with self.stats.waiting(self.device):
            for work in self.send_works:
                work.wait()
        self.stats.transfer_s += time.perf_counter() - self.posted_at
        self.sent_buffers.clear()
