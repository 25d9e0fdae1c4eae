"""The divergence guard as the training loop owns it: a `Guard` holds the run's `Detector`
(divergence.py) and its `Policy`, is fed by the step log where the step values already reach
the host (`StepLog.flush`: no host read of its own) and by each validation, and keeps the
first verdict found until the loop acts on it at the next window boundary (`take`).

The loop's calls (each marked ``# guard:`` in the loop):
- ``Guard.from_plan(config, episode_length, state)``: built from the run's `RunConfig`
  (`settings` reads its guard section);
- ``feed_steps(rows)`` / ``feed_val(step, tick, val_bpb)``: the values flushed;
- ``pending()`` / ``take()``: whether a verdict waits, and the verdict, cleared;
- ``state_dict()``: the detector's state for a checkpoint's metadata (`GUARD_KEY`);
- ``may_rotate(tick)``: whether a rolling checkpoint written at `tick` may replace the
  previous one (the detector vouches for the state: not suspect, no verdict waiting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from atom_train.trainer.divergence import Detector, Policy, Thresholds, Verdict
from atom_train.trainer.run_config import RunConfig


def settings(config: RunConfig, episode_length: int) -> tuple[Thresholds, Policy]:
    """The guard's thresholds and policy from the run's config (the one place that reads
    them): its guard section, and the checkpoint period (a rewind's default span)."""
    g = config.guard
    return Thresholds.from_args(g, episode_length), Policy.from_args(
        g, ckpt_every=config.periods.ckpt_every
    )


class Guard:
    """The run's detector and policy, and the verdict waiting for the loop."""

    def __init__(self, thresholds: Thresholds, policy: Policy, state: Mapping | None = None):
        self.thresholds, self.policy = thresholds, policy
        self.detector = Detector(thresholds, state)
        self.verdict: Verdict | None = None

    @classmethod
    def from_plan(
        cls, config: RunConfig, episode_length: int, state: Mapping | None = None
    ) -> Guard:
        return cls(*settings(config, episode_length), state)

    def _keep(self, verdicts: Iterable[Verdict | None]) -> None:
        for v in verdicts:
            if v is not None and self.verdict is None:
                self.verdict = v

    def feed_steps(self, rows: Iterable[Sequence]) -> None:
        """Each flushed step's (step, tick, K, loss, train_bpb, grad_norm), in order."""
        self._keep(self.detector.feed_steps(rows))

    def feed_val(self, step: int, tick: int, val_bpb: float) -> None:
        self._keep([self.detector.feed_val(step, tick, val_bpb)])

    def pending(self) -> bool:
        return self.verdict is not None

    def take(self) -> Verdict | None:
        v, self.verdict = self.verdict, None
        return v

    def may_rotate(self, tick: int) -> bool:
        """Whether a rolling checkpoint written at `tick` may be written over the previous one."""
        return self.verdict is None and not self.detector.suspect()

    def state_dict(self) -> dict:
        return self.detector.state_dict()
