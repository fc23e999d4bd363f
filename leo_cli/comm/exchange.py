"""Moving halo rows between workers: who sends what (HaloPlan), bulk and chunked transfers.

Legend: N inner rows, H halo rows, S rows this worker sends (sum over peers), F width.
The bulk all-to-all and the chunked point-to-point transfers here serve the transports of
comm/transport.py (and set-up fetches). Both count bytes and time: `wait_s` is time this worker
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
from leo_cli.comm.dist import all_reduce_


def _cuda_event() -> Any:
    """A timing event recorded now on the current CUDA stream."""
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _elapsed_s(start: Any, end: Any) -> float:
    """Seconds between two recorded events (waits for `end` only if it is still pending)."""
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


@dataclass
class CommStats:
    """Bytes this worker sent and seconds it spent on transfers, since the last reset.

    On CUDA a collective's return is only its enqueue, so times are taken with CUDA events on
    the compute stream: a wait from before to after the point where the stream waits for the
    transfer, a transfer from where its rows were posted (`mark`) to where the stream may use
    what arrived (`add_transfer`). `settle()` folds them into `wait_s` and `transfer_s` once per
    step, after the step's clock has waited for the device, so it waits for nothing itself.
    """

    bytes_sent: int = 0
    # Rows read in place from peers' published rows (per reading edge) and the gradients
    # published for their owners (comm/inplace.py); not part of bytes_sent.
    published_bytes: int = 0
    wait_s: float = 0.0
    transfer_s: float = 0.0
    _events: list[tuple[Any, Any]] = field(default_factory=list, repr=False)
    _transfers: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    def reset(self) -> None:
        self.bytes_sent, self.published_bytes, self.wait_s, self.transfer_s = 0, 0, 0.0, 0.0
        self._events.clear()
        self._transfers.clear()

    @property
    def remote_bytes(self) -> int:
        """Every remote byte, whichever transport moved it."""
        return self.bytes_sent + self.published_bytes

    @contextmanager
    def waiting(self, device: torch.device) -> Iterator[None]:
        """Time a wait: wall clock on the CPU, stream time (CUDA events) on GPUs."""
        if device.type == "cuda":
            start = _cuda_event()
            yield
            self._events.append((start, _cuda_event()))
            return
        t0 = time.perf_counter()
        yield
        self.wait_s += time.perf_counter() - t0

    def mark(self, device: torch.device) -> Any:
        """Where a transfer starts, for `add_transfer`: the wall clock, or a CUDA event."""
        return _cuda_event() if device.type == "cuda" else time.perf_counter()

    def add_transfer(self, start: Any, device: torch.device) -> None:
        """Account a transfer that began at `start` (a `mark`) and has landed by now."""
        if device.type == "cuda":
            self._transfers.append((start, _cuda_event()))
        else:
            self.transfer_s += time.perf_counter() - start

    def settle(self) -> None:
        """Fold pending CUDA event timings into wait_s and transfer_s."""
        self.wait_s += sum(_elapsed_s(start, end) for start, end in self._events)
        self.transfer_s += sum(_elapsed_s(start, end) for start, end in self._transfers)
        self._events.clear()
        self._transfers.clear()


@dataclass(frozen=True)
class HaloPlan:
    """Who sends what: the boundary rows per peer and the halo rows received per peer.

    Immutable: views of the halo (comm/views.py) are new plans; what moved and how long it
    took is counted by the aggregator that moves the rows (its transport's `CommStats`).
    """

    num_inner: int
    send_idx_S: Tensor
    send_counts: list[int]
    recv_counts: list[int]

    @property
    def num_halo(self) -> int:
        return sum(self.recv_counts)

    def send_offsets(self) -> list[int]:
        return offsets(self.send_counts)

    def recv_offsets(self) -> list[int]:
        return offsets(self.recv_counts)


def distinct_rows(rows: Tensor, num_rows: int) -> Tensor:
    """The distinct ids among `rows` (all in 0..num_rows-1), sorted (int64): the values
    `torch.unique` gives, by a mark per row instead of a sort."""
    mark = torch.zeros(num_rows, dtype=torch.bool, device=rows.device)
    mark[rows] = True
    return torch.nonzero(mark).squeeze(1)


def offsets(counts: list[int]) -> list[int]:
    """Prefix sums: where each count's block starts (and, last, the total)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def all_to_all_rows(
    send_SF: Tensor,
    send_counts: list[int],
    recv_counts: list[int],
    stats: CommStats,
    out: Tensor | None = None,
) -> Tensor:
    """Uneven all-to-all of rows, waited for at once, into `out` where given (contiguous,
    `sum(recv_counts)` rows); counts bytes leaving this worker."""
    recv = send_SF.new_empty((sum(recv_counts), send_SF.shape[1])) if out is None else out
    t0 = stats.mark(send_SF.device)
    with stats.waiting(send_SF.device):
        dist.all_to_all_single(recv, send_SF.contiguous(), recv_counts, send_counts)
    stats.add_transfer(t0, send_SF.device)
    stats.bytes_sent += send_SF.numel() * send_SF.element_size()
    return recv


# A set-up fetch moves about this many bytes a worker, each way, in one all-to-all
# (`fetch_halo`).
FETCH_ROUND_BYTES = 16 * 2**20


