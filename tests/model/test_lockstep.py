"""The lockstep schedule (atom_train.model.lockstep): resets, flushes, window cuts.

Pure functions: expected values worked out by hand from docs/design.md#the-lockstep-schedule.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atom_train.model.config import ModelConfig
from atom_train.model.lockstep import (
    WindowSchedule,
    crossed,
    is_flush,
    is_reset,
    tick_events,
    window_cut,
)
from atom_train.model.reference import ReferenceModel


def cuts(s: WindowSchedule, start: int = 0) -> list[int]:
    return [end for _, end in s.windows(start)]


def test_cuts_at_every_period_when_k_divides_none_of_them():
    # K = 16; checkpoints every 40, snapshots every 50, episodes of 100 ticks, 130 in all.
    s = WindowSchedule(bptt=16, episode_length=100, total=130, ckpt_every=40, snapshot_every=50)
    assert cuts(s) == [16, 32, 40, 48, 50, 64, 80, 96, 100, 112, 120, 128, 130]
    assert s.count_windows(0) == 13
    assert s.count_windows(40) == 10 and s.count_windows(0, 50) == 5
    # Windows tile [0, total) without gaps.
    w = list(s.windows(0))
    assert w[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(w))


def test_a_resume_at_an_off_grid_tick_cuts_on_the_global_grid():
    s = WindowSchedule(bptt=16, episode_length=100, total=130, ckpt_every=40, snapshot_every=50)
    # Resumed at 40 (a checkpoint tick, not a multiple of 16): the next cut is 48, not 56.
    assert cuts(s, 40) == cuts(s)[3:]
    # A pivot to K = 24 at tick 40 cuts at multiples of 24 from tick 0 (48, 72, 96, 120).
    p = WindowSchedule(bptt=24, episode_length=100, total=130, ckpt_every=40, snapshot_every=50)
    assert cuts(p, 40) == [48, 50, 72, 80, 96, 100, 120, 130]


def test_bptt_0_means_windows_of_one_tick():
    s = WindowSchedule(bptt=0, episode_length=7, total=10, ckpt_every=4)
    assert s.K == 1 and cuts(s) == list(range(1, 11))


def test_window_cut_ignores_periods_off():
    assert window_cut(5, 100, [0, -1, 10]) == 10
    assert window_cut(95, 100, [64, 0]) == 100  # the last tick closes a window
    assert window_cut(99, 100, [1]) == 100


def test_crossed():
    assert crossed(0, 16, 16) and crossed(15, 17, 16) and not crossed(16, 31, 16)
    assert not crossed(0, 100, 0)  # a period of 0 is off
    assert crossed(40, 48, 48) and not crossed(48, 64, 48)


@pytest.mark.parametrize(("episode", "flush"), [(4096, 32), (100, 7), (5, 5), (1, 3)])
def test_events_are_the_references_schedule(episode, flush):
    """tick_events (the batched tick's) == what apply_schedule does to one stream."""
    assert [is_reset(t, episode) for t in range(300)] == [t % episode == 0 for t in range(300)]
    assert [is_flush(t, flush) for t in range(300)] == [t % flush == 0 for t in range(300)]
    config = ModelConfig(n_modes=4, jl_dim=8, mlp_hidden=8, atom_dim=4,
                         episode_length=episode, atom_flush_every=flush)  # fmt: skip
    model = ReferenceModel(config)
    seen = []
    tick = 0
    model.reset_stream = lambda s: seen.append(("reset", tick))  # type: ignore[method-assign]
    model.flush_stream = lambda s: seen.append(("flush", tick))  # type: ignore[method-assign]
    state = model.new_state()
    for tick in range(37, 137):
        model.apply_schedule(state, tick)
    expect = []
    for tick, (r, f) in zip(range(37, 137), tick_events(37, 100, episode, flush), strict=True):
        expect += [("reset", tick)] * r + [("flush", tick)] * f
    assert seen == expect


def test_crossed_counts_every_multiple_even_of_one():
    assert crossed(3, 4, 1) and not crossed(4, 4, 1)  # every tick is a multiple of 1
    assert crossed(7, 8, 4) and not crossed(8, 11, 4) and crossed(8, 12, 4)
    assert not crossed(1, 3, 4) and crossed(1, 3, 3)  # (1, 3] holds 3, not 4
    assert not crossed(0, 100, 0) and not crossed(0, 100, -5)


@given(
    bptt=st.integers(0, 40),
    episode=st.integers(1, 300),
    total=st.integers(1, 2000),
    ckpt=st.integers(0, 120),
    snap=st.integers(0, 500),
    start=st.integers(0, 2100),
    end=st.one_of(st.none(), st.integers(0, 2200)),
)
@settings(max_examples=300, deadline=None)
def test_count_windows_in_closed_form_counts_the_windows_walked(
    bptt, episode, total, ckpt, snap, start, end
):
    s = WindowSchedule(bptt, episode, total, ckpt, snap)
    stop = total if end is None else end
    walked = sum(1 for _, e in s.windows(start) if e <= stop)
    assert s.count_windows(start, end) == walked


def test_count_windows_of_a_week_long_run_does_not_walk_them(monkeypatch):
    # 7 days at 300 windows/s, K = 64: 1.8e8 windows (walking them took 3 us each: 9 minutes
    # at every launch). Cuts: multiples of 64 and of 2000 (lcm 8000), and the last tick.
    monkeypatch.setattr(WindowSchedule, "windows", lambda *a: pytest.fail("walked"))
    total = 64 * 181_440_000
    s = WindowSchedule(64, 4096, total, 2000, 200_000)
    last = total - 1
    assert s.count_windows(0) == last // 64 + last // 2000 - last // 8000 + 1
