"""The trainer's test points: where a test of crash recovery makes a trainer fail on purpose.

The product never arms them: `installed` is a `FaultPoints` whose methods do nothing, and
nothing here reads the environment. A test installs its own (`install`): the test suite's
fault injection (tests/helpers/faults.py) arms them in the pytest process and, through a
``sitecustomize`` that the suite puts on PYTHONPATH, in each trainer it launches (a
subprocess, torchrun's ranks, the supervisor's children). The calls, one per point:

- `start(rank)`: first thing in `train.main` (a rank that starts late);
- `window_end(tick, rank, flush)`: after each window is logged (a trainer that dies hard;
  `flush` writes what a dying trainer would still have written);
- `nan_gradients(tick0, K)`: after each backward (True: the window's gradients are NaN);
- `checkpoint_write_delay()`: seconds to spread each checkpoint write over (kills landing
  inside a write).
"""

from __future__ import annotations

from collections.abc import Callable


class FaultPoints:
    """The test points, unarmed."""

    def start(self, rank: int) -> None:
        return None

    def window_end(self, tick: int, rank: int, flush: Callable[[], None]) -> None:
        return None

    def nan_gradients(self, tick0: int, K: int) -> bool:
        return False

    def checkpoint_write_delay(self) -> float:
        return 0.0


installed: FaultPoints = FaultPoints()


def install(points: FaultPoints) -> FaultPoints:
    """Make `points` the trainer's (a test's); returns the ones it replaces."""
    global installed
    previous, installed = installed, points
    return previous
