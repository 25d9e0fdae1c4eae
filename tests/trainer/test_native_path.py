"""The CPU's default loop in the trainer: --recurrence native against --recurrence fused,
and exact resume with native (96 ticks straight = 48, then a resume to 96).

Tolerance: after 6 AdamW steps every tensor of the final checkpoint is within
||a - b|| <= 1e-4 ||b|| + 1e-6 of the fused run's (the loops agree to ~1e-6 per window in
float32, tests/model/test_field_native.py; the optimizer carries that forward); the loader
state, the step counts and the RNG states are identical. Resume with native is bit-identical:
the loop's result does not depend on scheduling (its per-block sums are added in order).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.trainer_kit import assert_close_state, assert_same_state, run

from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.train_state import run_config_of

SHORT = ["--ckpt-every", "48", "--val-every", "0"]


@pytest.fixture(scope="module")
def native_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("native")
    assert run(corpus, out, 96, *SHORT, "--recurrence", "native") == 0
    return out


def test_the_trainer_with_native_trains_like_fused(corpus, native_run, tmp_path):
    fused = tmp_path / "fused"
    assert run(corpus, fused, 96, *SHORT, "--recurrence", "fused") == 0
    ca, cb = load_checkpoint(native_run / FINAL), load_checkpoint(fused / FINAL)
    assert run_config_of(ca.meta).value("recurrence") == "native"
    assert run_config_of(cb.meta).value("recurrence") == "fused"
    assert ca.meta["training"]["recurrence"] == "native"
    assert ca.meta["training"]["step"] == 6
    assert_close_state(native_run / FINAL, fused / FINAL, 1e-4, 1e-6)


def test_exact_resume_with_native(corpus, native_run, tmp_path):
    out = tmp_path / "run"
    assert run(corpus, out, 48, *SHORT, "--recurrence", "native") == 0
    assert run(corpus, out, 96, *SHORT, "--recurrence", "native") == 0
    assert_same_state(out / FINAL, native_run / FINAL)
