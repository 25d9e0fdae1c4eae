"""The one training loop (atom_train/trainer/loop.py): with hooks that do nothing it is the
trainer's run to the last bit, it writes nothing, and a hook's stop ends it."""

from __future__ import annotations

import pytest
import torch
from helpers.trainer_kit import args
from helpers.trainer_kit import run as train_run

from atom_train.common.cli import say
from atom_train.trainer.checkpoint_file import load_checkpoint
from atom_train.trainer.loop import LoopHooks, WindowLoop
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.rundir import FINAL
from atom_train.trainer.train_state import MODEL

# A rate that moves (warm-up, cosine) and the noise probe on: every part of the step.
POLICY = ["--lr-schedule", "cosine", "--warmup-steps", "2", "--seed", "3"]
POLICY += ["--noise-scale-every", "2"]


def _plan(corpus, out, total):
    out.mkdir()
    argv = args(corpus, out, total, *POLICY)
    return resolve_command(argv, warn=say)


def test_the_loop_with_no_hooks_is_the_trainers_run_to_the_last_bit(corpus, tmp_path):
    assert train_run(corpus, tmp_path / "trainer", 96, *POLICY) == 0
    trained = load_checkpoint(tmp_path / "trainer" / FINAL).group(MODEL)
    out = tmp_path / "loop"
    loop = WindowLoop(_plan(corpus, out, 96))
    try:
        assert loop.run() is None  # (the default hooks: nothing)
    finally:
        loop.close()
    assert loop.state.counters.tick == 96 and loop.state.counters.step == 6
    weights = loop.model.state_dict()
    assert weights.keys() == trained.keys()
    for k, v in weights.items():
        assert torch.equal(v, trained[k]), k
    assert list(out.iterdir()) == []  # the loop itself writes nothing in the run folder


def test_a_hooks_stop_ends_the_loop_and_is_returned(corpus, tmp_path):
    class Hooks(LoopHooks):
        def __init__(self):
            self.windows, self.boundaries = [], []

        def after_window(self, w, lr, stats):
            self.windows.append((w.tick0, lr))
            return None

        def at_boundary(self, prev):
            self.boundaries.append(prev)
            return "enough" if len(self.boundaries) == 2 else None

    loop = WindowLoop(_plan(corpus, tmp_path / "loop", 96), lr_at=lambda i: 1e-3 * (i + 1))
    hooks = Hooks()
    try:
        assert loop.run(hooks) == "enough"
    finally:
        loop.close()
    assert hooks.windows == [(0, 1e-3), (16, 2e-3)] and hooks.boundaries == [0, 16]
    assert loop.state.counters.tick == 32  # (the prefetcher closed: the run can be dropped)


def test_the_windows_one_at_a_time_are_the_runs_and_closing_them_stops_it(corpus, tmp_path):
    """`windows`: `run` at the caller's pace (the step bench's trainer mode): each window
    once trained; closed early, the loop stops there; drained, it returns `at_end`'s."""

    class End(LoopHooks):
        def at_end(self):
            return "end"

    for name, early in (("a", True), ("b", False)):
        loop = WindowLoop(_plan(corpus, tmp_path / name, 64))
        try:
            windows = loop.windows(End())
            ticks = [next(windows).tick0 for _ in range(2 if early else 4)]
            if early:
                windows.close()
            else:
                with pytest.raises(StopIteration) as done:
                    next(windows)
                assert done.value.value == "end"
        finally:
            loop.close()
        assert ticks == [0, 16, 32, 48][: len(ticks)]
        assert loop.state.counters.tick == (32 if early else 64)


def test_scratch_plan_is_the_trainers_new_run_with_no_folder(corpus, tmp_path, monkeypatch):
    """`scratch_plan`: the plan resolve_run makes of the same command line in an empty
    folder (a new run), periods as the config says, and nothing written anywhere."""
    import dataclasses
    import tempfile

    from atom_train.trainer.loop import scratch_plan
    from atom_train.trainer.plan import Periods
    from atom_train.trainer.run_config import parse as parse_command

    periods = ["--ckpt-every", "40", "--snapshot-every", "0", "--log-every", "48"]
    argv = args(corpus, tmp_path / "run", 96, *POLICY, *periods)
    config = parse_command(argv)[0]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.chdir(scratch)
    warnings = []
    plan = scratch_plan(config, total_ticks=96, warn=warnings.append)
    assert list(scratch.iterdir()) == [] and not plan.out.exists()  # nothing left anywhere
    assert plan.mode == "new" and plan.source is None and plan.total == 96
    assert plan.periods == Periods(ckpt=40, snapshot=0, val=0, sample=0, log=48)
    assert plan.window_schedule.count_windows(0) == 7  # cut at 40 and 80 too

    (tmp_path / "run").mkdir()
    trainer = resolve_command(argv, warn=say)
    for field in ("B", "total", "config", "window_schedule", "lr_schedule", "periods"):
        assert getattr(plan, field) == getattr(trainer, field), field
    assert plan.backend == trainer.backend and plan.noise_every == trainer.noise_every == 2
    assert plan.hardware == trainer.hardware and plan.seed == trainer.seed == 3
    assert plan.run_config == config.replace(total_ticks=96)

    # A model no flag sets (an option no implementation provides) is no new run's.
    odd = config.replace(model=dataclasses.replace(config.model, readout="soft"))
    with pytest.raises(ValueError, match="readout"):
        scratch_plan(odd, total_ticks=96, warn=warnings.append)
