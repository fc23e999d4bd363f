"""Where published rows live (comm/published.py): the readiness counters always stay in host
memory (a /dev/shm segment per worker, polled by the CPU); the row copies live where the
workers compute.

- CPU workers (`HostAreas`): in the same segment, after the counters.
- CUDA workers (`PeerDeviceAreas`): in GPU memory, one buffer per worker, which every
  same-host peer maps into its own address space through PyTorch's symmetric memory
  (`torch.distributed._symmetric_memory`: `empty`, `rendezvous`, `get_buffer`), so the
  aggregation's kernels read a peer GPU's rows in place, over NVLink or PCIe peer access.

A GPU writes and reads asynchronously, on its stream: a worker's `copy_` into its rows, or a
kernel reading a peer's, has only been enqueued when the call returns. So the protocol calls
`fence()` before it publishes a sequence number (the rows must be in memory before a reader
is told so) and before it acknowledges a read (the kernel must be done with the copy before
its owner may overwrite it). On the CPU a fence has nothing to wait for.

This path has been compiled and emulated on the CPU only (tests/comm/test_row_areas.py
stages every write until the fence, as a stream would, and checks where the fences fall);
`scripts/gpu-check-train.sh` runs it on two GPUs, against one process.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from leo_cli.errors import TrainError


class RowAreas(Protocol):
    """The row copies of this worker and of the same-host peers it maps."""

    def area(self, q: int) -> Tensor:
        """Worker q's row copies as bytes (uint8), addressable by this worker."""
        ...

    def fence(self) -> None:
        """Return once this worker's writes and reads of row areas issued so far are done."""
        ...


class HostAreas:
    """Row copies in the host segments, after the counters (CPU workers)."""

    def __init__(self, segments: dict[int, Tensor], header_bytes: dict[int, int]) -> None:
        self.areas = {q: seg[header_bytes[q] :] for q, seg in segments.items()}

    def area(self, q: int) -> Tensor:
        return self.areas[q]

    def fence(self) -> None:
        """CPU copies and SpMMs are done when they return."""


def peer_memory_available() -> bool:
    """Whether this torch can map a peer GPU's buffers (symmetric memory, CUDA)."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
    except ImportError:
        return False
    return True


def host_group(members: list[int]) -> Any:
    """The process group of this worker's host (`members`, sorted global ranks). Collective:
    every rank creates every host's group, in the same order, as `new_group` requires."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, members)
    mine = None
    for group_ranks in sorted({tuple(m) for m in everyone}):
        group = dist.new_group(list(group_ranks))
        if list(group_ranks) == members:
            mine = group
    return mine


class PeerDeviceAreas:
    """Row copies in GPU memory, mapped by the host's peers (PyTorch's symmetric memory).

    Symmetric memory needs the same allocation on every member, so each worker allocates the
    largest of its host's row areas; `area(q)` views q's buffer at q's own size.
    """

    def __init__(self, sizes: dict[int, int], device: torch.device) -> None:
        """Collective over every rank. `sizes`: bytes of the row area of every worker on this
        host (this worker's included), by global rank."""
        from torch.distributed import _symmetric_memory as symm_mem

        self.device = device
        members = sorted(sizes)
        group = host_group(members)
        size = max(1, *sizes.values())  # the same on every member; never an empty one
        self.buffer = symm_mem.empty(size, dtype=torch.uint8, device=device)
        try:
            with warnings.catch_warnings():  # needed before torch 2.8, deprecated after
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group.group_name)
            handle = symm_mem.rendezvous(self.buffer, group)
        except RuntimeError as exc:
            raise TrainError(
                f"the GPUs of this host cannot map each other's published rows "
                f"({str(exc).splitlines()[0]}); use pipeline.transport=process-group."
            ) from exc
        self.handle = handle  # keeps every peer's mapping alive
        self.areas = {
            q: handle.get_buffer(i, (sizes[q],), torch.uint8, 0) for i, q in enumerate(members)
        }

    def area(self, q: int) -> Tensor:
        return self.areas[q]

    def fence(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()
