"""The divergence guard's defaults on this project's own runs: every step of the healthy runs
its thresholds were chosen on (the demo run, the tuned-rate runs of docs/tuning.md's
B-sweep, a short run at a good rate) and of the bad ones (rates that diverge from the start
or after a pivot, random bytes planted in the corpus), recorded by docs/divergence/record.sh
and kept compact in tests/fixtures/divergence/ (`scripts/divergence_replay.py --export`).
Replayed as the trainer would feed them: 0 verdicts on the healthy runs, and on the bad
ones the first verdict, where it began and when the trainer reads it, as docs/divergence.md
states them."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from helpers import REPO

from atom_train.trainer.divergence import Thresholds

RECORDING = REPO / "tests" / "fixtures" / "divergence" / "recorded.json.xz"

_spec = importlib.util.spec_from_file_location(
    "divergence_replay", REPO / "scripts" / "divergence_replay.py"
)
replay_script = sys.modules.setdefault("divergence_replay", importlib.util.module_from_spec(_spec))
if not hasattr(replay_script, "replay"):
    _spec.loader.exec_module(replay_script)

HEALTHY = ("demo", "sweep-B512-4e-2", "sweep-B128-4e-2", "sweep-B32-2e-2", "sweep-B8-2e-2",
           "sweep-B128-8e-2", "small-4e-2", "lr-0.01", "lr-0.078125")  # fmt: skip
# run: (signal, step, tick, began_tick, the step at which the trainer reads it)
BAD = {
    "small-10": ("ceiling", 4, 64, 0, 7),  # --lr 10 from the first step
    "small-1": ("ceiling", 4, 64, 0, 7),  # --lr 1
    "pivot": ("ceiling", 68, 1056, 1000, 71),  # 4e-2 to tick 1,000, then --lr 10
    "lr-5": ("ceiling", 68, 1056, 1000, 71),
    "lr-2.5": ("ceiling", 68, 1056, 1000, 71),
    "lr-1.25": ("ceiling", 68, 1056, 1000, 71),
    "lr-0.625": ("loss_spike", 68, 1056, 1000, 71),
    "lr-0.3125": ("loss_spike", 69, 1072, 1008, 71),
    "lr-0.15625": ("val_regression", 96, 1500, 1000, 96),
    "lr-0.1": ("val_regression", 96, 1500, 1000, 96),
    "spike-1": ("loss_spike", 211, 13504, 13248, 224),  # random bytes for every stream
    "spike-4": ("loss_spike", 211, 13504, 13248, 224),  # ... for every 4th stream
}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return replay_script.load_export(RECORDING)


def test_the_recording_holds_every_run(runs):
    assert set(runs) == set(HEALTHY) | set(BAD)
    assert len(runs["demo"]["rows"]) == 1884 and len(runs["sweep-B8-2e-2"]["rows"]) == 9600


@pytest.mark.parametrize("name", HEALTHY)
def test_the_healthy_runs_get_no_verdict(runs, name):
    assert replay_script.replay(runs[name], Thresholds()) == []


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_bad_run_gets_its_verdict_where_it_began(runs, name):
    verdicts = replay_script.replay(runs[name], Thresholds())
    assert verdicts, name
    v = verdicts[0]
    got = (v["signal"], v["step"], v["tick"], v["began_tick"], v["read_step"])
    assert got == BAD[name]


def test_lower_thresholds_would_raise_false_alarms(runs):
    """The defaults are not arbitrary: halved, the spike rules fire on healthy runs (so this
    test can fail, and the recorded margins are the ones docs/divergence.md gives)."""
    halved = Thresholds(loss_mads=2.0, grad_mads=2.0, steps=1)
    alarms = {n: len(replay_script.replay(runs[n], halved)) for n in HEALTHY}
    assert sum(alarms.values()) > 0, alarms
