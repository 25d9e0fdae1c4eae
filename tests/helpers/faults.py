"""The test suite's fault injection: `EnvFaults`, the trainer's test points
(`atom_train.trainer.fault_points`) armed from the environment, so that a test arms a trainer it
runs in this process or launches as a subprocess alike. conftest.py installs it in the
pytest process and puts `tests/helpers/inject` (its ``sitecustomize``) on PYTHONPATH, which
installs it in every Python process the tests start. The variables, read at each call (a
test sets them with monkeypatch or in a child's environment):

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
  ``ATOM_TEST_NAN_MARKER=FILE``, only once (the rewind's replay of that window is clean);
- ``ATOM_TEST_SLOW_CKPT_WRITE=S``: each checkpoint written in 8 chunks, S seconds apart
  (so that a kill lands inside a write).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from atom_train.common.cli import say
from atom_train.trainer import fault_points

CRASH_AT_ENV = "ATOM_TEST_CRASH_AT_TICK"
CRASH_MARKER_ENV = "ATOM_TEST_CRASH_MARKER"
CRASH_RANK_ENV = "ATOM_TEST_CRASH_RANK"
CRASH_SIGNAL_ENV = "ATOM_TEST_CRASH_SIGNAL"
START_DELAY_ENV = "ATOM_TEST_START_DELAY"
NAN_AT_ENV = "ATOM_TEST_NAN_AT_TICK"
NAN_MARKER_ENV = "ATOM_TEST_NAN_MARKER"
SLOW_WRITE_ENV = "ATOM_TEST_SLOW_CKPT_WRITE"


def _once(marker_env: str, what: str) -> bool:
    """False if the marker file named by `marker_env` exists (it fired before); else writes it
    (when set) and returns True."""
    marker = os.environ.get(marker_env)
    if marker:
        if os.path.exists(marker):
            return False
        Path(marker).write_text(what)
    return True


class EnvFaults(fault_points.FaultPoints):
    """The trainer's test points, armed by the ATOM_TEST_* variables above."""

    def start(self, rank: int) -> None:
        spec = os.environ.get(START_DELAY_ENV)
        if spec:
            who, seconds = spec.split(":")
            if int(who) == rank:
                time.sleep(float(seconds))

    def window_end(self, tick: int, rank: int, flush: Callable[[], None]) -> None:
        at = int(os.environ.get(CRASH_AT_ENV, "-1"))
        only = os.environ.get(CRASH_RANK_ENV)
        if at < 0 or tick < at or (only is not None and int(only) != rank):
            return
        if not _once(CRASH_MARKER_ENV, str(tick)):
            return
        flush()
        say(f"test hook: rank {rank} crashing at tick {tick}")
        if os.environ.get(CRASH_SIGNAL_ENV) == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(17)

    def nan_gradients(self, tick0: int, K: int) -> bool:
        at = int(os.environ.get(NAN_AT_ENV, "-1"))
        if not (at >= 0 and tick0 <= at < tick0 + K):
            return False
        if not _once(NAN_MARKER_ENV, str(tick0)):
            return False
        say(f"test hook: NaN gradients in the window at tick {tick0}")
        return True

    def checkpoint_write_delay(self) -> float:
        return float(os.environ.get(SLOW_WRITE_ENV, "0") or 0)


def install() -> None:
    fault_points.install(EnvFaults())
