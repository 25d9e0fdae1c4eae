"""The learning rate of each optimizer step: `LRSchedule` (warm-up, then constant or a
cosine). A pure function of the step, so a resumed run gets the rate an uninterrupted
one would; a pivot starts a new schedule at its step (`new_segment`, shaped by
``--lr-restart``), and the launch says what it does (`describe_segment`). Imports nothing
of the project.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# How a new segment starts (the trainer's --lr-restart): at --lr ("peak"), or from the rate
# in force at the pivot, constant ("hold") or decaying again ("decay").
RESTARTS = ("peak", "hold", "decay")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate of each optimizer step.

    Linear warm-up over the first `warmup_steps` steps (counted from `start_step`), then
    constant, or a cosine from `lr` down to `min_lr_ratio * lr` at `end_step`. A pivot that
    changes the schedule starts a new `LRSchedule` at the pivot's step (warm-up and cosine
    then run from there to the new end)."""

    lr: float
    kind: str = "constant"  # "constant" | "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    start_step: int = 0
    end_step: int = 0  # the cosine reaches its floor here

    def at(self, step: int) -> float:
        s = step - self.start_step
        if self.warmup_steps > 0 and s < self.warmup_steps:
            return self.lr * (s + 1) / self.warmup_steps
        decay = self.end_step - self.start_step - self.warmup_steps
        if self.kind == "cosine" and decay > 0:
            frac = min(1.0, (s - self.warmup_steps) / decay)
            floor = self.min_lr_ratio
            return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))
        return self.lr

    @property
    def floor(self) -> float:
        """The last rate: the cosine's floor, or the constant rate."""
        return self.lr * self.min_lr_ratio if self.kind == "cosine" else self.lr


def new_segment(
    restart: str,
    *,
    lr: float,
    kind: str,
    warmup_steps: int,
    min_lr_ratio: float,
    start_step: int,
    end_step: int,
    rate_now: float,
    lr_changed: bool,
) -> LRSchedule:
    """The segment a pivot (or fork) that changes an LR flag starts at `start_step`.

    `restart` (``--lr-restart``): ``peak`` = `lr`, then `kind` (a finished cosine run
    extended this way jumps back to its peak); ``hold`` = `rate_now` (the old schedule's
    rate at this step), constant to the end; ``decay`` = `rate_now`, cosine down to
    `min_lr_ratio` x it at `end_step`. A pivot that changes --lr itself starts hold and
    decay from the new `lr` instead of `rate_now`. The warm-up, if any, climbs to the
    segment's first rate."""
    if restart not in RESTARTS:
        raise ValueError(f"unknown restart {restart!r}")
    if restart == "peak":
        return LRSchedule(lr, kind, warmup_steps, min_lr_ratio, start_step, end_step)
    first = lr if lr_changed else rate_now
    shape = "constant" if restart == "hold" else "cosine"
    return LRSchedule(first, shape, warmup_steps, min_lr_ratio, start_step, end_step)


def describe_segment(s: LRSchedule, before: float, step: int, end_tick: int) -> str:
    """What a new segment does, for the launch line: the rate before (`before`, the old
    schedule's at `step`), the rate now, the peak, and where it ends."""
    now = s.at(step)
    warm = f"warm-up over {s.warmup_steps:,} steps to {s.lr:.3g}, then " if s.warmup_steps else ""
    if s.kind == "cosine":
        shape = f"cosine from {s.lr:.3g} down to {s.floor:.3g} at tick {end_tick:,}"
    else:
        shape = f"constant {s.lr:.3g} to tick {end_tick:,}"
    return f"learning rate {before:.3g} -> {now:.3g} now: {warm}{shape}"
