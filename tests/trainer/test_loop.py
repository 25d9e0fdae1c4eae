"""The one training loop (atom_train/trainer/loop.py): with hooks that do nothing it is the
trainer's run to the last bit, it writes nothing, and a hook's stop ends it."""

from __future__ import annotations

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
