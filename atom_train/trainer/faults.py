"""Fault injection for the tests of crash recovery: a trainer that dies hard at a chosen tick.

Set only by tests, through the environment (never outside tests):

- ``ATOM_TEST_CRASH_AT_TICK=N``: crash at the first window end at or after tick N
  (exit code 17, as an uncaught error would give, without any clean-up);
- ``ATOM_TEST_CRASH_MARKER=FILE``: only once: the crash writes FILE, and a launch that
  finds it does not crash (so a supervisor's relaunch gets through);
- ``ATOM_TEST_CRASH_RANK=R``: only rank R crashes (the others must notice);
- ``ATOM_TEST_CRASH_SIGNAL=KILL``: die of SIGKILL, as by ``kill -9``;
- ``ATOM_TEST_START_DELAY=R:S``: rank R starts S seconds late (before its signal handlers
  and its checks), as a rank still importing torch on a busy machine does;
- ``ATOM_TEST_NAN_AT_TICK=N``: the gradients of the window holding tick N are NaN (the
  divergence guard's non-finite verdict, as a bad batch or an overflow gives); with
  ``ATOM_TEST_NAN_MARKER=FILE``, only once (the rewind's replay of that window is clean).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from atom_train.common.cli import say

CRASH_AT_ENV = "ATOM_TEST_CRASH_AT_TICK"
CRASH_MARKER_ENV = "ATOM_TEST_CRASH_MARKER"
CRASH_RANK_ENV = "ATOM_TEST_CRASH_RANK"
CRASH_SIGNAL_ENV = "ATOM_TEST_CRASH_SIGNAL"
START_DELAY_ENV = "ATOM_TEST_START_DELAY"
NAN_AT_ENV = "ATOM_TEST_NAN_AT_TICK"
NAN_MARKER_ENV = "ATOM_TEST_NAN_MARKER"


def delay_start(rank: int) -> None:
    """Sleep here if ``ATOM_TEST_START_DELAY`` names this rank."""
    spec = os.environ.get(START_DELAY_ENV)
    if spec:
        who, seconds = spec.split(":")
        if int(who) == rank:
            time.sleep(float(seconds))


class CrashHook:
    def __init__(self, rank: int) -> None:
        self.at = int(os.environ.get(CRASH_AT_ENV, "-1"))
        only = os.environ.get(CRASH_RANK_ENV)
        self.armed = self.at >= 0 and (only is None or int(only) == rank)
        self.rank = rank

    def check(self, tick: int, before: Callable[[], None]) -> None:
        """Crash now if armed and `tick` reached the crash tick (`before`: what a dying
        trainer would still have done, e.g. write its pending log lines)."""
        if not self.armed or tick < self.at:
            return
        marker = os.environ.get(CRASH_MARKER_ENV)
        if marker:
            if os.path.exists(marker):
                self.armed = False
                return
            Path(marker).write_text(str(tick))
        before()
        say(f"test hook: rank {self.rank} crashing at tick {tick}")
        if os.environ.get(CRASH_SIGNAL_ENV) == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(17)


class NanHook:
    """Plants NaN gradients in one window (`ATOM_TEST_NAN_AT_TICK`), at most once per marker."""

    def __init__(self) -> None:
        self.at = int(os.environ.get(NAN_AT_ENV, "-1"))

    def due(self, tick0: int, K: int) -> bool:
        """Whether the window of K ticks from `tick0` gets NaN gradients."""
        if not tick0 <= self.at < tick0 + K:
            return False
        marker = os.environ.get(NAN_MARKER_ENV)
        if marker:
            if os.path.exists(marker):
                return False
            Path(marker).write_text(str(tick0))
        say(f"test hook: NaN gradients in the window at tick {tick0}")
        return True
