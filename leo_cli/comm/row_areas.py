"""Where published rows live (comm/published.py): the readiness counters always stay in host
memory (a /dev/shm segment per worker, polled by the CPU); the row copies live where the
workers compute.

CPU workers (`HostAreas`) keep the rows in the segment, after the counters; CUDA workers
(`PeerDeviceAreas`) keep them in GPU memory that every same-host peer maps through PyTorch's
symmetric memory. `fence()` waits for the stream's copies and kernels before a sequence number
is published and before a read is acknowledged.

Specification: docs/design/published-rows.md.
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
        host (this worker's included), by global rank. A failure on any rank stops every rank
        with its sentence (none is left waiting in a collective)."""
        from torch.distributed import _symmetric_memory as symm_mem

        self.device = device
        members = sorted(sizes)
        group = host_group(members)
        size = max(1, *sizes.values())  # the same on every member; never an empty one
        self.buffer = torch.empty(0, dtype=torch.uint8)
        problem = ""
        try:
            self.buffer = symm_mem.empty(size, dtype=torch.uint8, device=device)
        except Exception as exc:  # any failure: every rank must hear of it
            problem = first_line(exc)
        stop_together(problem)
        self.areas: dict[int, Tensor] = {}
        try:
            with warnings.catch_warnings():  # needed before torch 2.8, deprecated after
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group.group_name)
            self.handle = symm_mem.rendezvous(self.buffer, group)  # keeps the mappings alive
            self.areas = {q: self._peer(i, sizes[q]) for i, q in enumerate(members)}
        except Exception as exc:  # as above
            problem = first_line(exc)
        stop_together(problem)

    def _peer(self, group_rank: int, size: int) -> Tensor:
        """The buffer of a member, from its start (`get_remote_tensor` where this torch has
        it; else `get_buffer`, whose offset counts from the allocation: checked to be ours)."""
        remote = getattr(self.handle, "get_remote_tensor", None)
        if remote is not None:
            return remote(group_rank, (size,), torch.uint8)  # type: ignore[no-any-return]
        view = self.handle.get_buffer(group_rank, (size,), torch.uint8, 0)
        if group_rank == self.handle.rank and view.data_ptr() != self.buffer.data_ptr():
            raise RuntimeError("symmetric memory placed this worker's rows at an offset")
        return view

    def area(self, q: int) -> Tensor:
        return self.areas[q]

    def fence(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type where it has none)."""
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def stop_together(
    problem: str,
    what: str = "their host's GPUs' published rows",
    fix: str = "use pipeline.transport=process-group",
) -> None:
    """Every rank learns whether any failed to map `what` (its `problem`, empty where none),
    and all stop alike with the sentence (ending in `fix`): no rank is left waiting in a
    collective."""
    problems: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    bad = [q for q, p in enumerate(problems) if p]
    if bad:
        raise TrainError(f"workers {bad} cannot map {what} ({problems[bad[0]]}); {fix}.")
