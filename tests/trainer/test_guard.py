"""The guard as the loop owns it: fed by the step log's flush (no read of its own), the first
verdict kept until taken, the rolling checkpoint held back while suspect."""

import math

import torch

from atom_train.trainer.distributed import World
from atom_train.trainer.divergence import Policy, Thresholds
from atom_train.trainer.guard import Guard
from atom_train.trainer.reporting import StepLog
from atom_train.trainer.step import StepStats


class _Log:
    def __init__(self):
        self.rows = []

    def write_json(self, obj):
        self.rows.append(obj)


def _stats(loss: float, norm: float) -> StepStats:
    return StepStats(torch.tensor(loss), torch.tensor(loss), torch.tensor(norm))


def test_flush_feeds_the_guard_and_a_nan_is_a_verdict_not_an_error():
    guard = Guard(Thresholds(episode_length=4096), Policy())
    log = StepLog(_Log(), B=8, world=World())
    log.guard = guard
    for i in range(1, 5):
        log.add(i, 16 * i, 16, 1e-3, _stats(2.0, 1.0), None)
    log.add(5, 80, 16, 1e-3, _stats(math.nan, 1.0), None)
    log.flush(None)  # (without the guard: FloatingPointError)
    assert guard.pending() and not guard.may_rotate(80)
    v = guard.take()
    assert (v.signal, v.step, v.tick) == ("nonfinite", 5, 80)
    assert not guard.pending() and guard.detector.last == (5, 80)


def test_first_verdict_kept_and_state_round_trips():
    t = Thresholds(episode_length=4096)
    guard = Guard(t, Policy())
    guard.feed_steps([(1, 16, 16, 2.0, 3.0, 1.0), (2, 32, 16, math.inf, 3.0, 1.0)])
    guard.feed_val(2, 32, math.nan)
    assert guard.take().what == "loss"  # (the first kept, the val's not over it)
    again = Guard(t, Policy(), guard.state_dict())
    assert again.detector.state_dict() == guard.detector.state_dict()
