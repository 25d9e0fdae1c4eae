"""The learning rate of each optimizer step: `LRSchedule` (warm-up, then constant or a
cosine). A pure function of the step, so a resumed run gets the rate an uninterrupted
one would; a pivot starts a new schedule at its step. Imports nothing of the project.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
