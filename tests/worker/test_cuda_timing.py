"""Step and transfer times on CUDA come from events on the compute stream, read with one wait
per step (no GPU here: torch.cuda.Event is replaced by an event on a simulated stream clock,
and a device-wide synchronize fails the test)."""

from __future__ import annotations

import pytest
import torch

from leo_cli.comm.exchange import CommStats
from leo_cli.worker.step import PhaseClock

CUDA = torch.device("cuda", 0)


class StreamClock:
    """Simulated GPU time, and how often anything waited for it."""

    def __init__(self) -> None:
        self.now = 0.0  # seconds
        self.event_waits = 0


class FakeEvent:
    """torch.cuda.Event on the simulated clock: record() stamps the current stream time."""

    clock = StreamClock()

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "elapsed_time needs timing events"
        self.at: float | None = None

    def record(self, stream: object = None) -> None:
        self.at = self.clock.now

    def synchronize(self) -> None:
        self.clock.event_waits += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None, "event never recorded"
        return (end.at - self.at) * 1000.0  # milliseconds, as torch's


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> StreamClock:
    FakeEvent.clock = StreamClock()
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    def no_device_sync(device: object = None) -> None:
        raise AssertionError("torch.cuda.synchronize: a device-wide wait")

    monkeypatch.setattr(torch.cuda, "synchronize", no_device_sync)
    return FakeEvent.clock


def test_phase_times_come_from_events_with_one_wait_per_step(clock: StreamClock) -> None:
    phases = PhaseClock(CUDA)
    for name, seconds in [("forward_s", 0.5), ("backward_s", 1.25), ("allreduce_s", 0.25)]:
        clock.now += seconds
        phases.stamp(name)
    clock.now += 0.125
    phases.stamp("optimizer_s")
    assert clock.event_waits == 0  # stamping never waits for the device
    assert phases.phases == {
        "forward_s": 0.5,
        "backward_s": 1.25,
        "allreduce_s": 0.25,
        "optimizer_s": 0.125,
    }
    assert phases.total() == 2.125
    assert clock.event_waits == 1


def test_cpu_phases_are_wall_clock() -> None:
    phases = PhaseClock(torch.device("cpu"))
    phases.stamp("forward_s")
    phases.stamp("backward_s")
    assert set(phases.phases) == {"forward_s", "backward_s"}
    assert phases.total() == pytest.approx(sum(phases.phases.values()))


def test_transfer_time_spans_posting_to_landing_on_the_stream(clock: StreamClock) -> None:
    stats = CommStats()
    posted = stats.mark(CUDA)
    clock.now += 0.75  # compute that the transfer hides behind
    with stats.waiting(CUDA):
        clock.now += 0.25  # the stream waits for the rows
    stats.add_transfer(posted, CUDA)
    assert (stats.wait_s, stats.transfer_s) == (0.0, 0.0)  # nothing read before settle()
    stats.settle()
    assert (stats.wait_s, stats.transfer_s) == (0.25, 1.0)
    stats.settle()  # settled once only
    assert (stats.wait_s, stats.transfer_s) == (0.25, 1.0)
    stats.reset()
    assert (stats.wait_s, stats.transfer_s, stats.bytes_sent) == (0.0, 0.0, 0)


def test_cpu_transfers_are_wall_clock() -> None:
    stats = CommStats()
    posted = stats.mark(torch.device("cpu"))
    stats.add_transfer(posted, torch.device("cpu"))
    assert stats.transfer_s >= 0.0
