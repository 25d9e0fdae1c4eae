"""The lockstep schedule (docs/design.md): what happens before each tick, and where BPTT
windows close. All pure functions of the global tick, so a resumed run does exactly what an
uninterrupted one does. (The learning rate per step is `atom_train.trainer.lr_schedule`.)

Before the byte of global tick t, in this order:

- an episode reset when ``t % episode_length == 0`` (`is_reset`);
- an atom flush (with consolidation) when ``t % atom_flush_every == 0`` (`is_flush`).

A window that starts at tick t closes (`WindowSchedule.cut`) at the first of: the next
multiple of K (``--bptt``; K = 0 means windows of one tick), of the episode length, of
``--ckpt-every`` and of ``--snapshot-every`` (so checkpoints and resets land on window
boundaries), and the last tick. The cuts are multiples of each period counted from tick 0,
whatever tick a window started at: a run resumed at an off-grid tick, or pivoted to another
K, still cuts on the global grid of each period.

The reference (`ReferenceModel.apply_schedule`), the batched tick (`BatchedByteTick`) and
the trainer all take the schedule from here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass


def is_reset(t: int, episode_length: int) -> bool:
    """An episode reset before tick t."""
    return t % episode_length == 0


def is_flush(t: int, atom_flush_every: int) -> bool:
    """An atom flush before tick t (after the reset, if both)."""
    return t % atom_flush_every == 0


def tick_events(
    tick0: int, K: int, episode_length: int, atom_flush_every: int
) -> list[tuple[bool, bool]]:
    """(reset, flush) before each of the ticks tick0 ... tick0 + K - 1."""
    return [
        (is_reset(t, episode_length), is_flush(t, atom_flush_every))
        for t in range(tick0, tick0 + K)
    ]


def window_cut(t: int, total: int, periods: list[int]) -> int:
    """The tick at which a window that starts at tick t closes: the next multiple of any
    positive period, or `total` (periods <= 0 are ignored)."""
    end = total
    for p in periods:
        if p > 0:
            end = min(end, (t // p + 1) * p)
    return end


def crossed(prev: int, now: int, every: int) -> bool:
    """A multiple of `every` lies in (prev, now] (never for every <= 0)."""
    return every > 0 and prev // every != now // every


@dataclass(frozen=True)
class WindowSchedule:
    """Where the trainer's windows close, for ticks up to `total`."""

    bptt: int  # K; 0 = no BPTT (windows of one tick)
    episode_length: int
    total: int
    ckpt_every: int = 0
    snapshot_every: int = 0

    @property
    def K(self) -> int:
        return max(1, self.bptt)

    @property
    def periods(self) -> list[int]:
        return [self.K, self.episode_length, self.ckpt_every, self.snapshot_every]

    def cut(self, t: int) -> int:
        return window_cut(t, self.total, self.periods)

    def windows(self, start: int) -> Iterator[tuple[int, int]]:
        """(first tick, end tick) of every window from `start` to `total`."""
        t = start
        while t < self.total:
            end = self.cut(t)
            yield t, end
            t = end

    def count_windows(self, start: int, end: int | None = None) -> int:
        """Windows (optimizer steps) from tick `start` whose end is at most tick `end`
        (default: total), counted in closed form: a window ends at every multiple of a
        period in (start, total) and at total, so this counts the union of those multiples
        by inclusion-exclusion. (Walking the windows one by one took 3 us each: minutes at
        the start of every launch of a days-long run with hundreds of millions of windows.)"""
        stop = min(self.total if end is None else end, self.total)
        if stop <= start:
            return 0
        last = stop if stop < self.total else self.total - 1  # the cuts strictly below total
        periods = sorted({p for p in self.periods if p > 0})
        n = 0
        for size in range(1, len(periods) + 1):
            for subset in itertools.combinations(periods, size):
                step = math.lcm(*subset)
                n += (-1) ** (size + 1) * (last // step - start // step)
        return n + (stop == self.total)
