"""WindowPrefetcher: the windows, masks and states a direct read of the stream gives; where
the loader thread's time goes (its own work apart from its wait for the device); the end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.loader_state import same_state

from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.data.synthetic import synthetic_text
from atom_train.model.lockstep import WindowSchedule
from atom_train.model.reference import draw_masks
from atom_train.trainer import prefetch as prefetch_module
from atom_train.trainer.prefetch import MaskDrawer, WindowPrefetcher

B, P = 5, 0.25


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_bytes(synthetic_text(20_000, seed=3))
    return ByteCorpus(str(path))


def prefetcher(corpus, total, compact=False, seed=7):
    sched = WindowSchedule(16, 40, total)  # cuts at 16, 32, 40, 48, ...
    drawer = MaskDrawer(torch.Generator().manual_seed(seed), P, B, 0, B)
    stream = BatchedByteStream(corpus, B, offsets=11, threads=1)
    return WindowPrefetcher(
        stream, 0, total, sched.cut, sched.K, torch.device("cpu"), compact, drawer
    )


@pytest.mark.parametrize("compact", [False, True])
def test_windows_masks_and_states_are_a_direct_read_of_the_stream(corpus, compact):
    direct = BatchedByteStream(corpus, B, offsets=11, threads=1)
    gen = torch.Generator().manual_seed(7)
    pf = prefetcher(corpus, 80, compact)
    try:
        t = 0
        while t < 80:
            w = pf.get()
            assert w.tick0 == t
            _, feats, tgt = (direct.next_window_ids if compact else direct.next_window)(w.K)
            masks = draw_masks(torch.empty(w.K, B), P, gen)
            assert np.array_equal(w.feats.numpy(), feats) and np.array_equal(w.tgt.numpy(), tgt)
            assert torch.equal(w.masks, masks)
            assert same_state(w.loader_snapshot.state_dict(), direct.state_dict())
            assert torch.equal(w.dropout_state, gen.get_state())
            assert w.loader_busy_s > 0 and w.gpu_wait_s >= 0 and w.waited_s >= 0
            pf.release(w)
            t += w.K
        assert t == 80
    finally:
        pf.close()


class _Clock:
    """A stand-in for time.perf_counter that only moves when the "GPU" is waited for: what
    the prefetcher measures is then exact, and no test timing depends on the machine."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _SlowEvent:
    """Stands for the CUDA event of a buffer's copy: done only after `seconds` (of `clock`)."""

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def synchronize(self) -> None:
        self.clock.now += self.seconds


def test_the_wait_for_the_device_is_not_counted_as_the_loaders_work(corpus, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(prefetch_module.time, "perf_counter", clock)
    pf = prefetcher(corpus, 64)
    try:
        first, second = pf.get(), pf.get()  # both buffers of the ring taken
        assert first.loader_busy_s == second.loader_busy_s == 0.0 == first.gpu_wait_s
        first._event = _SlowEvent(clock, 0.25)  # the GPU is still reading the first one
        pf.release(first)
        third = pf.get()  # refilled into the first buffer, once the "GPU" is done with it
        assert third._slot == first._slot
        assert third.gpu_wait_s == 0.25 and third.loader_busy_s == 0.0
        # The consumer waited for it, or it was ready before the consumer asked.
        assert third.waited_s in (0.0, 0.25)
        pf.release(second)
        pf.release(third)
    finally:
        pf.close()


def test_a_get_past_the_last_window_fails_instead_of_waiting(corpus):
    pf = prefetcher(corpus, 20)
    try:
        windows = [pf.get(), pf.get()]  # ticks [0, 16) and [16, 20)
        assert [(w.tick0, w.K) for w in windows] == [(0, 16), (16, 4)]
        with pytest.raises(EOFError, match="ends at 20"):
            pf.get()
    finally:
        pf.close()
