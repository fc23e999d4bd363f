"""How halo rows and their gradients move between workers: one transport per pipeline mode.

The aggregation is the same in every mode (comm/aggregate.py); a transport only moves what its
column blocks read: `PointToPoint` (leo), `AllToAll` (blocking, fine-grained), `NoTransfer`
(compute-only, one worker) and `SharedMemory` (comm/shm.py). Every `send_*` returns a `Pending`
whose `wait(r)` gives round r's buffers; each transport counts what it moved and how long it
waited in its `CommStats`.

Specification: docs/design/aggregation.md.
Legend: N inner rows, H halo rows, S rows sent (sum over peers), F width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from torch import Tensor

from leo_cli import kernels
from leo_cli.comm.blocks import Chunk, Schedule
from leo_cli.comm.exchange import CommStats, HaloPlan, Transfer, all_to_all_rows

GradOf = Callable[[Chunk], Tensor]  # the gradient of a chunk's halo rows (rows x F)


class Pending(Protocol):
    """Rows on their way: `wait(r)` gives round r's buffers (one per chunk, in order; a
    transport may make each only when the caller reaches it)."""

    def wait(self, r: int) -> Iterable[Tensor]: ...

    def finish(self) -> None: ...


class Transport(Protocol):
    """Moves the rows of a schedule (see the module docstring)."""

    stats: CommStats

    def send_rows(self, rows_XF: Tensor, sched: Schedule, by_position: bool) -> Pending:
        """Send each chunk's rows (`rows_XF[send_idx]`, or `[send_pos]` when `rows_XF` holds
        the boundary rows only) and receive the halo rows."""
        ...

    def send_grads(self, sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Pending:
        """Send the gradient of every received chunk to its owner, receive those of the rows
        this worker sent (`like_F`: dtype, device and width of the gradients)."""
        ...


class Landed:
    """A transfer that has completed: its buffers, round by round."""

    def __init__(self, rounds: list[list[Tensor]]) -> None:
        self.rounds = rounds

    def wait(self, r: int) -> list[Tensor]:
        return self.rounds[r]

    def finish(self) -> None:
        pass


def halo_slices(halo_HF: Tensor, sched: Schedule) -> Landed:
    """Each chunk's rows of a whole halo buffer."""
    return Landed([[halo_HF[c.recv_start : c.recv_end] for c in chunks] for chunks in sched.rounds])


def sent_slices(rows_SF: Tensor, sched: Schedule) -> Landed:
    """Each chunk's rows of a buffer laid out as the plan's `send_idx_S`."""
    return Landed([[rows_SF[c.send_start : c.send_end] for c in chunks] for chunks in sched.rounds])


def halo_grads(sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Tensor:
    """The gradient of every halo row as one (H x F) buffer, each chunk's written into its
    rows as it is computed: one chunk's gradient alive beside the buffer, not every chunk's
    beside their concatenation."""
    halo_HF = like_F.new_empty((sched.num_halo, like_F.shape[1]))
    for chunks in sched.rounds:
        for c in chunks:
            halo_HF[c.recv_start : c.recv_end] = grad_of(c)
    return halo_HF


class PointToPoint:
    """Chunks posted round by round with isend/irecv, waited for round by round (leo)."""

    def __init__(self, plan: HaloPlan, stats: CommStats) -> None:
        self.stats = stats

    def send_rows(self, rows_XF: Tensor, sched: Schedule, by_position: bool) -> Transfer:
        transfer = Transfer(self.stats, rows_XF.device)
        halo_HF = rows_XF.new_empty((sched.num_halo, rows_XF.shape[1]))
        for chunks in sched.rounds:
            recvs = [(c.peer, halo_HF[c.recv_start : c.recv_end]) for c in chunks]
            sends = [
                (c.peer, kernels.gather_rows(rows_XF, c.send_pos if by_position else c.send_idx))
                for c in chunks
            ]
            transfer.post(recvs, sends)
        return transfer

    def send_grads(self, sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Transfer:
        transfer = Transfer(self.stats, like_F.device)
        width = like_F.shape[1]
        for chunks in sched.rounds:
            recvs = [(c.peer, like_F.new_empty((c.num_send, width))) for c in chunks]
            transfer.post(recvs, [(c.peer, grad_of(c)) for c in chunks])
        return transfer


class AllToAll:
    """The whole halo in one all-to-all, waited for at once (blocking, fine-grained).

    One chunk per peer: the collective's buffers are laid out as the plan's send and receive
    lists, which a schedule of one chunk per peer follows.
    """

    def __init__(self, plan: HaloPlan, stats: CommStats) -> None:
        self.plan, self.stats = plan, stats

    def send_rows(self, rows_XF: Tensor, sched: Schedule, by_position: bool) -> Landed:
        assert sched.num_chunks == 1 and not by_position, "all-to-all moves one chunk per peer"
        send_SF = kernels.gather_rows(rows_XF, self.plan.send_idx_S)
        plan = self.plan
        return halo_slices(
            all_to_all_rows(send_SF, plan.send_counts, plan.recv_counts, self.stats), sched
        )

    def send_grads(self, sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Landed:
        assert sched.num_chunks == 1, "all-to-all moves one chunk per peer"
        back_HF = halo_grads(sched, grad_of, like_F)
        plan = self.plan
        return sent_slices(
            all_to_all_rows(back_HF, plan.recv_counts, plan.send_counts, self.stats), sched
        )


class NoTransfer:
    """Nothing moves (compute-only; a single worker has nothing to move): halo rows and the
    gradients returned to this worker's rows are zeros. The halo gradients are still computed,
    as the exact modes compute them."""

    def __init__(self, plan: HaloPlan, stats: CommStats) -> None:
        self.stats = stats
        self.num_send = int(plan.send_idx_S.shape[0])

    def send_rows(self, rows_XF: Tensor, sched: Schedule, by_position: bool) -> Landed:
        return halo_slices(rows_XF.new_zeros((sched.num_halo, rows_XF.shape[1])), sched)

    def send_grads(self, sched: Schedule, grad_of: GradOf, like_F: Tensor) -> Landed:
        for chunks in sched.rounds:
            for c in chunks:
                grad_of(c)
        return sent_slices(like_F.new_zeros((self.num_send, like_F.shape[1])), sched)