def chunk_bounds(num_rows: int, num_chunks: int) -> list[int]:
    """`num_chunks + 1` boundaries cutting `num_rows` rows into near-equal chunks.

    Chunks may be empty when there are more chunks than rows; every worker computes the same
    boundaries from the same counts, so senders and receivers agree without talking.
    """
    return [num_rows * c // num_chunks for c in range(num_chunks + 1)]


def fetch_halo(h_NF: Tensor, plan: HaloPlan, out: Tensor | None = None) -> Tensor:
    """The halo rows alone, (H x F), not differentiable, into `out` where given (H contiguous
    rows, e.g. the tail of a buffer that holds the inner rows before them): for set-up
    fetches (training moves rows through the transports of comm/transport.py, which count
    them).

    Collective. The rows go in as many all-to-alls as the worker sending or receiving the
    most needs to move about `FETCH_ROUND_BYTES` each way in each (every peer's rows cut
    alike on both sides, `chunk_bounds`): the rows sent are gathered one round at a time,
    never all at once beside the halo they fill; with one round they land in `out` as they
    arrive, with more each round's rows are copied to their place."""
    row = h_NF.shape[1] * h_NF.element_size()
    recv = h_NF.new_empty((plan.num_halo, h_NF.shape[1])) if out is None else out
    assert recv.is_contiguous() and recv.shape[0] == plan.num_halo, "a contiguous H-row buffer"
    moved = max(sum(plan.send_counts), plan.num_halo) * row
    need = torch.tensor([-(-moved // FETCH_ROUND_BYTES)], device=h_NF.device)
    rounds = max(int(all_reduce_(need, op="max").item()), 1)
    if rounds == 1:
        send_SF = kernels.gather_rows(h_NF, plan.send_idx_S)
        return all_to_all_rows(send_SF, plan.send_counts, plan.recv_counts, CommStats(), recv)
    sends = [chunk_bounds(c, rounds) for c in plan.send_counts]
    recvs = [chunk_bounds(c, rounds) for c in plan.recv_counts]
    send_at, recv_at = plan.send_offsets(), plan.recv_offsets()
    for r in range(rounds):
        cuts = zip(send_at[:-1], sends, strict=True)
        rows_S = torch.cat([plan.send_idx_S[o + b[r] : o + b[r + 1]] for o, b in cuts])
        got = all_to_all_rows(
            kernels.gather_rows(h_NF, rows_S),
            [b[r + 1] - b[r] for b in sends],
            [b[r + 1] - b[r] for b in recvs],
            CommStats(),
        )
        start = 0
        for o, b in zip(recv_at[:-1], recvs, strict=True):
            recv[o + b[r] : o + b[r + 1]] = got[start : start + b[r + 1] - b[r]]
            start += b[r + 1] - b[r]
        del got, rows_S  # the next round's buffers take their place
    return recv


def halo_ids(plan: HaloPlan, ids_N: Tensor) -> Tensor:
    """`[ids | ids of the halo rows]`: what each row's owner calls it (int64, no autograd).

    Attention dropout keys every edge by the global ids of both ends; a view of the halo
    (rows fetched per edge) learns its columns' ids through the same exchange as its rows.
    """
    send_S1 = ids_N.index_select(0, plan.send_idx_S).unsqueeze(1)
    halo_H1 = all_to_all_rows(send_S1, plan.send_counts, plan.recv_counts, CommStats())
    return torch.cat([ids_N, halo_H1.squeeze(1)])


class Transfer:
    """Rounds of chunks in flight between this worker and its peers (one exchange of a layer).

    A round is one chunk per peer, posted as one batch of receives and sends: NCCL needs a
    pair's sends and receives grouped, or both sides block on their receives. Rounds are
    posted as soon as their rows exist; `wait(r)` blocks until round r has landed (its sends
    done too) and returns its receive buffers; `finish()` closes the exchange. Both sides of a
    pair list their rounds in the same order (they cut the same counts the same way); empty
    chunks are skipped on both sides.
    """

    def __init__(self, stats: CommStats, device: torch.device) -> None:
        self.stats, self.device = stats, device
        self.rounds: list[tuple[list[Any], list[Tensor], list[Tensor]]] = []
        self.posted_at = stats.mark(device)
        self.moved = False  # whether any round posted rows (every row may be read in place)

    def post(self, recvs: list[tuple[int, Tensor]], sends: list[tuple[int, Tensor]]) -> None:
        """Post one round: receive into each (peer, buffer), send each (peer, rows)."""
        sent = [(peer, rows.contiguous()) for peer, rows in sends if rows.numel() > 0]
        ops = [dist.P2POp(dist.irecv, buf, peer) for peer, buf in recvs if buf.numel() > 0]
        ops += [dist.P2POp(dist.isend, rows, peer) for peer, rows in sent]
        works = dist.batch_isend_irecv(ops) if ops else []
        self.moved = self.moved or bool(ops)
        self.stats.bytes_sent += sum(rows.numel() * rows.element_size() for _, rows in sent)
        self.rounds.append((works, [buf for _, buf in recvs], [rows for _, rows in sent]))

    def wait(self, r: int) -> list[Tensor]:
        """Round r's receive buffers, once it has landed."""
        works, buffers, _ = self.rounds[r]
        with self.stats.waiting(self.device):
            for work in works:
                work.wait()
        return buffers

    def finish(self) -> None:
        """Every round has been waited for: account the exchange (an exchange that moved
        nothing took no transfer time, however long the work it spans), release send buffers."""
        if self.moved:
            self.stats.add_transfer(self.posted_at, self.device)
        self.rounds.clear()
