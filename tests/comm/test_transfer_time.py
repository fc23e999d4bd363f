"""`comm_transfer_s` counts exchanges that moved rows: with every row read in place the
pipelined transport's exchanges post nothing, and the computation they span is not a transfer
(leo showed 0.35 s of "transfer" a step on the default bench graph with nothing sent)."""

from __future__ import annotations

import time

import torch

from leo_cli.comm.exchange import CommStats, Transfer


def test_an_exchange_that_moves_nothing_takes_no_transfer_time() -> None:
    stats = CommStats()
    transfer = Transfer(stats, torch.device("cpu"))
    empty = torch.zeros(0, 4)
    transfer.post([(1, empty)], [(1, empty)])  # every row read in place: nothing to move
    time.sleep(0.02)  # the computation the exchange overlaps
    assert transfer.wait(0) == [empty]
    transfer.finish()
    assert stats.transfer_s == 0.0 and stats.bytes_sent == 0
