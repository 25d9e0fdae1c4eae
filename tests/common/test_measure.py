"""measure.StepClock: phase sums on a CPU, and on a GPU a bounded number of CUDA events held
however long the interval between two reads (a fake event stands in for CUDA's here)."""

from __future__ import annotations

import pytest
import torch

from atom_train.common import measure
from atom_train.common.measure import StepClock


class FakeEvent:
    """A CUDA timing event on a fake GPU: `record()` takes the fake GPU's time; the event is
    done when the test says the GPU has got that far."""

    gpu_now = 0.0  # where the fake GPU's work has got to (seconds)
    recorded = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        FakeEvent.recorded += 1
        self.at = FakeEvent.recorded * 0.001  # each phase takes 1 ms of GPU time

    def query(self) -> bool:
        return self.at <= FakeEvent.gpu_now

    def synchronize(self) -> None:
        FakeEvent.gpu_now = max(FakeEvent.gpu_now, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time of an event not yet done"
        return (end.at - self.at) * 1000  # ms, as CUDA reports it


@pytest.fixture
def gpu_clock(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.gpu_now, FakeEvent.recorded = 0.0, 0
    return StepClock(torch.device("cuda"))


def window(clock: StepClock) -> None:
    clock.start()
    clock.mark()  # after compute
    clock.mark()  # after the optimizer


def test_a_gpu_that_keeps_up_leaves_one_window_of_events_held(gpu_clock):
    for _ in range(1000):
        window(gpu_clock)
        FakeEvent.gpu_now = FakeEvent.recorded * 0.001  # the GPU has done all queued work
        assert gpu_clock.pending <= 1
    phases = gpu_clock.read()
    assert phases["compute"] == pytest.approx(1.0) and phases["optimizer"] == pytest.approx(1.0)
    assert gpu_clock.pending == 0 and gpu_clock.read() == {"compute": 0.0, "optimizer": 0.0}


def test_a_gpu_behind_holds_the_windows_it_is_behind_and_at_most_max_pending(gpu_clock):
    for _ in range(10):
        window(gpu_clock)
    FakeEvent.gpu_now = 7 * 3 * 0.001  # the GPU has finished 7 of the 10 windows
    window(gpu_clock)
    assert gpu_clock.pending == 4  # the 3 it is behind, and the window just started
    for _ in range(500):  # a GPU that never catches up: the host waits at MAX_PENDING
        window(gpu_clock)
        assert gpu_clock.pending <= StepClock.MAX_PENDING + 1
    assert sum(gpu_clock.read().values()) == pytest.approx(511 * 2 * 0.001)


def test_cpu_phases_are_summed_between_reads(monkeypatch):
    # perf_counter stood in for by the times of the marks: the sums are exact.
    times = iter([10.0, 10.25, 10.5, 20.0, 20.125, 21.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(times))
    clock = StepClock(torch.device("cpu"))
    for _ in range(2):  # two windows: compute, then optimizer
        clock.start()
        clock.mark()
        clock.mark()
    phases = clock.read()
    assert phases == {"compute": 0.25 + 0.125, "optimizer": 0.25 + 0.875}
    assert clock.pending == 0 and clock.read() == {"compute": 0.0, "optimizer": 0.0}
